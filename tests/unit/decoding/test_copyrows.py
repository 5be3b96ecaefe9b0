"""Copy-phase ROW events gathered into blocks (decoding/copyrows.py), on real protobuf messages.

Every test builds ``vtgate.VStreamResponse`` messages as vtgate sends them in a copy phase
(BEGIN, FIELD, one row per ROW event without a timestamp, VGTID with the table's last PK,
COMMIT), serializes them, and compares what the reader makes of the bytes (gathered) with what
it makes of the same responses parsed by protobuf (never gathered: the path before this module).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2
from airflow_provider_vitess.decoding import copyrows, wire
from airflow_provider_vitess.decoding.copyrows import RowBlock
from airflow_provider_vitess.decoding.events import Event, FieldEvent, RowChange, RowEvent, VgtidEvent
from airflow_provider_vitess.decoding.rowwire import locate_rows
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import VStreamReader

E = binlogdata_pb2.VEventType
T = query_pb2.Type
KS = "commerce"
FIELDS = [
    query_pb2.Field(name="id", type=T.INT64, charset=63),
    query_pb2.Field(name="name", type=T.VARCHAR, charset=45),
]


def field(table: str = "t", shard: str = "0") -> binlogdata_pb2.VEvent:
    fe = binlogdata_pb2.FieldEvent(table_name=f"{KS}.{table}", fields=FIELDS, keyspace=KS, shard=shard)
    return binlogdata_pb2.VEvent(type=E.FIELD, field_event=fe, keyspace=KS, shard=shard)


def copy_row(
    i: int, table: str = "t", shard: str = "0", name: str | None = None, **kw: Any
) -> binlogdata_pb2.VEvent:
    """One copied row as vtgate sends it: one row change, no timestamp."""
    text = (name if name is not None else f"name-{i}").encode()
    after = query_pb2.Row(lengths=[len(str(i)), len(text)], values=str(i).encode() + text)
    re_ = binlogdata_pb2.RowEvent(
        table_name=f"{KS}.{table}",
        row_changes=[binlogdata_pb2.RowChange(after=after)],
        keyspace=KS,
        shard=shard,
    )
    return binlogdata_pb2.VEvent(type=E.ROW, row_event=re_, keyspace=KS, shard=shard, **kw)


def vgtid(shard: str = "0", lastpk: int | None = None) -> binlogdata_pb2.VEvent:
    sg = binlogdata_pb2.ShardGtid(keyspace=KS, shard=shard, gtid="MariaDB/0-1-7")
    if lastpk is not None:
        sg.table_p_ks.add(
            table_name="t",
            lastpk=query_pb2.QueryResult(
                fields=[FIELDS[0]],
                rows=[query_pb2.Row(lengths=[len(str(lastpk))], values=str(lastpk).encode())],
            ),
        )
    return binlogdata_pb2.VEvent(
        type=E.VGTID, vgtid=binlogdata_pb2.VGtid(shard_gtids=[sg]), keyspace=KS, shard=shard
    )


def ev(type_: int, shard: str = "0") -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=type_, keyspace=KS, shard=shard)  # type: ignore[arg-type]


def lastpk(table: str = "t") -> binlogdata_pb2.VEvent:
    pk = binlogdata_pb2.TableLastPK(table_name=table)
    return binlogdata_pb2.VEvent(
        type=E.LASTPK, last_p_k_event=binlogdata_pb2.LastPKEvent(table_last_p_k=pk), keyspace=KS, shard="0"
    )


def serialized(*events: binlogdata_pb2.VEvent) -> bytes:
    return vtgate_pb2.VStreamResponse(events=events).SerializeToString()


def gathered(*events: binlogdata_pb2.VEvent) -> Sequence[Any]:
    return copyrows.gather(serialized(*events))


def shape(items: Sequence[Any]) -> list[str]:
    """Each gathered item: ``block:N`` or the event type's name."""
    return [f"block:{i.events}" if isinstance(i, RowBlock) else E.Name(i.type) for i in items]


