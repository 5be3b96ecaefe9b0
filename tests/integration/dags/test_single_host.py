"""Settings that hold on one host only are refused where a sync's tasks may run on several
(``airflow_provider_vitess.single_host``): a factory DAG run through Airflow (``dag.test()``)
with a multi-host executor configured (Celery's, by its class path: the check reads the name,
no worker is needed) fails at its first task, naming the SQLite store and the local staging
path with their remedies, before anything is read or written; with the paths declared shared
(``[vitess] shared_filesystem``) the SQLite store is still refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.airflow_env import make_airflow_env
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

CELERY = "airflow.providers.celery.executors.celery_executor.CeleryExecutor"
DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "single_host_sync",
    keyspace="commerce",
    tables=["product"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    default_args={{"retries": 0}},
)
"""


def test_a_fleet_executor_refuses_the_sqlite_store_and_local_paths(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    airflow = make_airflow_env(tmp_path, vitess)
    lake = tmp_path / "lake"
    (airflow.home / "dags" / "single_host.py").write_text(DAG_FILE.format(lake=lake))
    airflow.env["AIRFLOW__CORE__EXECUTOR"] = CELERY
    result = airflow.run_dag("single_host_sync")
    assert result["state"] == "failed", result["tasks"]
    assert "success" not in result["tasks"].values(), result["tasks"]
    log = result["log"]
    assert "runs under CeleryExecutor, which may run a sync's tasks on different hosts" in log, log[-4000:]
    assert "its checkpoint store is a SQLite file" in log
    assert f"staging_location '{lake}/staging' is a path on the worker's disk" in log
    assert not (lake / "staging").exists() and not (lake / "delta").exists(), "nothing may be written"
    assert not (airflow.home / "vitess_sync.db").exists(), "the store must not be touched"

    # Paths declared shared by every worker (an NFS mount): the SQLite store is still refused.
    airflow.env["AIRFLOW__VITESS__SHARED_FILESYSTEM"] = "True"
    result = airflow.run_dag("single_host_sync")
    assert result["state"] == "failed", result["tasks"]
    assert "its checkpoint store is a SQLite file" in result["log"]
    assert "is a path on the worker's disk" not in result["log"]
    assert not (airflow.home / "vitess_sync.db").exists()
