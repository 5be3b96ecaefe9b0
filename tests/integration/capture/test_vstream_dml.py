"""DML written through vtgate's MySQL port comes out of VStream exactly (real local Vitess)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import Operation, RowChange, RowEvent, VgtidEvent, VStreamEvent
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import VStreamReader

pytestmark = pytest.mark.integration


def _filter(*tables: str) -> binlogdata_pb2.Filter:
    return binlogdata_pb2.Filter(
        rules=[binlogdata_pb2.Rule(match=t, filter=f"select * from {t}") for t in tables]
    )


def _execute(hook: VitessHook, statements: list[tuple[str, dict[str, object]]]) -> None:
    """Runs the statements in one transaction through vtgate's MySQL port."""
    with hook.connect_sql() as conn, conn.begin():
        for sql, params in statements:
            conn.execute(sqlalchemy.text(sql), params)


def _stream(
    hook: VitessHook, keyspace: str, tables: tuple[str, ...], *, vgtid: Vgtid | None = None
) -> tuple[VStreamReader, Generator[VStreamEvent, None, None]]:
    reader = VStreamReader(
        lambda request: hook.open_vstream(request, timeout=90),
        vgtid=vgtid or Vgtid.for_keyspace(keyspace),
        filter=_filter(*tables),
        flags=hook.vstream_flags(heartbeat_interval=1),
    )
    return reader, reader.events()


def _read_until(
    events: Generator[VStreamEvent, None, None],
    done: Callable[[list[RowEvent]], bool],
    *,
    on_first_vgtid: Callable[[], None] | None = None,
) -> list[RowEvent]:
    rows: list[RowEvent] = []
    started = False
    deadline = time.monotonic() + 60
    for event in events:
        # Start writing only once every shard streams: vtgate's first VGTID may still show
        # "current" for a shard whose stream has not started, which would miss the writes.
        if isinstance(event, VgtidEvent) and not started and "current" not in event.positions().values():
            started = True
            if on_first_vgtid:
                on_first_vgtid()
        if isinstance(event, RowEvent):
            rows.append(event)
            if done(rows):
                return rows
        assert time.monotonic() < deadline, f"stream did not deliver the expected rows; got {rows}"
    raise AssertionError("stream ended early")


def _key(change: RowChange) -> Any:
    """First column of the row's after-image (before-image for deletes)."""
    image = change.after if change.after is not None else change.before
    assert image is not None
    return image[0]


def _shard_of(hook: VitessHook, customer_ids: list[int]) -> dict[int, str]:
    """Which shard holds each row, asked of vtgate by targeting each shard in turn."""
    where: dict[int, str] = {}
    for shard in ("-80", "80-"):
        with hook.connect_sql() as conn:
            conn.execute(sqlalchemy.text(f"USE `customer:{shard}`"))
            for (cid,) in conn.execute(sqlalchemy.text("SELECT customer_id FROM customer")):
                if cid in customer_ids:
                    where[cid] = shard
    return where


