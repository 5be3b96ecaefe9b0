"""Event-driven syncs: a factory DAG with ``on_changes=True`` runs on a source change, without a
schedule tick, and holds no worker slot while nothing changes; with ``follow_seconds`` too, the
run's ``follow`` task catches up and merges round after round while changes keep coming.

Airflow's own scheduler, dag-processor and triggerer (LocalExecutor) run the DAG; merges go to
the session's Spark Connect server. The oracle: after the change, Delta == ``SELECT *``; while
idle, the only unfinished task of the running run is the deferred sensor (in the triggerer, not
a worker), sampled for a while.
"""

from __future__ import annotations

import json
import threading
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
FOLLOW_DAG_ID = "on_changes_follow"
FOLLOW_TABLE = "oc_followed"
DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    on_changes=True,{follow}
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
        for table in (TABLE, FOLLOW_TABLE):
            execute(
                hook,
                f"DROP TABLE IF EXISTS commerce.{table}",
                f"CREATE TABLE commerce.{table} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(32))",
                f"INSERT INTO commerce.{table} VALUES (1, 'first'), (2, 'second')",
            )
        yield hook
        hook.close()


def _running(api: AirflowServices, dag_id: str = DAG_ID) -> list[dict[str, object]]:
    return [r for r in api.dag_runs(dag_id) if r["state"] in ("queued", "running")]


def _waiting(api: AirflowServices, timeout: float, dag_id: str = DAG_ID, task: str = "wait_for_changes",
             state: str = "deferred") -> str:  # fmt: skip
    """Until a run's ``task`` is in ``state`` (default: its sensor deferred); that run's id."""
    deadline = time.monotonic() + timeout
    while True:
        api.check_alive()
        for run in _running(api, dag_id):
            if api.task_states(dag_id, str(run["dag_run_id"])).get(task) == state:
                return str(run["dag_run_id"])
        assert time.monotonic() < deadline, f"no {task} {state} after {timeout:.0f} s: {api.dag_runs(dag_id)}"
        time.sleep(0.5)


def test_a_change_runs_the_sync_and_idle_it_holds_no_worker_slot(
    hook: VitessHook, vitess: LocalVitess, spark_connect: str, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    env = make_airflow_env(tmp_path, vitess, spark_connect=spark_connect)
    env.write_dag(
        DAG_ID, DAG_FILE.format(dag_id=DAG_ID, table=TABLE, lake=lake, follow="", merge_kwargs=CONNECT_MERGE)
    )
    followed = tmp_path / "followed"
    env.write_dag(
        FOLLOW_DAG_ID,
        DAG_FILE.format(
            dag_id=FOLLOW_DAG_ID,
            table=FOLLOW_TABLE,
            lake=followed,
            follow=f"\n    follow_seconds={FOLLOW_SECONDS},",
            merge_kwargs=CONNECT_MERGE,
        ),
    )
    with airflow_services(env) as api:
        api.wait_for_dag(DAG_ID)
        api.wait_for_dag(FOLLOW_DAG_ID)
        api.unpause(DAG_ID)
        api.unpause(FOLLOW_DAG_ID)
        # The first run snapshots, then its sensor waits: nothing changed since.
        first = _waiting(api, timeout=300)
        states = api.task_states(DAG_ID, first)
        assert (states["snapshot"], states["merge_snapshot"]) == ("success", "success"), states
        assert_delta_equals_source(hook, "commerce", [TABLE], lake / "delta")
        # The follow DAG's run follows its changes meanwhile (checked at the end).
        following = _start_following(api, hook, env.home)

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
        _followed(api, hook, followed, *following)


# The follow task's time: its rounds go on while the writer writes (12 s from its start).
FOLLOW_SECONDS = 30


def _start_following(api: AirflowServices, hook: VitessHook, home: Path) -> tuple[str, threading.Thread]:
    """The follow DAG (started with the other) waits deferred; a change starts its ``follow``
    task, and from the task's start a writer writes a row a second for 12 s, then a delete: the
    rows after the first round's stop position are merged by later rounds of the same task."""
    run_id = _waiting(api, timeout=120, dag_id=FOLLOW_DAG_ID)
    states = api.task_states(FOLLOW_DAG_ID, run_id)
    assert states == {"snapshot": "success", "merge_snapshot": "success", "wait_for_changes": "deferred",
                      "follow": None}, states  # fmt: skip
    execute(hook, f"UPDATE commerce.{FOLLOW_TABLE} SET note = 'changed' WHERE id = 1")

    def write() -> None:
        # The task's log appears as it starts (a file: no API client shared across threads).
        logs = home / "logs" / f"dag_id={FOLLOW_DAG_ID}"
        deadline = time.monotonic() + 120
        while not list(logs.glob("run_id=*/task_id=follow/attempt=1.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        for i in range(3, 15):
            execute(hook, f"INSERT INTO commerce.{FOLLOW_TABLE} VALUES ({i}, 'row {i}')")
            time.sleep(1)
        execute(hook, f"DELETE FROM commerce.{FOLLOW_TABLE} WHERE id = 2")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return run_id, writer


def _followed(
    api: AirflowServices, hook: VitessHook, lake: Path, run_id: str, writer: threading.Thread
) -> None:
    """The follow run ended when its seconds were spent, after rounds of its own: Delta == the
    source, every window merged in order."""
    writer.join(timeout=180)
    assert not writer.is_alive(), "the writer of the follow DAG's rows did not finish"
    [done] = [r for r in api.wait_for_runs(FOLLOW_DAG_ID, 1, timeout=180) if r["dag_run_id"] == run_id]
    assert done["state"] == "success", api.task_states(FOLLOW_DAG_ID, run_id)
    assert_delta_equals_source(hook, "commerce", [FOLLOW_TABLE], lake / "delta")
    entry = api.api(
        "GET",
        f"/api/v2/dags/{FOLLOW_DAG_ID}/dagRuns/{run_id}/taskInstances/follow/xcomEntries/return_value",
        params={"deserialize": "true"},
    )
    value = entry["value"]
    result = json.loads(value) if isinstance(value, str) else value
    # The first change's round, then rounds for the rows written while it followed; merged in order.
    assert result["rounds"] >= 2 and result["stopped"] == "follow_seconds", result
    windows = result["windows"]
    assert windows == sorted(windows) and len(windows) >= result["rounds"], result
    # The update, 12 inserts and the delete: each read once.
    assert result["merged"] == windows[-1] and result["rows"] == 14, result
    api.pause(FOLLOW_DAG_ID)