def read(responses: Sequence[vtgate_pb2.VStreamResponse], as_bytes: bool) -> list[Event]:
    """Every event a VStreamReader yields for these responses (bytes: gathered; parsed: not)."""

    def open_stream(request: vtgate_pb2.VStreamRequest) -> Iterator[vtgate_pb2.VStreamResponse | bytes]:
        for r in responses:
            yield r.SerializeToString() if as_bytes else r

    reader = VStreamReader(open_stream, vgtid=Vgtid.for_keyspace(KS, ""))
    return list(reader.events())


def rows_by_table(events: Sequence[Event]) -> dict[tuple[str, str], list[RowChange]]:
    out: dict[tuple[str, str], list[RowChange]] = {}
    for e in events:
        if isinstance(e, RowEvent):
            out.setdefault((e.table, e.shard), []).extend(e.changes)
    return out


# -- block boundaries --------------------------------------------------------------------------


def test_copy_rows_between_begin_and_vgtid_become_one_block() -> None:
    items = gathered(ev(E.BEGIN), field(), *(copy_row(i) for i in range(5)), vgtid(lastpk=4), ev(E.COMMIT))
    assert shape(items) == ["BEGIN", "FIELD", "block:5", "VGTID", "COMMIT"]
    block = items[2]
    assert (block.keyspace, block.shard, block.timestamp, block.current_time) == (KS, "0", 0, 0)
    # The block is one RowEvent with the five rows, in order, under the same header.
    merged = binlogdata_pb2.RowEvent.FromString(block.row_event)
    assert merged.table_name == f"{KS}.t" and (merged.keyspace, merged.shard) == (KS, "0")
    assert [rc.after.values for rc in merged.row_changes] == [f"{i}name-{i}".encode() for i in range(5)]
    # ... laid out as the columnar stager can prove it (no per-row fallback).
    located = locate_rows([block.row_event], [5], len(FIELDS))
    assert located is not None and located.rows == 5


@pytest.mark.parametrize(
    ("between", "expected"),
    [
        (vgtid(lastpk=2), ["block:3", "VGTID", "block:2"]),
        (lastpk(), ["block:3", "LASTPK", "block:2"]),
        (field(), ["block:3", "FIELD", "block:2"]),
        (ev(E.COMMIT), ["block:3", "COMMIT", "block:2"]),
    ],
)
def test_any_other_event_ends_a_block(between: binlogdata_pb2.VEvent, expected: list[str]) -> None:
    items = gathered(*(copy_row(i) for i in range(3)), between, *(copy_row(i) for i in range(3, 5)))
    assert shape(items) == expected


def test_another_table_or_shard_ends_a_block() -> None:
    items = gathered(
        copy_row(0),
        copy_row(1),
        copy_row(2, table="u"),
        copy_row(3, table="u"),
        copy_row(4, table="u", shard="-80"),
        copy_row(5, table="u", shard="-80"),
        copy_row(6, table="u", shard="-80"),
        copy_row(7, table="t"),
    )
    assert shape(items) == ["block:2", "block:2", "block:3", "ROW"]
    tables = [binlogdata_pb2.RowEvent.FromString(i.row_event) for i in items[:3]]
    assert [(t.table_name, t.shard) for t in tables] == [
        (f"{KS}.t", "0"),
        (f"{KS}.u", "0"),
        (f"{KS}.u", "-80"),
    ]


def test_binlog_rows_with_a_timestamp_are_left_alone() -> None:
    # Catch-up rows (also inside a copy) carry their commit time: never gathered.
    data = serialized(*(copy_row(i, timestamp=1_700_000_000) for i in range(4)))
    items = copyrows.gather(data)
    assert shape(items) == ["ROW"] * 4
    assert [e.SerializeToString() for e in items] == [
        e.SerializeToString() for e in wire.parse_response(data).events
    ]


def test_a_lone_copy_row_and_a_differing_current_time_stay_events() -> None:
    items = gathered(
        ev(E.BEGIN), copy_row(0), vgtid(), copy_row(1, current_time=5), copy_row(2, current_time=6)
    )
    assert shape(items) == ["BEGIN", "ROW", "VGTID", "ROW", "ROW"]


