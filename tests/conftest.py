"""Shared test set-up.

Integration tests run against the real local Vitess started by ``dev/local_vitess.sh``: one
cluster per test session, reused when it already runs. They talk to it through a real Airflow
connection (an ``AIRFLOW_CONN_*`` environment variable), the way a user's DAG would.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LocalVitess:
    host: str
    grpc_port: int
    mysql_port: int
    user: str
    password: str
    tls_ca: str


def _start_cluster() -> LocalVitess:
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
    """A Spark Connect server (``dev/spark_connect.sh``) for the session's tests: its URL."""
    from tests.integration.databases import free_port

    env = {
        **os.environ,
        "SPARK_CONNECT_PORT": str(free_port()),
        "SPARK_CONNECT_STATE_DIR": str(tmp_path_factory.mktemp("spark-connect")),
    }
    script = str(REPO / "dev" / "spark_connect.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, check=False)
    assert started.returncode == 0, f"spark_connect.sh start failed:\n{started.stderr[-3000:]}"
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, check=False)


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
