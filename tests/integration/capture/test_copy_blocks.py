"""Copy-phase rows gathered into blocks (decoding/copyrows.py) against the real vtgate.

The premise of the blocks is how vtgate sends a copy: one row per ROW event, without a
timestamp. If a Vitess upgrade changed that, snapshots would still be right (nothing is
gathered) but slow again: this test says so, and checks that the gathered stream decodes to
exactly the rows the per-event stream does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.decoding.events import CopyCompletedEvent, RowChange, RowEvent
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream.reader import VStreamReader
from airflow_provider_vitess.vstream.window import capture_stop_position, table_filter

pytestmark = pytest.mark.integration

TABLE = "copy_blocks"
ROWS = 3_000


@pytest.fixture
def hook(vitess_conn_id: str) -> Iterator[VitessHook]:
    hook = VitessHook(vitess_conn_id)
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{TABLE}"))
        conn.execute(
            sqlalchemy.text(
                f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(64), "
                "amount DECIMAL(12,2), seen DATETIME(6))"
            )
        )
    for first in range(0, ROWS, 1_000):
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(
                sqlalchemy.text(f"INSERT INTO commerce.{TABLE} VALUES (:id, :name, :amount, :seen)"),
                [
                    {
                        "id": i,
                        "name": "n" * (i % 60),  # row events on both sides of 128 bytes
                        "amount": f"{i}.{i % 100:02d}",
                        "seen": f"2026-01-{i % 28 + 1:02d} 10:00:{i % 60:02d}.{i:06d}",
                    }
                    for i in range(first, min(first + 1_000, ROWS))
                ],
            )
    yield hook
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{TABLE}"))


def copy_rows(hook: VitessHook, open_stream: Callable[..., Iterable[Any]]) -> tuple[list[RowChange], int]:
    """Every copied row and the number of ROW events the reader yielded, until the copy ends."""
    shards = capture_stop_position(lambda r: hook.open_vstream_raw(r, timeout=60), "commerce").shard_gtids
    start = Vgtid(tuple(ShardGtid(sg.keyspace, sg.shard, "") for sg in shards))
    reader = VStreamReader(open_stream, vgtid=start, filter=table_filter([TABLE]))
    rows: list[RowChange] = []
    events = 0
    stream = reader.events()
    try:
        for event in stream:
            if isinstance(event, RowEvent):
                events += 1
                rows.extend(event.changes)
            elif isinstance(event, CopyCompletedEvent) and event.is_stream_complete:
                return rows, events
    finally:
        stream.close()
    raise AssertionError("the copy did not complete")


def test_copy_rows_arrive_in_blocks_and_decode_as_events(hook: VitessHook) -> None:
    per_event, per_event_count = copy_rows(hook, lambda r: hook.open_vstream(r, timeout=60))
    blocks, block_count = copy_rows(hook, lambda r: hook.open_vstream_raw(r, timeout=60))
    # vtgate's copy: one row per ROW event (parsed responses are never gathered)...
    assert len(per_event) == ROWS and per_event_count == ROWS
    # ... gathered from the response bytes into a few blocks, to exactly the same rows.
    assert blocks == per_event
    assert [r.after[0] for r in blocks if r.after is not None] == list(range(ROWS))
    assert block_count <= 10, f"{block_count} ROW events for {ROWS} copied rows: the copy was not gathered"
