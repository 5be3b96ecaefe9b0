"""A quiet table on a busy shard: the changes sensor's "no change" needs a read up to the
position it started at.

``commerce.stall_quiet`` is synced; ``commerce.stall_busy`` (same shard, the keyspace is
unsharded) gets tens of thousands of single-row transactions, then ``stall_quiet`` one row. The
sensor streams from the committed VGTID with the sync's table filter; vtgate still sends a
position for each of the other table's transactions, and reading past them takes longer than
``sensor_timeout=5``. Measured on the 2-core dev machine: the poke's reader reads ~5,000 such
transactions a second (10,000 -> 1.9 s, 40,000 -> 8.5 s), the trigger's (grpc.aio) ~13,000
(50,000 -> 3.8 s); 2M rows in a few large transactions are passed in 0.1 s, so the count of
transactions is what makes a shard slow to scan, not its rows. Writing them through vtgate takes
~5,000 a second. Before the fix the timeout was "no change": every run skipped while the
backlog grew. Now it is ``scan_unfinished`` and the run goes on: the row reaches Delta (Delta ==
``SELECT *`` through vtgate). Poke mode at the sensor, deferred mode through the factory's DAG;
and a read that did reach its start's position still says "no change".
Real Vitess, Spark (Connect), Delta, Airflow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.sensors import VitessChangesSensor
from airflow_provider_vitess.triggers.changes import VitessChangesTrigger
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import capture_stop_position
from tests.support.airflow_env import CONNECT_MERGE, make_airflow_env
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

CONN_ID = "vitess_busy_shard_test"
QUIET, BUSY = "stall_quiet", "stall_busy"
SYNC = "dag_busy_shard"
POKE_BUSY_TRANSACTIONS = 50_000  # ~10 s for the poke's reader: twice the timeout
TRIGGER_BUSY_TRANSACTIONS = 120_000  # ~9 s for the trigger's
WRITERS = 4  # connections writing them at once (~10 s through vtgate)
SENSOR_TIMEOUT = 5

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag_busy_shard = vitess_sync_dag(
    "dag_busy_shard",
    keyspace="commerce",
    tables=["stall_quiet"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    sensor_timeout={timeout},
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env(CONN_ID, vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook(CONN_ID)
        with hook.connect_sql() as conn, conn.begin():
            for table in (QUIET, BUSY):
                conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{table}"))
                columns = "id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64)"
                conn.execute(sqlalchemy.text(f"CREATE TABLE commerce.{table} ({columns})"))
        yield hook
        hook.close()


_next_id = [int(time.time() * 1_000_000)]  # fresh across runs too


def _fresh_ids(n: int) -> range:
    first = _next_id[0] + 1
    _next_id[0] += n
    return range(first, first + n)


def write_quiet(hook: VitessHook, note: str) -> None:
    (row_id,) = _fresh_ids(1)
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text(f"INSERT INTO commerce.{QUIET} (id, note) VALUES (:id, :note)"),
            {"id": row_id, "note": note},
        )


def write_busy(hook: VitessHook, transactions: int) -> float:
    """``transactions`` single-row autocommit INSERTs into the busy table; their seconds."""
    ids = _fresh_ids(transactions)

    def writer(part: int) -> None:
        raw = hook.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("SET autocommit = 1")
            for row_id in ids[part::WRITERS]:
                cursor.execute(f"INSERT INTO commerce.{BUSY} (id, note) VALUES (%s, 'busy')", (row_id,))
        finally:
            raw.close()

    started = time.monotonic()
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, range(WRITERS)))
    return time.monotonic() - started


def current(hook: VitessHook) -> Vgtid:
    return capture_stop_position(hook.open_vstream, "commerce", timeout=30)


def trigger_payload(start: Vgtid, timeout: float) -> dict[str, Any]:
    trigger = VitessChangesTrigger(
        vitess_conn_id=CONN_ID,
        keyspace="commerce",
        tables=[QUIET],
        start_vgtid=start.to_json(),
        heartbeat_interval=1,
        timeout_at=time.time() + timeout,
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(first())


def poke_sensor(start: Vgtid) -> VitessChangesSensor:
    return VitessChangesSensor(
        task_id="wait",
        vitess_conn_id=CONN_ID,
        keyspace="commerce",
        tables=[QUIET],
        start_vgtid=start.to_json(),
        deferrable=False,
        mode="poke",
        timeout=SENSOR_TIMEOUT,
        poke_interval=0.5,
        poke_read_seconds=2,  # each poke reads for 2 s, goes on where the last stopped
        skip_on_timeout=True,
    )


def test_a_poke_timeout_before_the_start_position_is_not_no_change(hook: VitessHook) -> None:
    # A read that reaches the position it started at still says "no change" (and skips).
    start = current(hook)
    write_busy(hook, 20)
    assert trigger_payload(start, timeout=4)["status"] == "timeout"
    from airflow_provider_vitess.utils.airflow_compat import AirflowSkipException

    with pytest.raises(AirflowSkipException, match=r"No change to commerce\.stall_quiet"):
        poke_sensor(start).execute({})

    # Other tables' traffic longer to scan than the timeout, then the quiet table's row.
    start = current(hook)
    seconds = write_busy(hook, POKE_BUSY_TRANSACTIONS)
    write_quiet(hook, "after the busy traffic")
    started = time.monotonic()
    summary = poke_sensor(start).execute({})  # before the fix: AirflowSkipException
    waited = time.monotonic() - started
    print(f"{POKE_BUSY_TRANSACTIONS} busy transactions in {seconds:.1f}s; poke {summary} in {waited:.1f}s")
    # The row itself if the reads got there in time (a fast machine); else: not scanned yet.
    assert summary["reason"] in ("scan_unfinished", "row"), summary
    if summary["reason"] == "scan_unfinished":
        assert summary["lag"]["commerce/0"] > 0, summary


def test_a_quiet_table_on_a_busy_shard_reaches_delta(
    vitess: LocalVitess, spark_connect: str, hook: VitessHook, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    airflow = make_airflow_env(tmp_path / "af", vitess, spark_connect=spark_connect)
    dag_source = DAG_FILE.format(lake=lake, timeout=SENSOR_TIMEOUT, merge_kwargs=CONNECT_MERGE)
    airflow.write_dag("busy_shard_dag", dag_source)
    write_quiet(hook, "before the snapshot")
    first = airflow.run_dag(SYNC)
    assert first["tasks"]["merge_snapshot"] == "success", first["tasks"]

    seconds = write_busy(hook, TRIGGER_BUSY_TRANSACTIONS)
    write_quiet(hook, "after the busy traffic")
    run = airflow.run_dag(SYNC)  # the sensor defers; dag.test() runs its trigger inline
    # Before the fix: wait_for_changes "skipped" (no change within 5 s), and the row never came.
    assert run["tasks"]["wait_for_changes"] == "success", (run["tasks"], f"{seconds:.1f}s of busy writes")
    assert all(run["tasks"][t] == "success" for t in ("catch_up", "merge")), run["tasks"]
    assert_delta_equals_source(hook, "commerce", [QUIET], lake / "delta")
    reason = "scan_unfinished" if "scan_unfinished" in run["log"] else "row"
    print(f"{TRIGGER_BUSY_TRANSACTIONS} busy transactions in {seconds:.1f}s; the sensor said {reason}")
