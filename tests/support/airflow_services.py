"""The real Airflow 3 services for tests: ``api-server``, ``scheduler``, ``dag-processor`` and
``triggerer`` as subprocesses of a throwaway installation (:class:`AirflowEnv`), driven through
the public REST API the way a user's UI or script drives them.

- Executor: ``LocalExecutor`` (tasks run as children of the scheduler and talk to the
  api-server's Execution API, as in a one-machine deployment).
- Metadata database: a throwaway PostgreSQL (``tests.support.databases``) by default.
  Airflow 3.3 accepts SQLite with the LocalExecutor (``database="sqlite"`` works, and starts
  ~7 s faster), but then five processes write one SQLite file, and Airflow's own backfill route
  maps a lock error to ``503 Database is locked. Backfill creation is not supported on SQLite
  under concurrent access. Please use PostgreSQL or MySQL.`` — a deployment would not use it.
- Auth: the simple auth manager with a real user (``tester``, role admin) whose password comes
  from a passwords file written here; the token comes from ``POST /auth/token``, as a script
  would get it. No "all admins" switch: requests without the token are refused.

Each service runs in its own process group (stopped with SIGTERM, then SIGKILL) and logs to
``<AIRFLOW_HOME>/services/<name>.log``; failures quote those logs and the failing tasks' logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.airflow_env import BIN, AirflowEnv
from tests.support.databases import DatabaseServer, free_port, start_postgres

SERVICES = ("scheduler", "dag-processor", "triggerer")
USER = "tester"
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
_LOG_TAIL = 3000

# Fast enough for tests on 2 cores without busy-looping: the dags folder is listed every few
# seconds (the file exists before the services start, so the first listing finds it), and a
# parsed file is parsed again at most every 30 s.
TUNING = {
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    "AIRFLOW__CORE__PARALLELISM": "4",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
    "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "2",
    "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
    "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "300",
    # A deferred task's timeout is enforced by this scheduler check (default every 15 s), so a
    # sensor with a 10 s timeout would otherwise wait up to 25 s.
    "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "2",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__API__WORKERS": "1",
    "AIRFLOW__API__HOST": "127.0.0.1",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    # Small pools: five processes share the test PostgreSQL's 40 connections.
    "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE": "2",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW": "4",
}


class AirflowServiceError(RuntimeError):
    """A service did not start, died, or the API did not answer as expected; carries the logs."""


@dataclass
class AirflowServices:
    """Running Airflow services of one installation, and a REST API client for them."""

    airflow: AirflowEnv
    port: int
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""
    startup_seconds: float = 0.0
    startup_steps: dict[str, float] = field(default_factory=dict)  # seconds per start-up step
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- REST API -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        *,
        auth: bool = True,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return self.client.request(method, self.base_url + path, json=json, params=params, headers=headers)

    def api(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        *,
        expect: Iterable[int] = (200, 201, 204),
    ) -> Any:
        """One REST call (``path`` like ``/api/v2/dags``); the decoded body, or an error naming
        the call, the status and the answer."""
        response = self.request(method, path, json, params)
        if response.status_code not in set(expect):
            raise AirflowServiceError(
                f"{method} {path} {json if json is not None else ''} -> {response.status_code}: "
                f"{response.text[:2000]}"
            )
        return response.json() if response.content else None

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False}, {"update_mask": "is_paused"})

    def pause(self, dag_id: str) -> None:
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True}, {"update_mask": "is_paused"})

    def trigger(
        self, dag_id: str, *, logical_date: str | None = None, conf: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"logical_date": logical_date, "conf": dict(conf or {})}
        run: dict[str, Any] = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)
        return run

    def dag_runs(self, dag_id: str, **filters: Any) -> list[dict[str, Any]]:
        params = {"limit": 100, "order_by": "logical_date", **filters}
        runs: list[dict[str, Any]] = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns", params=params)[
            "dag_runs"
        ]
        return runs

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        tis: list[dict[str, Any]] = self.api(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100}
        )["task_instances"]
        return tis

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        response = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
        )
        if response.status_code != 200:
            return f"(log of {task_id} try {try_number}: HTTP {response.status_code} {response.text[:300]})"
        content = response.json().get("content")
        if isinstance(content, list):  # structured log lines
            return "\n".join(
                str(line.get("event", line)) if isinstance(line, dict) else str(line) for line in content
            )
        return str(content)

    def wait_for_dag(self, dag_id: str, timeout: float = 90) -> dict[str, Any]:
        """Until the dag-processor has parsed ``dag_id``; an import error of any file fails at once."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            response = self.request("GET", f"/api/v2/dags/{dag_id}")
            if response.status_code == 200:
                dag: dict[str, Any] = response.json()
                return dag
            errors = self.api("GET", "/api/v2/importErrors")["import_errors"]
            if errors:
                raise AirflowServiceError(
                    "DAG import errors:\n" + "\n".join(f"{e['filename']}: {e['stack_trace']}" for e in errors)
                )
            if time.monotonic() > deadline:
                raise AirflowServiceError(f"DAG {dag_id!r} not parsed after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.5)

    def wait_for_runs(
        self, dag_id: str, n: int, timeout: float, *, run_type: str | None = None
    ) -> list[dict[str, Any]]:
        """Until ``n`` runs of ``dag_id`` (of ``run_type``, if given) have finished; returns them.

        On timeout the error lists every run's and task's state and the end of the service logs."""
        deadline = time.monotonic() + timeout
        filters = {"run_type": run_type} if run_type else {}
        while True:
            self.check_alive()
            runs = self.dag_runs(dag_id, **filters)
            done = [r for r in runs if r["state"] in TERMINAL_RUN_STATES]
            if len(done) >= n:
                return done
            if time.monotonic() > deadline:
                lines = [
                    f"{r['dag_run_id']} [{r['run_type']}] {r['state']}: "
                    f"{self.task_states(dag_id, r['dag_run_id'])}"
                    for r in runs
                ]
                raise AirflowServiceError(
                    f"{len(done)}/{n} runs of {dag_id} finished after {timeout:.0f} s:\n"
                    + "\n".join(lines)
                    + f"\n{self.logs()}"
                )
            time.sleep(1)

    def wait_for_backfill(self, backfill_id: int, timeout: float = 60) -> dict[str, Any]:
        """Until the scheduler marks the backfill completed (after its last run finished)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            backfill: dict[str, Any] = self.api("GET", f"/api/v2/backfills/{backfill_id}")
            if backfill["completed_at"] is not None:
                return backfill
            if time.monotonic() > deadline:
                raise AirflowServiceError(f"backfill not completed after {timeout:.0f} s: {backfill}")
            time.sleep(1)

    def explain_run(self, dag_id: str, run_id: str) -> str:
        """Each task's state, and the logs of tasks that did not succeed or skip."""
        parts = []
        for ti in self.task_instances(dag_id, run_id):
            parts.append(f"{ti['task_id']}: {ti['state']} (try {ti['try_number']})")
            if ti["state"] not in ("success", "skipped") and ti["try_number"]:
                log = self.task_log(dag_id, run_id, ti["task_id"], ti["try_number"])
                parts.append(log[-_LOG_TAIL:])
        return "\n".join(parts)

    # --- processes ----------------------------------------------------------------------------

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise AirflowServiceError(
                    f"airflow {name} exited with {process.returncode}\n{self.logs(name)}"
                )

    def logs(self, *names: str) -> str:
        """The end of each service's log, headed by its path."""
        parts = []
        for name in names or tuple(self.processes):
            path = self.log_dir / f"{name}.log"
            text = path.read_text(errors="replace")[-_LOG_TAIL:] if path.exists() else "(no log)"
            parts.append(f"--- {path} ---\n{text}")
        return "\n".join(parts)

    def start(self, name: str, *args: str) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.processes[name] = subprocess.Popen(
                [str(BIN / "airflow"), *args],
                env=self.airflow.env,
                cwd=self.airflow.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: its children stop with it
            )

    def stop(self, grace: float = 20) -> None:
        """SIGTERM every service's process group, then SIGKILL what is left after ``grace``."""
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes.values():
            _signal_group(process, signal.SIGKILL)  # leftovers of a stopped leader too
            process.wait()
        self.client.close()


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _async_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    if scheme.startswith("postgresql"):
        return f"postgresql+psycopg_async://{rest}"
    return url


@contextlib.contextmanager
def airflow_services(
    airflow: AirflowEnv,
    *,
    database: str = "postgresql",
    services: Iterable[str] = SERVICES,
    extra_env: Mapping[str, str] | None = None,
    start_timeout: float = 120,
    prepare: Callable[[AirflowEnv, str, str], None] | None = None,
) -> Iterator[AirflowServices]:
    """Start the api-server and ``services`` for ``airflow``; yield once the API answers with a
    token and every service reports healthy; stop them all on exit.

    ``prepare(airflow, user, password)`` runs once the metadata database is ready, before the
    services start: e.g. another auth manager's users (the services log in as ``user``).

    ``database="postgresql"`` starts a throwaway PostgreSQL, migrates it and points the
    installation at it: ``airflow.env`` is updated in place, so ``airflow.airflow(...)`` CLI calls
    made while the services run use the same metadata database. ``"sqlite"`` keeps the file.
    """
    began = time.monotonic()
    server: DatabaseServer | None = None
    port = free_port()
    password = secrets.token_urlsafe(16)
    passwords = airflow.home / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({USER: password}))
    passwords.chmod(0o600)
    log_dir = airflow.home / "services"
    log_dir.mkdir(exist_ok=True)
    airflow.env.update(
        {
            **TUNING,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # One secret for every process: the scheduler signs task tokens the api-server checks.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # The scheduler and the triggerer serve their task logs on fixed ports by default
            # (8793, 8794): free ones, so several installations can run side by side.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            **dict(extra_env or {}),
        }
    )
    steps: dict[str, float] = {}
    if database == "postgresql":
        server = start_postgres()
        steps["postgresql"] = server.startup_seconds
        url = server.create_database()
        airflow.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url
        airflow.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = _async_url(url)
        migrating = time.monotonic()
        try:
            airflow.airflow("db", "migrate", timeout=300)
        except subprocess.CalledProcessError as exc:
            server.stop()
            raise AirflowServiceError(
                f"airflow db migrate failed:\n{exc.stdout[-3000:]}\n{exc.stderr[-3000:]}"
            ) from exc
        steps["db migrate"] = time.monotonic() - migrating
    elif database != "sqlite":
        raise ValueError(f"database must be 'postgresql' or 'sqlite', not {database!r}")
    if prepare is not None:
        prepare(airflow, USER, password)
    running = AirflowServices(airflow, port, log_dir, startup_steps=steps)
    try:
        running.start(
            "api-server", "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"
        )
        for name in services:
            running.start(name, name)
        starting = time.monotonic()
        _wait_until_ready(running, USER, password, list(services), start_timeout)
        steps["services healthy"] = time.monotonic() - starting
        running.startup_seconds = time.monotonic() - began
        yield running
    finally:
        running.stop()
        if server is not None:
            server.stop()


def _wait_until_ready(
    running: AirflowServices, user: str, password: str, services: list[str], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        running.check_alive()
        try:
            if not running.token:
                response = running.request(
                    "POST", "/auth/token", {"username": user, "password": password}, auth=False
                )
                if response.status_code in (200, 201):
                    running.token = response.json()["access_token"]
                else:
                    last = f"POST /auth/token -> {response.status_code}: {response.text[:300]}"
            if running.token:
                health = running.request("GET", "/api/v2/monitor/health").json()
                unhealthy = {
                    name: health.get(key, {}).get("status")
                    for name, key in _HEALTH_KEYS.items()
                    if name in services and health.get(key, {}).get("status") != "healthy"
                }
                if not unhealthy:
                    return
                last = f"not healthy yet: {unhealthy}"
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise AirflowServiceError(f"Airflow not ready after {timeout:.0f} s ({last})\n{running.logs()}")


_HEALTH_KEYS = {"scheduler": "scheduler", "triggerer": "triggerer", "dag-processor": "dag_processor"}
