"""The cross-shard merge releases units in (commit time, shard, position) order, bounded."""

from __future__ import annotations

import random
from typing import Any

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import (
    BeginEvent,
    CommitEvent,
    HeartbeatEvent,
    RowChange,
    RowEvent,
    VgtidEvent,
)
from airflow_provider_vitess.vstream.ordering import ShardMerger, ShardTransaction, TransactionAssembler
from airflow_provider_vitess.vstream.spill import MemoryLimits, SpillableEvents

A, B = ("ks", "-80"), ("ks", "80-")


def unit(key: tuple[str, str], ts: int, rows: int = 1, gtid: str = "") -> ShardTransaction:
    position = binlogdata_pb2.ShardGtid(keyspace=key[0], shard=key[1], gtid=gtid) if gtid else None
    events = SpillableEvents()
    for _ in range(rows):
        events.append(object(), 1)
    return ShardTransaction(key[0], key[1], ts, ts, 0, events, position, rows)


def common(key: tuple[str, str], ts: int) -> dict[str, Any]:
    return {"keyspace": key[0], "shard": key[1], "timestamp": ts, "current_time": 0}


def test_assembler_groups_interleaved_transactions_per_shard() -> None:
    asm = TransactionAssembler()
    row = RowEvent(**common(A, 10), table="t", column_names=("id",), changes=(RowChange(None, (1,)),))
    vg = binlogdata_pb2.VGtid(
        shard_gtids=[binlogdata_pb2.ShardGtid(keyspace="ks", shard="-80", gtid="MariaDB/0-1-5")]
    )
    out = []
    for event in [
        BeginEvent(**common(A, 10)),
        BeginEvent(**common(B, 11)),  # another shard interleaves mid-transaction
        row,
        CommitEvent(**common(B, 11)),
        row,
        VgtidEvent(**common(A, 0), vgtid=vg),
        CommitEvent(**common(A, 10)),
        HeartbeatEvent(**common(("", ""), 12)),
    ]:
        out.extend(asm.push(event))
    b_unit, a_unit = out  # the heartbeat is vtgate's, of no shard: it completes no unit
    assert (b_unit.key, b_unit.rows, b_unit.commit_ts) == (B, 0, 11)
    assert (a_unit.key, a_unit.rows, a_unit.commit_ts) == (A, 2, 10)
    assert list(a_unit.events) == [row, row] and a_unit.position is not None
    assert a_unit.position.gtid == "MariaDB/0-1-5"


def test_merge_waits_for_the_other_shard_then_orders_by_time_then_shard() -> None:
    merger = ShardMerger([A, B])
    assert list(merger.push(unit(B, 5))) == []  # A has said nothing yet: it may still send ts < 5
    released = list(merger.push(unit(A, 5)))
    # Equal times: -80 sorts before 80-; B's unit still waits for A to pass ts 5.
    assert [(u.key, u.order_ts) for u in released] == [(A, 5)]
    released = list(merger.push(unit(A, 7)))
    assert [(u.key, u.order_ts) for u in released] == [(B, 5)]
    assert [(u.key, u.order_ts) for u in merger.drain()] == [(A, 7)]


def test_a_quiet_shard_holds_the_merge_until_its_next_unit_or_its_stop() -> None:
    merger = ShardMerger([A, B])
    assert list(merger.push(unit(A, 100))) == []
    assert list(merger.push(unit(A, 150))) == []  # B may still send a unit of any second >= 0
    assert [u.order_ts for u in merger.push(unit(B, 120))] == [100, 120]
    assert list(merger.push(unit(A, 200))) == []  # B, past 120 only, may still send 130
    assert [u.order_ts for u in merger.mark_done(B)] == [150, 200]


def test_random_interleavings_release_the_same_order_and_positions() -> None:
    rng = random.Random(7)
    per_shard = {
        A: [unit(A, ts, gtid=f"a{i}") for i, ts in enumerate([1, 1, 2, 4, 4, 9])],
        B: [unit(B, ts, gtid=f"b{i}") for i, ts in enumerate([1, 3, 4, 4, 8])],
    }
    orders = set()
    for _ in range(50):
        merger = ShardMerger([A, B])
        queues = {
            k: [unit(u.key, u.commit_ts, gtid=u.position.gtid if u.position else "") for u in v]
            for k, v in per_shard.items()
        }
        released: list[ShardTransaction] = []
        while any(queues.values()):
            key = rng.choice([k for k, q in queues.items() if q])
            released.extend(merger.push(queues[key].pop(0)))
        released.extend(merger.drain())
        orders.add(tuple((u.key, u.position.gtid if u.position else "") for u in released))
        assert merger.stats.spilled_units == 0 and merger.stats.late_units == 0
    (order,) = orders  # every interleaving gives one and the same order
    assert [g for _, g in order] == ["a0", "a1", "b0", "a2", "b1", "a3", "a4", "b2", "b3", "b4", "a5"]


