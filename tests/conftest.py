"""Shared test set-up.

Integration tests run against the real local Vitess started by ``dev/local_vitess.sh``: one
cluster per test session, reused when it already runs. They talk to it through a real Airflow
connection (an ``AIRFLOW_CONN_*`` environment variable), the way a user's DAG would.

``make test`` runs two pytest-xdist workers (``-n 2 --dist loadscope``): most of the suite waits
on servers (vtgate, Airflow's scheduler, Spark), so a second worker uses the idle core. Each
module is one unit of work (its module fixtures are set up once), and modules that share tables
of the cluster run in one worker, one after another, and the longest units start first
(``tests/support/scheduling.py``). The helpers these fixtures stand on are in ``tests/support/``;
this file keeps the fixtures and the pytest hooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import connect_server
from tests.support.local import (
    REPO,
    LocalS3,
    LocalVitess,
    connection_uri_env,
    machine_lock,
    pyspark_home,
    spark_env,
    start_cluster,
)
from tests.support.scheduling import LONG_FIRST, SHARED_TABLES

_GROUP_OF = {module: group for group, modules in SHARED_TABLES.items() for module in modules}


def _integration(path: Path) -> bool:
    """Whether ``path`` (absolute, or a node id's, relative to the repo) is an integration module."""
    return (REPO / path).resolve().is_relative_to(REPO / "tests" / "integration")


def _group_key(path: Path) -> str | None:
    """The SHARED_TABLES group of an integration module (unit modules share no tables: a unit
    module named like an integration one, ``test_lineage``, is not in its group)."""
    return _GROUP_OF.get(path.stem) if _integration(path) else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration modules of :data:`LONG_FIRST` first, in its order; the rest in path order."""
    rank = {stem: i for i, stem in enumerate(LONG_FIRST)}

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = indexed
        long = item.path.stem in rank and _integration(item.path)
        return (rank[item.path.stem] if long else len(rank), index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's module-by-module scheduling, with each group of :data:`SHARED_TABLES` one
    unit. (Not ``xdist_group`` marks: pytest-xdist 3.8 renames node ids to carry them, which
    pytest 9 no longer lets it do, so every test became a unit of its own.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SharedTablesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _group_key(Path(path)) or path

    return SharedTablesScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[object]) -> None:
    """Before the workers start, Delta's and S3A's jars are resolved once into each Ivy cache the
    tests use: Ivy does not lock its cache, and two workers downloading the same jar into it at
    once can leave it broken. On a warm cache this is a few seconds of JVM start."""
    if len(specs) < 2:
        return
    from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, HADOOP_AWS_PACKAGE
    from tests.support.airflow_env import IVY_CACHE

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


@pytest.fixture(scope="session")
def vitess() -> LocalVitess:
    return start_cluster()


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
    """A Spark Connect server for the session's tests, requiring a token as servers users share
    must: its URL with the token as Airflow's Spark Connect hook writes it (``;token=``
    URL-encoded). The server is the worker's test JVM (``tests/support/connect_server.py``),
    else one ``dev/spark_connect.sh`` starts."""
    if not connect_server.in_process():
        yield from _connect_server(tmp_path_factory, {})
        return
    from tests.support.delta_check import spark_session

    spark_session()  # its JVM is the server
    yield connect_server.endpoint().url


@pytest.fixture(scope="session")
def spark_connect_iceberg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server with Iceberg (``SPARK_CONNECT_ICEBERG``), started by
    ``dev/spark_connect.sh`` and requiring a token (the characters of a base64 secret), on the
    Spark line of this process's PySpark, which must have an Iceberg runtime."""
    yield from _connect_server(tmp_path_factory, {"SPARK_CONNECT_ICEBERG": "1"})


def _connect_server(tmp_path_factory: pytest.TempPathFactory, extra: dict[str, str]) -> Iterator[str]:
    from tests.support.databases import free_port

    token = connect_server.new_token()
    env = {
        **os.environ,
        "SPARK_CONNECT_PORT": str(free_port()),
        "SPARK_CONNECT_STATE_DIR": str(tmp_path_factory.mktemp("spark-connect")),
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
        # This Python (make test-compat runs from a copy of the repo without a .venv).
        "SPARK_CONNECT_PYTHON": os.environ.get("SPARK_CONNECT_PYTHON") or sys.executable,
        **extra,
    }
    script = str(REPO / "dev" / "spark_connect.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, check=False)
    assert started.returncode == 0, f"spark_connect.sh start failed:\n{started.stderr[-3000:]}"
    url = started.stdout.strip().splitlines()[-1]
    assert token not in started.stdout + started.stderr
    try:
        yield connect_server.with_token(url, token)
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, check=False)


@pytest.fixture
def vitess_conn_id(vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An Airflow connection id pointing at the local vtgate with the right credentials."""
    name, value = connection_uri_env("vitess_test", vitess)
    monkeypatch.setenv(name, value)
    yield "vitess_test"
