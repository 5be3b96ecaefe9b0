"""A freshness objective costs neither data nor events (issue 38, item 3), on the path a user runs:
``airflow dags test`` of a factory DAG with ``freshness_sla``, real Vitess, Spark (Connect) and
Delta, Airflow's own metadata database.

The objective is tiny, so every catch-up window breaches it. Then:

* ``airflow dags test`` exits 0 (a DAG with a deadline: Airflow's ``dag.test()`` used to fail a
  successful run in its deadline code, see ``utils.airflow_compat.DeadlineSafeDAG``);
* the first snapshot's merge is no breach;
* a quiet source (item 4a): the changes sensor finds nothing and the run skips its catch-up and
  merge, yet the sync's *as of* moves to when the sensor's position was taken (no window), and
  the status document says so;
* the catch-up's merge is a breach, says so in its result, yet succeeds; it records its asset
  event (with the window's extra) and Airflow queues the consumer DAG scheduled on the table's
  Asset (that the consumer then runs, under the scheduler: ``test_backfill_api.py``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, history
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.plugins import documents
from tests.support.airflow_env import (
    ASSET_CONSUMER_DAG,
    CONNECT_MERGE,
    FRESHNESS_DAG,
    AirflowEnv,
    make_airflow_env,
)
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

DAG_ID = SYNC = "fresh_breach_sync"
TABLE = "fresh_orders"
FRESHNESS_SLA = 0.01  # seconds: every catch-up window is older than that when its merge ends


@pytest.fixture
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_fresh_objective", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_fresh_objective")
        execute(
            hook,
            f"DROP TABLE IF EXISTS commerce.{TABLE}",
            f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(16))",
            f"INSERT INTO commerce.{TABLE} (id, note) VALUES (1, 'a'), (2, 'b')",
        )
        yield hook
        hook.close()


def _dags_test(airflow: AirflowEnv) -> None:
    """``airflow dags test`` of the sync DAG, as a user runs it: it must exit 0."""
    proc = airflow.airflow("dags", "test", DAG_ID, check=False)
    assert proc.returncode == 0, f"airflow dags test exited {proc.returncode}:\n{proc.stderr[-6000:]}"


def _results(airflow: AirflowEnv) -> list[dict[str, Any]]:
    """Each merge task's result (XCom ``return_value``), in the order the runs wrote them."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, value FROM xcom WHERE dag_id = ? AND key = 'return_value' "
            "AND task_id IN ('merge_snapshot', 'merge') ORDER BY timestamp",
            (DAG_ID,),
        ).fetchall()
    return [{"task": task, **json.loads(value)} for task, value in rows]


def _states(airflow: AirflowEnv) -> dict[str, str]:
    """The task states of the sync DAG's latest run."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
            (DAG_ID, DAG_ID),
        ).fetchall()
    return dict(rows)


def _queued(airflow: AirflowEnv) -> set[str]:
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        return {r[0] for r in db.execute("SELECT target_dag_id FROM asset_dag_run_queue")}


def test_a_breached_merge_succeeds_with_its_asset_event_and_a_quiet_source_stays_fresh(
    vitess: LocalVitess, spark_connect: str, hook: VitessHook, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    airflow = make_airflow_env(tmp_path, vitess, spark_connect=spark_connect)
    airflow.env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"  # consumers get queued
    airflow.write_dag(
        DAG_ID,
        FRESHNESS_DAG.format(
            dag_id=DAG_ID,
            table=TABLE,
            lake=lake,
            sensor_timeout=5,
            sla=FRESHNESS_SLA,
            merge_kwargs=CONNECT_MERGE,
        ),
    )
    uri = f"file://{lake}/delta/{TABLE}"

    # Run 1: the first snapshot (no breach), then the sensor finds no change: the rest skipped.
    _dags_test(airflow)
    ended = datetime.now(timezone.utc)
    (snapshot,) = _results(airflow)
    assert (snapshot["task"], snapshot["kind"], snapshot["breached"]) == ("merge_snapshot", "snapshot", False)
    states = _states(airflow)
    assert states["merge_snapshot"] == "success", states
    assert (states["wait_for_changes"], states["catch_up"], states["merge"]) == ("skipped",) * 3, states
    (first,) = airflow.asset_events()[uri]
    assert (first["kind"], first["rows_inserted"]) == ("snapshot", 2)
    # The quiet source's proof: as of moved from the snapshot's time to the sensor's, no window.
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    point = history.checkpoint(store.engine, SYNC)
    assert point is not None and point.as_of is not None and point.committed_seq == snapshot["merged"]
    snapshot_as_of = datetime.fromisoformat(snapshot["as_of"])
    assert snapshot_as_of < point.as_of < ended, (snapshot_as_of, point.as_of, ended)
    assert point.as_of > snapshot_as_of + timedelta(seconds=snapshot["seconds_behind"]), (
        "the sensor's position is taken after the snapshot's merge ended"
    )
    at = point.as_of + timedelta(seconds=FRESHNESS_SLA / 2)
    status = documents.sync_status(store, "default", SYNC, at)
    assert status is not None and status.committed is not None
    assert (status.committed.as_of, status.committed.seconds_behind) == (point.as_of, 0.005)
    assert status.freshness_breached is False, "a quiet, healthy source is no breach"
    store.close()

    # The consumer appears now: the queue below is what run 2's breached merge alone caused.
    airflow.write_dag("consumer", ASSET_CONSUMER_DAG.format(lake=lake, table=TABLE))
    airflow.airflow("dags", "reserialize")
    assert _queued(airflow) == set()

    execute(hook, f"INSERT INTO commerce.{TABLE} (id, note) VALUES (3, 'c'), (4, 'd'), (5, 'e')")
    _dags_test(airflow)
    *_, breached = _results(airflow)
    assert (breached["task"], breached["kind"], breached["breached"]) == ("merge", "catchup", True)
    assert breached["freshness_sla"] == FRESHNESS_SLA and breached["seconds_behind"] > FRESHNESS_SLA
    assert breached["merged"] > snapshot["merged"]
    assert _states(airflow)["wait_for_changes"] == "success"
    events = airflow.asset_events()[uri]
    assert len(events) == 2, events
    extra = events[-1]
    assert (extra["sync_id"], extra["kind"], extra["window_seq"]) == (SYNC, "catchup", breached["merged"])
    assert (extra["rows_inserted"], extra["rows_updated"], extra["rows_deleted"]) == (3, 0, 0)
    assert _queued(airflow) == {f"on_{TABLE}"}