def test_over_the_memory_bound_units_spill_to_disk_and_keep_their_order() -> None:
    merger = ShardMerger([A, B], max_buffered_rows=10)
    first, second = unit(A, 1, rows=6), unit(A, 2, rows=6)
    assert list(merger.push(first)) == []
    assert list(merger.push(second)) == []  # 12 rows > 10: spill, but release nothing early
    assert merger.stats.spilled_units == 1 and merger.buffered_rows <= 10
    assert first.events.spilled  # the largest (first of equal size) went to disk
    released = list(merger.mark_done(B))
    assert [u.order_ts for u in released] == [1, 2]
    assert [len(list(u.events)) for u in released] == [6, 6]


def test_unordered_merge_passes_units_through_in_arrival_order() -> None:
    merger = ShardMerger([A, B], ordered=False)
    assert [u.key for u in merger.push(unit(B, 0, gtid="b"))] == [B]
    assert [u.key for u in merger.push(unit(A, 0, gtid="a"))] == [A]
    assert {k: p.gtid for k, p in merger.released_positions().items()} == {A: "a", B: "b"}


def test_assembler_spills_a_large_transaction_as_it_arrives() -> None:
    asm = TransactionAssembler(MemoryLimits(transaction_rows=3))
    changes = (RowChange(None, (1,)),)
    asm.push(BeginEvent(**common(A, 5)))
    for _ in range(7):
        asm.push(RowEvent(**common(A, 5), table="t", column_names=("id",), changes=changes))
    (done,) = asm.push(CommitEvent(**common(A, 5)))
    assert isinstance(done, ShardTransaction)
    assert done.rows == 7 and done.events.spilled and done.events.memory_rows <= 3
    assert [e.changes[0].after for e in done.events] == [(1,)] * 7


def test_released_positions_never_include_buffered_units() -> None:
    merger = ShardMerger([A, B])
    list(merger.push(unit(A, 1, gtid="a1")))
    list(merger.push(unit(B, 2, gtid="b1")))  # releases A's unit only
    assert {k: p.gtid for k, p in merger.released_positions().items()} == {A: "a1"}
    list(merger.drain())
    assert {k: p.gtid for k, p in merger.released_positions().items()} == {A: "a1", B: "b1"}


def test_times_are_made_monotone_per_shard_and_skew_is_reported() -> None:
    merger = ShardMerger([A, B])
    list(merger.push(unit(A, 10)))
    zero = unit(A, 0)  # copy-phase units carry no time: they keep their shard's order
    list(merger.push(zero))
    assert zero.order_ts == 10 and zero.shard_pos == 1
    list(merger.push(unit(B, 13)))
    assert merger.stats.max_skew_seconds == 3


def test_spilled_events_with_protobuf_fields_read_back_equal() -> None:
    from airflow_provider_vitess._proto import query_pb2
    from airflow_provider_vitess.decoding.events import FieldEvent

    field = FieldEvent(
        **common(A, 1),
        table="t",
        fields=(query_pb2.Field(name="id", type=query_pb2.INT64),),
        column_names=("id",),
    )
    events = SpillableEvents()
    events.append(field)
    events.spill()
    events.append("tail")
    assert list(events) == [field, "tail"]
    events.close()
    assert list(events) == []


def test_row_changes_pickle_to_equal_values() -> None:
    import pickle

    change = RowChange((1, "a"), (1, "b"), frozenset({0, 1}), frozenset({1}))
    assert pickle.loads(pickle.dumps(change)) == change


def test_a_begin_inside_a_transaction_drops_the_cut_partial_one() -> None:
    """After a reconnect vtgate sends the cut transaction again from its BEGIN: the rows that
    came before the cut must not be staged twice."""
    asm = TransactionAssembler()
    first = RowEvent(**common(A, 10), table="t", column_names=("id",), changes=(RowChange(None, (1,)),))
    second = RowEvent(**common(A, 10), table="t", column_names=("id",), changes=(RowChange(None, (2,)),))
    out = []
    for event in [BeginEvent(**common(A, 10)), first]:  # ... cut here, resumed from the last VGTID
        out.extend(asm.push(event))
    for event in [BeginEvent(**common(A, 10)), first, second, CommitEvent(**common(A, 10))]:
        out.extend(asm.push(event))
    (unit,) = out
    assert isinstance(unit, ShardTransaction)
    assert list(unit.events) == [first, second] and unit.rows == 2
    assert asm.discarded_rows == 1
