"""Shared test set-up.

Integration tests run against the real local Vitess started by ``dev/local_vitess.sh``: one
cluster per test session, reused when it already runs. They talk to it through a real Airflow
connection (an ``AIRFLOW_CONN_*`` environment variable), the way a user's DAG would.

``make test`` runs two pytest-xdist workers (``-n 2 --dist loadscope``): most of the suite waits
on servers (vtgate, Airflow's scheduler, Spark), so a second worker uses the idle core. Each
module is one unit of work (its module fixtures are set up once), and modules that share tables
of the cluster run in one worker, one after another (:data:`SHARED_TABLES`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# Modules that write the same tables of the one cluster and check them whole (a table against its
# Delta copy, the events of a window, "no change" for a while), so a write of one breaks the
# other's check: each group runs in one worker, one module after another. A module not listed
# uses tables of its own and runs beside any other.
SHARED_TABLES: dict[str, tuple[str, ...]] = {
    # customer.customer and customer.corder (and commerce.product, commerce.big, which
    # test_fencing gets from test_snapshot's fixture)
    "customer_tables": (
        "test_backfill_api",
        "test_backlog",
        "test_catchup",
        "test_dag_sync",
        "test_fencing",
        "test_lineage",
        "test_s3_sync",
        "test_snapshot",
        "test_status_page",
        "test_vstream_dml",
        "test_window",
    ),
    # customer.chgsensor_* (one fixture creates them), and the triggerer's default log port;
    # test_busy_shard and test_long_transaction use tables of their own, but their 170,000
    # transactions and 400,000-row transaction are in the one binlog every stream reads (one
    # MariaDB serves all shards): beside these modules a sensor's "no change" within its timeout
    # would become "scan_unfinished" and its latency asserts would fail.
    "changes_sensor_tables": (
        "test_changes_sensor",
        "test_sensor_failures",
        "test_busy_shard",
        "test_long_transaction",
    ),
    # customer.fault_rows, dropped and created again by each
    "fault_rows_table": ("test_faults", "test_staging_recovery"),
    # The four-shard cluster's keyspaces: test_reshard_groups creates and drops keyspace `regroup`,
    # and while its SrvKeyspace is gone vtgate refuses every MySQL connection ("keyspace regroup
    # fetch error"), so the other modules on that cluster failed beside it (a full run, session 22).
    "four_shard_cluster": ("test_copy_phase", "test_groups_four_shards", "test_reshard_groups"),
}
_GROUP_OF = {module: group for group, modules in SHARED_TABLES.items() for module in modules}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's module-by-module scheduling, with each group of :data:`SHARED_TABLES` one
    unit. (Not ``xdist_group`` marks: pytest-xdist 3.8 renames node ids to carry them, which
    pytest 9 no longer lets it do, so every test became a unit of its own.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SharedTablesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(Path(path).stem, path)

    return SharedTablesScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[object]) -> None:
    """Before the workers start, Delta's and S3A's jars are resolved once into each Ivy cache the
    tests use: Ivy does not lock its cache, and two workers downloading the same jar into it at
    once can leave it broken. On a warm cache this is a few seconds of JVM start."""
    if len(specs) < 2:
        return
    from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, HADOOP_AWS_PACKAGE
    from tests.integration.airflow_env import IVY_CACHE

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "resolved.py"
        script.write_text("")
        submit = [str(pyspark_home() / "bin" / "spark-submit"), "--packages"]
        submit.append(f"{DELTA_PACKAGE},{HADOOP_AWS_PACKAGE}")
        caches: list[list[str]] = [[], ["--conf", f"spark.jars.ivy={IVY_CACHE}"]]  # default, ours
        env = spark_env()
        runs = [
            subprocess.Popen(
                [*submit, *cache, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for cache in caches
        ]
        for run in runs:
            out, _ = run.communicate(timeout=900)
            if run.returncode != 0:
                raise pytest.UsageError(f"resolving Delta's jars failed:\n{out.decode()[-3000:]}")


def pyspark_home() -> Path:
    """The Spark that PySpark ships (its ``bin/spark-submit``, ``bin/spark-class``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env() -> dict[str, str]:
    """This process's environment for PySpark's own Spark scripts: its ``SPARK_HOME`` (not one the
    machine may have set), and this Python for the job's Python side."""
    return {**os.environ, "SPARK_HOME": str(pyspark_home()), "PYSPARK_PYTHON": sys.executable}


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one test process of the machine at a time (the workers of one run, or two runs)."""
    with open(Path(tempfile.gettempdir()) / f"airflow-provider-vitess-tests.{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class LocalVitess:
    host: str
    grpc_port: int
    mysql_port: int
    user: str
    password: str
    tls_ca: str


def _start_cluster() -> LocalVitess:
    # Two workers starting a cold cluster at once would each wipe and start it.
    with machine_lock("vitess"):
        out = subprocess.run(
            [str(REPO / "dev" / "local_vitess.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout
    return cluster_from_env(out)


def cluster_from_env(out: str) -> LocalVitess:
    """The cluster a dev/ script's ``start``/``env`` output describes (VITESS_*=... lines)."""
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return LocalVitess(
        host=values["VITESS_HOST"],
        grpc_port=int(values["VITESS_GRPC_PORT"]),
        mysql_port=int(values["VITESS_MYSQL_PORT"]),
        user=values["VITESS_USER"],
        password=Path(values["VITESS_PASSWORD_FILE"]).read_text().strip(),
        tls_ca=values["VITESS_TLS_CA"],
    )


@pytest.fixture(scope="session")
def vitess() -> LocalVitess:
    return _start_cluster()


@dataclass(frozen=True)
class LocalS3:
    """The local S3-compatible server of ``dev/local_s3.sh`` (VersityGW, posix backend)."""

    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str
    buckets: tuple[str, ...]
    data_dir: Path  # where the posix backend keeps the buckets' objects as files

    def connection_env(self, conn_id: str) -> tuple[str, str]:
        """(env var name, value) defining an Airflow ``aws`` connection to this server."""
        value = {
            "conn_type": "aws",
            "login": self.access_key_id,
            "password": self.secret_access_key,
            "extra": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }
        return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value)


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    """The local S3 server for this session; stopped at the end if this session started it."""
    script = str(REPO / "dev" / "local_s3.sh")
    with machine_lock("s3"):
        was_running = subprocess.run([script, "status"], capture_output=True, check=False).returncode == 0
        out = subprocess.run([script, "start"], check=True, capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    secret_file = Path(values["S3_SECRET_KEY_FILE"])
    yield LocalS3(
        endpoint_url=values["S3_ENDPOINT_URL"],
        region=values["S3_REGION"],
        access_key_id=values["S3_ACCESS_KEY_ID"],
        secret_access_key=secret_file.read_text().strip(),
        buckets=tuple(values["S3_BUCKETS"].split()),
        data_dir=Path(values["S3_DATA_DIR"]),
    )
    if not was_running:
        subprocess.run([script, "stop"], check=False, capture_output=True)


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server (``dev/spark_connect.sh``) for the session's tests, requiring a
    token as servers users share must: its URL with the token as Airflow's Spark Connect hook
    writes it (``;token=`` URL-encoded). The token has the characters of a base64 secret."""
    from urllib.parse import quote

    from tests.integration.databases import free_port

    token = f"{secrets.token_hex(6)}/{secrets.token_hex(6)}+{secrets.token_hex(6)}="
    env = {
        **os.environ,
        "SPARK_CONNECT_PORT": str(free_port()),
        "SPARK_CONNECT_STATE_DIR": str(tmp_path_factory.mktemp("spark-connect")),
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
    }
    script = str(REPO / "dev" / "spark_connect.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, check=False)
    assert started.returncode == 0, f"spark_connect.sh start failed:\n{started.stderr[-3000:]}"
    url = started.stdout.strip().splitlines()[-1]
    assert token not in started.stdout + started.stderr
    try:
        yield f"{url}/;token={quote(token)}"
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, check=False)


def print_past_capture(config: pytest.Config, text: str) -> None:
    """Prints ``text`` to the terminal past pytest's output capture (a soak's tally is its
    output, also in ``-q`` runs)."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:  # run with -p no:capture
        print(text, flush=True)
    else:
        with capture.global_and_fixture_disabled():
            print(text, flush=True)


def connection_uri_env(conn_id: str, cluster: LocalVitess, **extra: object) -> tuple[str, str]:
    """(env var name, value) defining an Airflow connection to the local vtgate."""
    value = {
        "conn_type": "vitess",
        "host": cluster.host,
        "port": cluster.grpc_port,
        "login": cluster.user,
        "password": cluster.password,
        "extra": {"mysql_port": cluster.mysql_port, "timeout_seconds": 10, **extra},
    }
    return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value)


@pytest.fixture
def vitess_conn_id(vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An Airflow connection id pointing at the local vtgate with the right credentials."""
    name, value = connection_uri_env("vitess_test", vitess)
    monkeypatch.setenv(name, value)
    yield "vitess_test"
