"""Settings that hold on one host only are refused where a sync's tasks may run on several
(``airflow_provider_vitess.single_host``): a factory DAG run through Airflow (``dag.test()``)
with a multi-host executor configured (Celery's, by its class path: the check reads the name,
no worker is needed) fails at its first task, naming the SQLite store and the local staging
path with their remedies, before anything is read or written; with the paths declared shared
(``[vitess] shared_filesystem``) the SQLite store is still refused; with the store on
PostgreSQL too (the remedy both refusals name), the run goes through and Delta == ``SELECT *``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import make_airflow_env
from tests.support.databases import start_postgres
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

CELERY = "airflow.providers.celery.executors.celery_executor.CeleryExecutor"
DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "single_host_sync",
    keyspace="commerce",
    tables=["single_host_t"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,
    default_args={{"retries": 0}},{store}
)
"""


def test_a_fleet_executor_refuses_the_sqlite_store_and_local_paths_and_their_remedies_heal(
    vitess: LocalVitess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, value = connection_uri_env("vitess_single_host", vitess)
    monkeypatch.setenv(name, value)
    hook = VitessHook("vitess_single_host")
    execute(
        hook,
        "CREATE TABLE IF NOT EXISTS commerce.single_host_t "
        "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))",
        "INSERT IGNORE INTO commerce.single_host_t (id, note) VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    )
    airflow = make_airflow_env(tmp_path, vitess)
    lake = tmp_path / "lake"
    (airflow.home / "dags" / "single_host.py").write_text(DAG_FILE.format(lake=lake, store=""))
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

    # And the store on a database every worker reaches: the run goes through, exact.
    server = start_postgres()
    try:
        url = sqlalchemy.engine.make_url(server.create_database())
        conn = {"conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username}
        airflow.env["AIRFLOW_CONN_FLEET_STORE"] = json.dumps({**conn, "schema": url.database})
        store = '\n    checkpoint_conn_id="fleet_store",'
        (airflow.home / "dags" / "single_host.py").write_text(DAG_FILE.format(lake=lake, store=store))
        result = airflow.run_dag("single_host_sync")
        assert result["state"] == "success", (result["tasks"], result["log"][-4000:])
        assert result["tasks"]["merge_snapshot"] == "success", result["tasks"]
    finally:
        server.stop()
    assert_delta_equals_source(hook, "commerce", ["single_host_t"], lake / "delta")
