"""The changes sensor's tables and helpers, shared by the sensor room's modules: the watched table
``customer.chgsensor_watch`` and its neighbours, the sync's committed position, and a driver
that runs a DAG once with ``dag.test()`` (optionally leaving deferred tasks to a real triggerer)."""

from __future__ import annotations

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import capture_stop_position

CONN_ID = "vitess_changes"
WATCHED = "chgsensor_watch"
OTHER = "chgsensor_other"
SYNC_ID = "chgsensor"


def current(hook: VitessHook, keyspace: str = "customer") -> Vgtid:
    return capture_stop_position(hook.open_vstream, keyspace, timeout=30)


# Runs the DAG once with dag.test(). "triggerer" mode leaves deferred tasks to a real triggerer
# process (dag.test() would run the trigger inline): its loop then waits, reading task states
# from the database, until the triggerer has scheduled the task again, and resumes it.
DRIVER = """
import json, sys

import runpy

import airflow.sdk.definitions.dag as dag_module
from airflow.sdk import DAG

if sys.argv[1] == "triggerer":
    run_task = dag_module._run_task

    def without_inline_trigger(*, ti, task, run_triggerer=False):
        return run_task(ti=ti, task=task, run_triggerer=False)

    dag_module._run_task = without_inline_trigger

found = runpy.run_path(sys.argv[2])
dag = next(v for v in found.values() if isinstance(v, DAG) and v.dag_id == sys.argv[3])
run = dag.test()
print("RESULT " + json.dumps({"state": str(run.state)}), flush=True)
"""


def commit_position(store_url: str, position: Vgtid) -> None:
    """Makes ``position`` the sync's committed VGTID, the way a merged window does."""
    store = CheckpointStore(store_url)
    try:
        store.migrate()
        store.ensure_sync(SYNC_ID, "customer", [WATCHED], {})
        committed, _ = store.committed(SYNC_ID)
        if committed is None:
            seq = store.plan_window(SYNC_ID, "snapshot", Vgtid.for_keyspace("customer", ""))
        else:
            seq = store.plan_window(SYNC_ID, "catchup", committed, position)
        store.mark_staged(SYNC_ID, seq, position, f"/nowhere/{seq}/manifest.json")
        store.mark_merged(SYNC_ID, seq)
        store.commit(SYNC_ID, seq)
    finally:
        store.close()
