"""A merge whose checkpoint store never saw its sync fails, naming the likely misconfiguration.

The condition, as a deployment with several workers makes it: no ``checkpoint_conn_id``, so each
machine's tasks use the SQLite file under their own ``AIRFLOW_HOME``. The snapshot task runs on
worker A (a real capture against the local vtgate, recorded in A's file); the merge task of the
same run lands on worker B, whose file has never seen the sync. It used to report "nothing
staged to merge" and succeed, run after run, while nothing ever reached Delta.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import make_airflow_env
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

DAG_ID, TABLE = "unknown_sync_dag", "unknown_sync_t"
DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables="{table}",
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,{store}
)
"""


def test_a_merge_whose_store_never_saw_the_sync_fails_naming_the_cause_and_a_shared_store_heals(
    vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, value = connection_uri_env("vitess_unknown", vitess)
    monkeypatch.setenv(name, value)
    hook = VitessHook("vitess_unknown")
    execute(
        hook,
        f"CREATE TABLE IF NOT EXISTS commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))",
        f"INSERT IGNORE INTO commerce.{TABLE} (id, note) VALUES (1, 'a'), (2, 'b')",
    )
    hook.close()
    lake = tmp_path_factory.mktemp("shared-lake")  # staging and Delta shared, as on S3
    workers = [make_airflow_env(tmp_path_factory.mktemp(f"worker-{w}"), vitess) for w in "ab"]
    for worker in workers:
        worker.write_dag(DAG_ID, DAG_FILE.format(dag_id=DAG_ID, table=TABLE, lake=lake, store=""))
    a, b = workers
    a.airflow("tasks", "test", DAG_ID, "snapshot", timeout=300)
    store_a = CheckpointStore(f"sqlite:///{a.home / 'vitess_sync.db'}")
    try:
        assert store_a.open_window(DAG_ID) is not None  # staged on worker A
    finally:
        store_a.close()

    merged = b.airflow("tasks", "test", DAG_ID, "merge_snapshot", timeout=300, check=False)
    output = merged.stdout + merged.stderr
    assert "nothing staged to merge" not in output
    assert (
        f"sync '{DAG_ID}' is unknown to the checkpoint store sqlite:///{b.home / 'vitess_sync.db'}" in output
    )
    assert "give the capture and merge tasks the same checkpoint_conn_id" in output
    # The task failed at once: AirflowFailException, no retry (``airflow tasks test`` exits 0).
    assert "AirflowFailException: UnknownSyncError" in output and "new_state=failed" in output

    # What it says: one checkpoint_conn_id for both (a shared file stands for the shared
    # database), and what worker A's own file recorded moved there with store_copy, on A.
    shared = json.dumps({"conn_type": "sqlite", "host": str(lake / "shared_store.db")})
    for worker in workers:
        worker.env["AIRFLOW_CONN_SHARED_STORE"] = shared
        store = '\n    checkpoint_conn_id="shared_store",'
        worker.write_dag(DAG_ID, DAG_FILE.format(dag_id=DAG_ID, table=TABLE, lake=lake, store=store))
    copied = a.python("-m", "airflow_provider_vitess.store_copy", "--to-conn", "shared_store")
    assert "vitess_sync_window: " in copied.stdout, copied.stdout
    merged = b.airflow("tasks", "test", DAG_ID, "merge_snapshot", timeout=300, check=False)
    assert "new_state=success" in merged.stdout + merged.stderr, (merged.stdout + merged.stderr)[-4000:]
    assert_delta_equals_source(VitessHook("vitess_unknown"), "commerce", [TABLE], lake / "delta")
