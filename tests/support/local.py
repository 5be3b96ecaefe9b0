"""The local machine the tests run on: the repository, the local Vitess cluster and S3 server
(``dev/local_vitess.sh``, ``dev/local_s3.sh``) and how Airflow reaches them, PySpark's own Spark,
and locks held by one test process of the machine at a time. Shared by the fixtures of
``tests/conftest.py``, test modules, ``bench/`` and ``dev/``."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The package as imported: the checkout's, or the installed wheel's (make test-compat runs the
# tests from a copy of the repo without the package).
PACKAGE_SOURCE = Path(importlib.util.find_spec("airflow_provider_vitess").origin or "").parent  # type: ignore[union-attr]


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


def start_cluster() -> LocalVitess:
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
