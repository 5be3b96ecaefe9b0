"""A transaction that takes longer to stream than the run's ``max_seconds`` reaches Delta.

The factory's DAG (``dag.test()``) syncs ``commerce.stall_txn``, a table of its own. One
transaction updates every one of its ``ROWS`` rows; streaming it takes longer than the run's
``max_seconds=1`` (measured on the 2-core dev machine: ~3 s for 1M rows; 400k rows: the old
window gave up after 1.6-1.9 s with 0 rows, every time, where 100k-200k sometimes fit in the
second; 1M rows made this test take 4 min, mostly the snapshot, the merge and the check). Before the fix a
catch-up window closed at the time bound with the transaction still open, ended where it
started, and every later run did the same: the VGTID never moved and every run was green. Now a
window reads on to the end of the transaction it is inside, so the run whose window enters it
applies it whole (the first, unless the window's second ran out on the suite's other commits
before it): Delta == ``SELECT *`` through vtgate, and the committed VGTID is past the transaction.
Real Vitess, Spark (Connect), Delta, Airflow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_MERGE, make_airflow_env
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

TABLE = "stall_txn"
SYNC = "dag_long_transaction"
ROWS = 400_000
# vttablet refuses a DML statement of more than 10,000 rows (its max result size): the one
# transaction is made of UPDATEs of this many rows each.
STATEMENT_ROWS = 10_000

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag_long_transaction = vitess_sync_dag(
    "dag_long_transaction",
    keyspace="commerce",
    tables=["stall_txn"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    max_seconds=1,
    wait_for_changes=False,
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_long_txn_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_long_txn_test")
        yield hook
        hook.close()


def _load(hook: VitessHook, rows: int) -> None:
    """``rows`` rows, doubled with INSERT ... SELECT (seconds for a million)."""
    sql = sqlalchemy.text
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sql(f"DROP TABLE IF EXISTS commerce.{TABLE}"))
        columns = "id BIGINT NOT NULL PRIMARY KEY, n INT NOT NULL, note VARCHAR(32)"
        conn.execute(sql(f"CREATE TABLE commerce.{TABLE} ({columns})"))
    with hook.connect_sql() as conn, conn.begin():
        values = ", ".join(f"({i}, {i}, 'before')" for i in range(1, 1025))
        conn.execute(sql(f"INSERT INTO commerce.{TABLE} (id, n, note) VALUES {values}"))
        have = 1024
        while have < rows:
            add = min(have, rows - have)
            conn.execute(
                sql(
                    f"INSERT INTO commerce.{TABLE} (id, n, note) "
                    f"SELECT id + {have}, n, note FROM commerce.{TABLE} WHERE id <= {add}"
                )
            )
            have += add


def _update_all_in_one_transaction(hook: VitessHook, rows: int) -> None:
    sql = sqlalchemy.text
    with hook.connect_sql() as conn, conn.begin():
        for low in range(0, rows, STATEMENT_ROWS):
            conn.execute(
                sql(f"UPDATE commerce.{TABLE} SET n = n + 1, note = 'after' WHERE id > :low AND id <= :high"),
                {"low": low, "high": low + STATEMENT_ROWS},
            )


def _rows_per_window_since(store: CheckpointStore, seq: int) -> list[tuple[int, int, Any]]:
    """(seq, rows, why it stopped early) of each window committed after window ``seq``."""
    _, last = store.committed(SYNC)
    windows = (store.window(SYNC, s) for s in range(seq + 1, last + 1))
    return [(w.seq, int(w.stats.get("rows") or 0), w.stats.get("stopped_early")) for w in windows]


def test_a_transaction_longer_than_max_seconds_reaches_delta_in_one_window(
    vitess: LocalVitess, spark_connect: str, hook: VitessHook, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    airflow = make_airflow_env(tmp_path / "af", vitess, spark_connect=spark_connect)
    airflow.write_dag("long_txn_dag", DAG_FILE.format(lake=lake, merge_kwargs=CONNECT_MERGE))
    timings: dict[str, float] = {}
    started = time.monotonic()
    _load(hook, ROWS)
    timings["load"] = time.monotonic() - started

    started = time.monotonic()
    first = airflow.run_dag(SYNC)
    timings["snapshot run"] = time.monotonic() - started
    assert first["tasks"]["merge_snapshot"] == "success", first["tasks"]
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    committed_before, snapshot_seq = store.committed(SYNC)
    assert committed_before is not None

    started = time.monotonic()
    _update_all_in_one_transaction(hook, ROWS)
    timings["update"] = time.monotonic() - started

    # Done is "the transaction's rows are in committed windows", not "the sync reached the
    # source's position after the update": the suite's other modules write to this keyspace at
    # the same time, and a window may close at its time bound outside any transaction, before
    # the transaction (having read only their commits) or right after it (before their later
    # ones). CI once failed so: the first run's window read none of it, the second all 400,000
    # rows, stopping two GTIDs short of a position taken after the update. What the fix
    # guarantees is that the window that enters the transaction reads all of it.
    runs = 0
    progress: list[tuple[int, int, Any]] = []
    for runs in (1, 2, 3):
        started = time.monotonic()
        run = airflow.run_dag(SYNC)
        timings[f"catch-up run {runs}"] = time.monotonic() - started
        assert all(run["tasks"][t] == "success" for t in ("catch_up", "merge")), run["tasks"]
        progress = _rows_per_window_since(store, snapshot_seq)
        if max((rows for _, rows, _ in progress), default=0) >= ROWS:
            break
    committed, _ = store.committed(SYNC)
    assert committed is not None
    # The progress moved past the transaction, read whole by one window: before the fix every
    # window ended at its start.
    assert max((rows for _, rows, _ in progress), default=0) >= ROWS, (
        f"after {runs} catch-up runs no window read the transaction whole: windows "
        f"(seq, rows, stopped early) {progress}; timings {timings}"
    )
    assert committed != committed_before
    started = time.monotonic()
    assert_delta_equals_source(hook, "commerce", [TABLE], lake / "delta")
    timings["delta check"] = time.monotonic() - started
    print(f"{ROWS:,} rows, runs needed {runs}, windows {progress}, timings {timings}")