def test_events_that_all_differ_are_proven_at_a_bounded_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each event ends a run at once (its own current time): an attempted run's proof looks at a
    # few events, not at every event left, and after 16 runs of one event the rest pass through.
    compared = [0]
    equal = copyrows._Layout.equal

    def counting(layout: Any, offsets: Any, expected: bytes) -> Any:
        compared[0] += len(offsets)
        return equal(layout, offsets, expected)

    monkeypatch.setattr(copyrows._Layout, "equal", counting)
    events = [copy_row(i, current_time=1_000 + i) for i in range(2_000)]
    items = gathered(*events)
    assert shape(items) == ["ROW"] * 2_000
    assert [e.row_event for e in items] == [e.row_event.SerializeToString() for e in events]
    assert compared[0] <= 2 * 256 * 16  # was 4,001,998: every event left, for each event


def test_a_shared_current_time_after_the_row_event_keeps_the_block() -> None:
    # A nanosecond clock is a 9-byte varint after the row event: the same on every event of
    # the run, it is part of the tail they share, and the block carries it.
    now = 1_764_000_000 * 10**9
    (block,) = gathered(*(copy_row(i, current_time=now) for i in range(3)))
    assert block.events == 3 and block.current_time == now


def test_row_events_across_the_128_byte_varint_boundary_share_a_block() -> None:
    # Row events of 127 bytes and less have a one-byte length in their VEvent, longer ones two.
    names = ["x" * n for n in (1, 90, 95, 100, 105, 300, 2)]
    events = [copy_row(i, name=n) for i, n in enumerate(names)]
    sizes = {len(e.row_event.SerializeToString()) >= 128 for e in events}
    assert sizes == {True, False}
    (block,) = gathered(*events)
    merged = binlogdata_pb2.RowEvent.FromString(block.row_event)
    assert [rc.after.values for rc in merged.row_changes] == [f"{i}{n}".encode() for i, n in enumerate(names)]


# -- through the reader: the same rows, fewer events ---------------------------------------------


def copy_phase() -> list[vtgate_pb2.VStreamResponse]:
    """Two shards' copies interleaved, as vtgate sends them, then the stream's COPY_COMPLETED."""
    out = []
    for batch in range(3):
        for shard in ("-80", "80-"):
            first = batch * 100 + (0 if shard == "-80" else 1000)
            events = [ev(E.BEGIN, shard)]
            if batch == 0:
                events.append(field(shard=shard))
            events += [copy_row(first + i, shard=shard) for i in range(50)]
            events += [vgtid(shard, lastpk=first + 49), ev(E.COMMIT, shard)]
            out.append(vtgate_pb2.VStreamResponse(events=events))
    out.append(vtgate_pb2.VStreamResponse(events=[ev(E.COPY_COMPLETED, ""), ev(E.COPY_COMPLETED, "")]))
    return out


def test_reader_yields_the_same_rows_and_positions_in_blocks() -> None:
    per_event = read(copy_phase(), as_bytes=False)
    blocks = read(copy_phase(), as_bytes=True)
    # Same rows per table and shard, in the same order, decoded to the same values.
    assert rows_by_table(blocks) == rows_by_table(per_event)
    assert sum(len(v) for v in rows_by_table(blocks).values()) == 300
    # One ROW event per copy batch instead of one per row.
    assert sum(isinstance(e, RowEvent) for e in per_event) == 300
    assert sum(isinstance(e, RowEvent) for e in blocks) == 6
    assert all(len(e.changes) == 50 for e in blocks if isinstance(e, RowEvent))

    # Everything else unchanged and in the same place relative to the rows: VGTIDs (with the
    # table last-PKs a resume starts from) still follow exactly the rows they cover.
    def skeleton(events: Sequence[Event]) -> list[Any]:
        out: list[Any] = []
        for e in events:
            if isinstance(e, RowEvent):
                if out and isinstance(out[-1], int):
                    out[-1] += len(e.changes)
                else:
                    out.append(len(e.changes))
            elif isinstance(e, VgtidEvent):
                out.append(e.vgtid.SerializeToString())
            else:
                out.append((type(e).__name__, e.keyspace, e.shard))
        return out

    assert skeleton(blocks) == skeleton(per_event)
    assert sum(isinstance(e, FieldEvent) for e in blocks) == 2
