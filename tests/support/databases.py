"""Throwaway MariaDB and PostgreSQL servers for the checkpoint store tests.

Each server is started once per test session, in a fresh temporary directory, on a free
loopback port, and removed at the end. Nothing here skips: a server that cannot start raises
:class:`ServerStartError` carrying its log, so the tests that need it fail and say why.

- MariaDB: ``mariadb-install-db`` + ``mariadbd`` from the Debian packages (10.11).
- PostgreSQL: ``initdb`` + ``postgres`` from ``/usr/lib/postgresql/<version>/bin``; installed with
  ``apt-get install -y postgresql`` when missing (root only). PostgreSQL refuses to run as
  root, so as root the cluster belongs to the ``postgres`` system user the package creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql

START_TIMEOUT = 60.0
_LOG_TAIL = 4000


class ServerStartError(RuntimeError):
    """A test database server did not start; the message carries its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _logs(*paths: Path) -> str:
    """The end of each log, headed by its path (the directory is kept when a start fails)."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")[-_LOG_TAIL:]
        except FileNotFoundError:
            text = "(missing)"
        parts.append(f"--- {path} ---\n{text}")
    return "\n".join(parts)


def _run(args: list[str], what: str, **kwargs: Any) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise ServerStartError(
            f"{what} failed (exit {done.returncode}): {' '.join(args)}\n{done.stdout}\n{done.stderr}"
        )


def _wait_until_ready(
    name: str, process: subprocess.Popen[bytes], logs: list[Path], ping: Callable[[], None]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"{name} exited with {process.returncode} while starting:\n{_logs(*logs)}")
        try:
            ping()
            return
        except Exception as exc:  # any connection error means "not yet"
            error = exc
            time.sleep(0.1)
    process.kill()
    raise ServerStartError(f"{name} not ready after {START_TIMEOUT:.0f}s ({error}):\n{_logs(*logs)}")


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class DatabaseServer:
    """A running throwaway server; ``create_database`` hands each test a fresh database."""

    name: str
    port: int
    base_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    startup_seconds: float
    _create: Callable[[str], str] = field(repr=False)
    _stop_signal: int = signal.SIGTERM

    def create_database(self) -> str:
        """Create an empty database and return its SQLAlchemy URL."""
        return self._create(f"t_{uuid.uuid4().hex[:12]}")

    def stop(self) -> None:
        _stop(self.process, self._stop_signal)
        shutil.rmtree(self.base_dir, ignore_errors=True)


def _binary(name: str, *dirs: str) -> str:
    found = shutil.which(name) or next((str(Path(d) / name) for d in dirs if (Path(d) / name).exists()), None)
    if found is None:
        raise ServerStartError(f"{name} not found in PATH or {', '.join(dirs)}: install mariadb-server")
    return found


def start_mariadb() -> DatabaseServer:
    began = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="vitess-sync-mariadb-"))
    data, log, port = base / "data", base / "error.log", free_port()
    user = pwd.getpwuid(os.geteuid()).pw_name
    _run(
        [
            _binary("mariadb-install-db", "/usr/bin", "/usr/sbin"),
            "--no-defaults",
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            f"--user={user}",
        ],
        "mariadb-install-db",
    )
    args = [
        _binary("mariadbd", "/usr/sbin", "/usr/bin"),
        "--no-defaults",
        f"--datadir={data}",
        f"--socket={base / 'mariadb.sock'}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--user={user}",
        f"--log-error={log}",
        # Small and fast: the tests need correctness, not durability or throughput.
        "--skip-log-bin",
        "--skip-name-resolve",
        "--performance-schema=OFF",
        "--innodb-buffer-pool-size=32M",
        "--innodb-log-file-size=16M",
        "--innodb-flush-log-at-trx-commit=0",
    ]
    with open(base / "stdout.log", "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=base)

    def connect(database: str | None = None) -> pymysql.Connection[Any]:
        return pymysql.connect(host="127.0.0.1", port=port, user="root", database=database, autocommit=True)

    def ping() -> None:
        connect().close()

    def create(name: str) -> str:
        conn = connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            conn.close()
        return f"mysql+pymysql://root@127.0.0.1:{port}/{name}?charset=utf8mb4"

    _wait_until_ready("mariadbd", process, [log, base / "stdout.log"], ping)
    return DatabaseServer("mariadb", port, base, process, log, time.monotonic() - began, create)


def _postgres_bin() -> Path:
    def newest() -> Path | None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
        return Path(found[-1]).parent if found else None

    if (bindir := newest()) is not None:
        return bindir
    if os.geteuid() != 0:
        raise ServerStartError("PostgreSQL is not installed: run `apt-get install -y postgresql` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
    if subprocess.run(install, capture_output=True, env=env, check=False).returncode != 0:
        _run(["apt-get", "update"], "apt-get update", env=env)
        _run(install, "apt-get install postgresql", env=env)
    if (bindir := newest()) is None:
        raise ServerStartError("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/initdb exists")
    return bindir


def start_postgres() -> DatabaseServer:
    began = time.monotonic()
    bindir = _postgres_bin()
    # PostgreSQL refuses to run as root: run it as the package's system user, which must own the
    # directory (mkdtemp in /tmp, which every user can traverse).
    as_user: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="vitess-sync-postgres-"))
    if os.geteuid() == 0:
        as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        shutil.chown(base, "postgres", "postgres")
    data, log, port = base / "data", base / "server.log", free_port()
    initdb = [str(bindir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"]
    _run(
        [*initdb, "--no-locale", "--no-sync"],
        "initdb",
        cwd=base,
        **as_user,
    )
    args = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
    for setting in (
        f"unix_socket_directories={base}",
        "fsync=off",
        "full_page_writes=off",
        "synchronous_commit=off",
        "shared_buffers=16MB",
        "max_connections=40",
    ):
        args += ["-c", setting]
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=base, **as_user)

    def connect(database: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=database, autocommit=True)

    def ping() -> None:
        connect().close()

    def create(name: str) -> str:
        with connect() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"

    _wait_until_ready("postgres", process, [log], ping)
    # SIGINT is PostgreSQL's "fast" shutdown: it does not wait for clients to disconnect.
    return DatabaseServer(
        "postgresql", port, base, process, log, time.monotonic() - began, create, signal.SIGINT
    )
