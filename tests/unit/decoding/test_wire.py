"""Response bytes read through decoding/wire.py's views: same events as parsed responses, ROW
events kept exactly as sent, and clear errors for bytes that are not what they claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.decoding import wire
from airflow_provider_vitess.decoding.events import EventDecoder, FieldEvent, RawRows, RowEvent
from airflow_provider_vitess.exceptions import VStreamError
from airflow_provider_vitess.staging.parts_check import read_table
from airflow_provider_vitess.staging.writer import WindowStager
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import VStreamReader
from tests.support.vevents import KS, E, ev, ev_field, ev_row, ev_vgtid, qrow, resp, vgtid


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (number < 16, payload < 128 bytes)."""
    assert number < 16 and len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def _stream_of(*events: bytes) -> bytes:
    """A VStreamResponse of already serialized VEvents."""
    return b"".join(_field(1, e) for e in events)


def test_view_events_are_the_real_messages_but_row_event() -> None:
    response = resp(ev_field(), ev_row((None, qrow(b"1", b"a", None))), ev_vgtid("MySQL56/a:1"))
    field, row, position = wire.parse_response(response.SerializeToString()).events
    assert type(field.field_event) is binlogdata_pb2.FieldEvent
    assert field.field_event == response.events[0].field_event
    assert type(position.vgtid) is binlogdata_pb2.VGtid and position.vgtid == vgtid("MySQL56/a:1")
    assert row.type == E.ROW and row.row_event == response.events[1].row_event.SerializeToString()
    header = wire.parse_row_event_header(row.row_event)
    assert (header.table_name, header.keyspace, header.shard, len(header.row_changes)) == (
        "customer.customer",
        KS,
        "0",
        1,
    )
    assert wire.to_vevent(row) == response.events[1]


def test_row_event_bytes_are_kept_as_sent_and_decode_and_stage_alike(tmp_path: Path) -> None:
    """Another serializer may order fields differently: the reader keeps its bytes, and the
    rows read and stage the same."""
    changes = [
        binlogdata_pb2.RowChange(after=qrow(b"1", "é😀".encode(), b'{"a": 1}')),
        binlogdata_pb2.RowChange(before=qrow(b"2", b"old", None), after=qrow(b"2", b"new", None)),
        binlogdata_pb2.RowChange(before=qrow(b"3", None, None)),
    ]
    # keyspace and shard first, table name last: a valid RowEvent no protobuf runtime here writes.
    odd_order = (
        _field(3, KS.encode())
        + _field(4, b"0")
        + b"".join(_field(2, c.SerializeToString()) for c in changes)
        + _field(1, b"customer.customer")
    )
    row_vevent = ev(E.ROW, keyspace=KS, shard="0", timestamp=9)
    row_bytes = row_vevent.SerializeToString() + _field(5, odd_order)
    data = _stream_of(ev_field().SerializeToString(), row_bytes)

    field, row = VStreamReader(lambda _: iter([data]), vgtid=vgtid("MySQL56/start")).events()
    canonical = EventDecoder()
    canonical.decode(ev_field())
    images = [
        (c.before if c.HasField("before") else None, c.after if c.HasField("after") else None)
        for c in changes
    ]
    expected = canonical.decode(ev_row(*images))
    assert isinstance(field, FieldEvent) and isinstance(row, RowEvent) and isinstance(expected, RowEvent)
    assert isinstance(row.changes, RawRows) and row.changes.data == odd_order
    assert (row.table, row.keyspace, row.shard, row.timestamp, len(row.changes)) == (
        "customer",
        KS,
        "0",
        9,
        3,
    )
    assert tuple(row.changes) == tuple(expected.changes)
    assert tuple(row.changes)[1].after == (2, "new", None)

    staged = []
    for i, changes_ in enumerate((row.changes, expected.changes)):
        stager = WindowStager(str(tmp_path / str(i)), "wire", 1, key_columns={"customer": ["id"]})
        stager.set_schema(KS, "customer", field.fields, shard="0")
        stager.add_rows(KS, "customer", "0", 9, 1, changes_)
        position = Vgtid.for_keyspace(KS, "current")
        table = read_table(stager.finish(position, position, position), "customer").sort_by("_seq")
        staged.append(table.drop_columns([c for c in table.column_names if c.startswith("_")]).to_pylist())
    assert staged[0] == staged[1]
    assert [(r["id"], r["email"]) for r in staged[0]] == [(1, "é😀"), (2, "new"), (None, None)]


def test_bytes_that_are_not_a_response_name_the_stream() -> None:
    reader = VStreamReader(lambda _: iter([b"\x0a\xff\xff\xff"]), vgtid=vgtid("MySQL56/start"))
    with pytest.raises(
        VStreamError, match="keyspace customer: vtgate sent a response \\(4 bytes\\) that is not"
    ):
        list(reader.events())


def test_row_event_bytes_that_are_not_a_row_event_are_refused() -> None:
    broken = ev(E.ROW, keyspace=KS, shard="-80").SerializeToString() + _field(5, b"\x0a\x7f")
    data = _stream_of(ev_field(shard="-80").SerializeToString(), broken)
    reader = VStreamReader(lambda _: iter([data]), vgtid=vgtid("MySQL56/start"))
    with pytest.raises(
        VStreamError, match=r"keyspace 'customer', shard '-80': its 2 bytes are not a binlogdata\.RowEvent"
    ):
        list(reader.events())


def test_views_do_not_touch_other_fields_of_the_field_event() -> None:
    # Fields the view copies from VEvent carry the upstream numbers: a FIELD event's columns
    # (query.Field) come through whole.
    fields = [query_pb2.Field(name="id", type=query_pb2.Type.INT64, column_length=20, flags=49667)]
    fe = binlogdata_pb2.FieldEvent(table_name="customer.t", fields=fields, keyspace=KS, shard="0")
    (view,) = wire.parse_response(
        resp(ev(E.FIELD, field_event=fe, current_time=5)).SerializeToString()
    ).events
    assert view.field_event.fields[0] == fields[0] and view.current_time == 5
