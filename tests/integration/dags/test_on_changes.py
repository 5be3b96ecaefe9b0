"""Event-driven syncs: a factory DAG with ``on_changes=True`` runs on a source change, without a
schedule tick, and holds no worker slot while nothing changes.

Airflow's own scheduler, dag-processor and triggerer (LocalExecutor) run the DAG; merges go to
the session's Spark Connect server. The oracle: after the change, Delta == ``SELECT *``; while
idle, the only unfinished task of the running run is the deferred sensor (in the triggerer, not
a worker), sampled for a while.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_MERGE, make_airflow_env
from tests.support.airflow_services import AirflowServices, airflow_services
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

DAG_ID = "on_changes_sync"
TABLE = "oc_items"
DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    on_changes=True,
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


@pytest.fixture
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_on_changes", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_on_changes")
        execute(
            hook,
            f"DROP TABLE IF EXISTS commerce.{TABLE}",
            f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(32))",
            f"INSERT INTO commerce.{TABLE} VALUES (1, 'first'), (2, 'second')",
        )
        yield hook
        hook.close()


def _running(api: AirflowServices) -> list[dict[str, object]]:
    return [r for r in api.dag_runs(DAG_ID) if r["state"] in ("queued", "running")]


def _waiting(api: AirflowServices, timeout: float) -> str:
    """Until a run's sensor is deferred; that run's id."""
    deadline = time.monotonic() + timeout
    while True:
        api.check_alive()
        for run in _running(api):
            if api.task_states(DAG_ID, str(run["dag_run_id"])).get("wait_for_changes") == "deferred":
                return str(run["dag_run_id"])
        assert time.monotonic() < deadline, (
            f"no deferred sensor after {timeout:.0f} s: {api.dag_runs(DAG_ID)}"
        )
        time.sleep(1)


def test_a_change_runs_the_sync_and_idle_it_holds_no_worker_slot(
    hook: VitessHook, vitess: LocalVitess, spark_connect: str, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    env = make_airflow_env(tmp_path, vitess, spark_connect=spark_connect)
    env.write_dag(DAG_ID, DAG_FILE.format(dag_id=DAG_ID, table=TABLE, lake=lake, merge_kwargs=CONNECT_MERGE))
    with airflow_services(env) as api:
        api.wait_for_dag(DAG_ID)
        api.unpause(DAG_ID)
        # The first run snapshots, then its sensor waits: nothing changed since.
        first = _waiting(api, timeout=300)
        states = api.task_states(DAG_ID, first)
        assert (states["snapshot"], states["merge_snapshot"]) == ("success", "success"), states
        assert_delta_equals_source(hook, "commerce", [TABLE], lake / "delta")

        # Idle: for 20 s the run holds one task, deferred (in the triggerer); no other run.
        for _ in range(10):
            assert [r["dag_run_id"] for r in _running(api)] == [first]
            states = api.task_states(DAG_ID, first)
            unfinished = {t: s for t, s in states.items() if s not in ("success", "skipped")}
            assert unfinished == {"wait_for_changes": "deferred", "catch_up": None, "merge": None}, states
            time.sleep(2)

        # A change: the waiting run goes on at once, no schedule tick involved.
        changed = time.monotonic()
        execute(
            hook,
            f"UPDATE commerce.{TABLE} SET note = 'changed' WHERE id = 1",
            f"INSERT INTO commerce.{TABLE} VALUES (3, 'third')",
        )
        [done] = [r for r in api.wait_for_runs(DAG_ID, 1, timeout=300) if r["dag_run_id"] == first]
        latency = time.monotonic() - changed
        assert done["state"] == "success", api.task_states(DAG_ID, first)
        assert api.task_states(DAG_ID, first)["merge"] == "success"
        assert_delta_equals_source(hook, "commerce", [TABLE], lake / "delta")
        print(f"change -> committed in Delta: {latency:.1f} s")

        # The next run starts by itself and waits again.
        second = _waiting(api, timeout=120)
        assert second != first
        api.pause(DAG_ID)