def test_sharded_inserts_updates_deletes_come_out_with_images_and_shards(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    ids = list(range(9001, 9011))
    _execute(hook, [("DELETE FROM customer.customer WHERE customer_id BETWEEN 9001 AND 9010", {})])

    def workload() -> None:
        # One multi-row transaction spanning both shards, then an update and a delete.
        _execute(
            hook,
            [
                (
                    "INSERT INTO customer.customer (customer_id, email) VALUES (:id, :email)",
                    {"id": i, "email": f"c{i}@example.com"},
                )
                for i in ids
            ],
        )
        _execute(
            hook,
            [("UPDATE customer.customer SET email = :e WHERE customer_id = :id", {"e": "new😀", "id": 9003})],
        )
        _execute(hook, [("DELETE FROM customer.customer WHERE customer_id = :id", {"id": 9004})])

    reader, events = _stream(hook, "customer", ("customer",))

    def done(rows: list[RowEvent]) -> bool:
        # Shards stream independently: the delete on one shard can arrive before the other
        # shard's inserts, so wait for every expected event, not just the last one written.
        seen = {(c.operation, _key(c)) for r in rows for c in r.changes}
        expected = {(Operation.INSERT, i) for i in ids} | {(Operation.UPDATE, 9003), (Operation.DELETE, 9004)}
        return expected <= seen

    rows = _read_until(events, done, on_first_vgtid=workload)
    events.close()

    shards = _shard_of(hook, ids)
    assert set(shards.values()) == {"-80", "80-"}, "the workload must touch both shards"
    inserts = {
        _key(c): (r.shard, c.after) for r in rows for c in r.changes if c.operation is Operation.INSERT
    }
    assert sorted(inserts) == ids
    for cid, (shard, after) in inserts.items():
        assert after == (cid, f"c{cid}@example.com")
        # 9004 is deleted by the end, so only check shards of rows that still exist.
        if cid in shards:
            assert shard == shards[cid], f"row {cid} streamed from shard {shard}, lives in {shards[cid]}"
    updates = [c for r in rows for c in r.changes if c.operation is Operation.UPDATE]
    assert [(u.before, u.after) for u in updates] == [((9003, "c9003@example.com"), (9003, "new😀"))]
    deletes = [c for r in rows for c in r.changes if c.operation is Operation.DELETE]
    assert [(d.before, d.after) for d in deletes] == [((9004, "c9004@example.com"), None)]
    assert all(r.keyspace == "customer" and r.table == "customer" for r in rows)
    assert reader.last_vgtid is not None
    assert {sg.shard for sg in reader.last_vgtid.shard_gtids} == {"-80", "80-"}


def test_unsharded_keyspace_streams_binary_keys_and_updates(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    _execute(hook, [("DELETE FROM commerce.product WHERE sku LIKE :p", {"p": "it-%"})])

    def workload() -> None:
        _execute(
            hook,
            [
                (
                    "INSERT INTO commerce.product (sku, description, price) VALUES (:s, :d, :p)",
                    {"s": b"it-1", "d": "first", "p": 10},
                ),
                (
                    "INSERT INTO commerce.product (sku, description, price) VALUES (:s, :d, :p)",
                    {"s": b"it-2", "d": None, "p": -5},
                ),
            ],
        )
        _execute(hook, [("UPDATE commerce.product SET price = price + 1 WHERE sku = :s", {"s": b"it-1"})])
        _execute(hook, [("DELETE FROM commerce.product WHERE sku = :s", {"s": b"it-2"})])

    _, events = _stream(hook, "commerce", ("product",))
    rows = _read_until(
        events,
        lambda rs: any(c.operation is Operation.DELETE for r in rs for c in r.changes),
        on_first_vgtid=workload,
    )
    events.close()
    changes = [(r.shard, c.operation, c.before, c.after) for r in rows for c in r.changes]
    assert changes == [
        ("0", Operation.INSERT, None, (b"it-1", "first", 10)),
        ("0", Operation.INSERT, None, (b"it-2", None, -5)),
        ("0", Operation.UPDATE, (b"it-1", "first", 10), (b"it-1", "first", 11)),
        ("0", Operation.DELETE, (b"it-2", None, -5), None),
    ]
    # The two inserts were one transaction: one ROW event group between BEGIN and COMMIT.
    assert rows[0].timestamp == rows[1].timestamp


def test_cut_stream_resumes_from_last_vgtid_without_loss(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    ids = list(range(20001, 20201))
    _execute(hook, [("DELETE FROM customer.corder WHERE order_id BETWEEN 20001 AND 20200", {})])
    batches = [ids[i : i + 10] for i in range(0, len(ids), 10)]

    def workload() -> None:
        for batch in batches:
            _execute(
                hook,
                [
                    (
                        "INSERT INTO customer.corder (order_id, customer_id, sku, price) "
                        "VALUES (:o, :c, :s, :p)",
                        {"o": o, "c": o % 97, "s": b"sku", "p": o},
                    )
                    for o in batch
                ],
            )

    reader, events = _stream(hook, "customer", ("corder",))
    first = _read_until(events, lambda rs: sum(len(r.changes) for r in rs) >= 95, on_first_vgtid=workload)
    events.close()  # the cut: mid-way through the workload's transactions
    resume_from = reader.last_vgtid
    assert resume_from is not None
    seen_first = [_key(c) for r in first for c in r.changes]

    _, events2 = _stream(hook, "customer", ("corder",), vgtid=Vgtid.from_proto(resume_from))
    second = _read_until(
        events2,
        lambda rs: set(ids) <= set(seen_first) | {_key(c) for r in rs for c in r.changes},
    )
    events2.close()
    seen_second = [_key(c) for r in second for c in r.changes]

    assert set(seen_first) | set(seen_second) == set(ids), "an event was lost across the cut"
    duplicates = set(seen_first) & set(seen_second)
    # Only rows after the last VGTID before the cut may come twice: at most the transactions
    # in flight at the cut, one per shard, each a subset of one workload transaction.
    in_flight = [b for b in batches if duplicates & set(b)]
    assert len(in_flight) <= 2, f"duplicates span {len(in_flight)} transactions: {sorted(duplicates)}"
    assert len(seen_second) == len(set(seen_second)), "the resumed stream repeated a row itself"
