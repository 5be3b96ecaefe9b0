"""The columnar staging path against the per-row decoder, value for value.

Every vectorised conversion (``staging/columnar.py``) must give exactly what the per-row
decoder (``decoding/values.py``) followed by ``pa.array`` gives, or fall back to it; and the
layout proof (``decoding/rowwire.py``) must refuse what it cannot read. The tests compare the
two paths on edge values, and check that the fast path really was taken where it should be.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.decoding.events import EventDecoder, FieldEvent, Operation, RawRows, RowEvent
from airflow_provider_vitess.decoding.rowwire import locate_rows
from airflow_provider_vitess.decoding.values import RowDecoder, converter_for
from airflow_provider_vitess.exceptions import StagingError, ValueDecodeError
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.staging.columnar import ColumnPlan
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.spill import SpillableEvents

T = query_pb2.Type
E = binlogdata_pb2.VEventType
UTF8MB4, LATIN1, BINARY = 45, 8, 63
KS = "customer"
POS = Vgtid.from_json(
    '[{"keyspace":"customer","shard":"-80","gtid":"MySQL56/a2cd2e7c-aa2a-11ee-8000-000000000001:1-5"}]'
)

Text = bytes | None


def fld(name: str, type_: int, **kw: Any) -> query_pb2.Field:
    return query_pb2.Field(name=name, type=T.Name(type_), **kw)


def row(*values: Text) -> query_pb2.Row:
    return query_pb2.Row(
        lengths=[-1 if v is None else len(v) for v in values], values=b"".join(v for v in values if v)
    )


def binary_column(values: Sequence[Text]) -> tuple[pa.Array, np.ndarray]:
    return pa.array(values, pa.binary()), np.array([-1 if v is None else len(v) for v in values])


def expected(field: query_pb2.Field, values: Sequence[Text]) -> list[Any]:
    convert = converter_for(field)
    return [None if v is None else convert(v) for v in values]


def as_python(field: query_pb2.Field, array: pa.Array) -> list[Any]:
    out: list[Any] = array.to_pylist()
    if field.type == T.TIMESTAMP:  # Arrow gives aware UTC datetimes; the decoder naive UTC ones
        out = [None if v is None else v.replace(tzinfo=None) for v in out]
    return out


def describe(row: int) -> str:
    return f"row {row}"


class NoFallback(ColumnPlan):
    """A plan whose per-row path fails the test: proves the vectorised path was taken."""

    def per_row(self, column: pa.Array, describe: Any) -> pa.Array:
        raise AssertionError(f"column {self.name!r} fell back to the per-row decoder")


# field, values the vectorised path must convert itself (and equal the decoder's)
FAST: list[tuple[query_pb2.Field, list[Text]]] = [
    (fld("i64", T.INT64), [b"-9223372036854775808", b"9223372036854775807", b"0", b"-1", None, b"007"]),
    (fld("u64", T.UINT64, flags=32), [b"18446744073709551615", b"0", None, b"9223372036854775808"]),
    (fld("i8", T.INT8), [b"-128", b"127", b"0"]),
    (fld("u8", T.UINT8, flags=32), [b"255", b"0"]),
    (fld("i16", T.INT16), [b"-32768", b"32767"]),
    (fld("u16", T.UINT16), [b"65535"]),
    (fld("i24", T.INT24), [b"-8388608", b"8388607"]),
    (fld("u24", T.UINT24), [b"16777215"]),
    (fld("i32", T.INT32), [b"-2147483648", b"2147483647", None]),
    (fld("u32", T.UINT32), [b"4294967295"]),
    (fld("year", T.YEAR), [b"2024", b"1901", b"2155", b"0000"]),
    (
        fld("dec", T.DECIMAL, column_type="decimal(10,2)"),
        [b"-12345678.90", b"0.00", b"-0.01", b"99999999.99", b"-99999999.99", None, b"5.10"],
    ),
    (fld("dec0", T.DECIMAL, column_type="decimal(18,0)"), [b"-999999999999999999", b"0", b"42"]),
    (
        fld("dec38", T.DECIMAL, column_type="decimal(38,10)"),
        [b"9999999999999999999999999999.9999999999", b"-0.0000000001"],
    ),
    (
        fld("dec65", T.DECIMAL, column_type="decimal(65,30)"),
        [
            b"12345678901234567890123456789012345.123456789012345678901234567890",
            b"-99999999999999999999999999999999999.999999999999999999999999999999",
            b"0.000000000000000000000000000001",
            None,
        ],
    ),
    (fld("d", T.DATE), [b"2024-02-29", b"0001-01-01", b"9999-12-31", None, b"1970-01-01"]),
    *[
        (
            fld(f"dt{p}", T.DATETIME, column_type=f"datetime({p})" if p else "datetime", decimals=p),
            [
                b"2024-02-29 23:59:59" + (b"." + b"123456"[:p] if p else b""),
                b"0001-01-01 00:00:00" + (b"." + b"0" * p if p else b""),
                b"9999-12-31 23:59:59" + (b"." + b"9" * p if p else b""),
                None,
            ],
        )
        for p in range(7)
    ],
    (
        fld("ts6", T.TIMESTAMP, column_type="timestamp(6)", decimals=6),
        [b"1970-01-01 00:00:01.000000", b"2038-01-19 03:14:07.999999", None],
    ),
    (fld("ts0", T.TIMESTAMP, column_type="timestamp"), [b"2024-06-01 12:00:00"]),
    (
        fld("name", T.VARCHAR, charset=UTF8MB4),
        [b"", b"a", "😀🐬".encode(), "naïve".encode(), b"a\x00b", None, "\U0010ffff".encode()],
    ),
    (fld("l1", T.VARCHAR, charset=LATIN1), [b"plain ascii", "caf\u00e9".encode()]),
    (fld("txt_bin", T.VARBINARY, charset=46), ["κλειδί".encode(), b""]),  # utf8mb4_bin
    (fld("json", T.JSON, charset=UTF8MB4), [b'{"k": [1, 2]}', None]),
    (fld("enum", T.ENUM, charset=UTF8MB4), [b"small", b""]),
    (fld("set", T.SET, charset=UTF8MB4), [b"a,b", b""]),
    (fld("blob", T.BLOB, charset=BINARY), [b"\x00\xff\x10", b"", None, bytes(range(256))]),
    (fld("char_bin", T.CHAR, charset=BINARY), [b"\x00\x01"]),
    (fld("bit", T.BIT, charset=BINARY), [b"\x05", b"\x00\x00"]),
    (fld("geo", T.GEOMETRY, charset=BINARY), [b"\x00\x00\x00\x00\x01\x01"]),
]

# field, values outside the vectorised shapes: the per-row path gives the answer
FALLBACK: list[tuple[query_pb2.Field, list[Text]]] = [
    (fld("i64", T.INT64), [b"+5", b"1"]),  # int() reads "+5"; the fast path is not sure of it
    (fld("i64b", T.INT64), [b" 7", b"1"]),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"1E+2", b"1.00"]),
    (fld("dec_e", T.DECIMAL, column_type="decimal(10,2)"), [b"1e2"]),  # Arrow reads it too: not trusted
    (fld("dec2", T.DECIMAL, column_type="decimal(10,2)"), [b"+1.5", b".5"]),
    (
        fld("dt", T.DATETIME, column_type="datetime(6)", decimals=6),
        [b"2024-01-01 00:00:00.5", b"2024-01-01 00:00:00"],
    ),
    (fld("dt_t", T.DATETIME), [b"2024-01-01T01:02:03"]),
    (fld("dt_short", T.DATETIME), [b"2024-1-2 3:04:05"]),
    (fld("l1", T.VARCHAR, charset=LATIN1), [b"caf\xe9", b"\x80uro"]),  # latin1 bytes of the binlog
    (fld("time", T.TIME), [b"838:59:59", b"-00:00:01.500000", b"00:00:00", None]),
    (fld("f32", T.FLOAT32), [b"0.1", b"3.4028235e38", None]),
    (fld("f64", T.FLOAT64), [b"0.1", b"-1.7976931348623157e308"]),
    (fld("f64d", T.FLOAT64, column_type="double(10,3)"), [b"1.2345"]),
    (fld("hexnum", T.HEXNUM), [b"0x1F"]),
    (fld("bitnum", T.BITNUM), [b"0b101"]),
    (fld("null", T.NULL_TYPE), [None, None]),
]

# field, values neither path can stage: both must fail, with the per-row path's error
FAILING: list[tuple[query_pb2.Field, list[Text], type[Exception], str]] = [
    (fld("i64", T.INT64), [b"0x1F"], ValueDecodeError, "column 'i64' \\(INT64\\): cannot decode b'0x1F'"),
    (fld("i64", T.INT64), [b"0x10"], ValueDecodeError, "cannot decode b'0x10'"),  # Arrow reads it as 16
    (fld("i64", T.INT64), [b"5-"], ValueDecodeError, "cannot decode b'5-'"),
    (fld("i64", T.INT64), [b"--5"], ValueDecodeError, "cannot decode b'--5'"),
    (fld("i64", T.INT64), [b"-"], ValueDecodeError, "cannot decode b'-'"),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"1-2"], ValueDecodeError, "cannot decode"),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"."], ValueDecodeError, "cannot decode"),
    (fld("i64", T.INT64), [b""], ValueDecodeError, "cannot decode b''"),
    (fld("i64", T.INT64), [b"9223372036854775808"], StagingError, "cannot stage value 9223372036854775808"),
    (fld("i8", T.INT8), [b"128"], StagingError, "cannot stage value 128"),
    (fld("u64", T.UINT64), [b"-1"], StagingError, "cannot stage value -1"),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"1.234"], StagingError, "1.234"),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"123456789.00"], StagingError, "123456789"),
    (fld("dec", T.DECIMAL, column_type="decimal(10,2)"), [b"1.2.3"], ValueDecodeError, "cannot decode"),
    # Zero and invalid dates: what the zero-date policy says, see test_zero_dates.py.
    (
        fld("name", T.VARCHAR, charset=UTF8MB4),
        [b"\xed\xa0\x80"],
        ValueDecodeError,
        "cannot decode",
    ),  # surrogate
    (fld("name", T.VARCHAR, charset=UTF8MB4), [b"\xc0\x80"], ValueDecodeError, "cannot decode"),  # overlong
    (fld("name", T.VARCHAR, charset=UTF8MB4), [b"\xf4\x90\x80\x80"], ValueDecodeError, "cannot decode"),
    (fld("name", T.VARCHAR, charset=UTF8MB4), [b"ok", b"\xe2\x82"], ValueDecodeError, "cannot decode"),
]


@pytest.mark.parametrize(("field", "values"), FAST, ids=[f.name for f, _ in FAST])
def test_vectorised_conversion_equals_the_per_row_decoder(field: query_pb2.Field, values: list[Text]) -> None:
    column, lengths = binary_column(values)
    out = NoFallback(field, "t").convert(column, lengths, describe)
    assert out.type == ColumnPlan(field, "t").arrow_type
    assert as_python(field, out) == expected(field, values)
    # And Arrow holds the same values as when it converts the decoded Python values.
    assert out.equals(pa.array(expected(field, values), out.type))


@pytest.mark.parametrize(("field", "values"), FALLBACK, ids=[f.name for f, _ in FALLBACK])
def test_values_outside_the_fast_shapes_take_the_per_row_decoder(
    field: query_pb2.Field, values: list[Text]
) -> None:
    column, lengths = binary_column(values)
    with pytest.raises(AssertionError, match="fell back"):
        NoFallback(field, "t").convert(column, lengths, describe)
    out = ColumnPlan(field, "t").convert(column, lengths, describe)
    assert as_python(field, out) == expected(field, values)


@pytest.mark.parametrize(
    ("field", "values", "error", "match"), FAILING, ids=[f"{f.name}-{v[-1]!r}" for f, v, _, _ in FAILING]
)
def test_values_neither_path_stages_fail_like_the_per_row_path(
    field: query_pb2.Field, values: list[Text], error: type[Exception], match: str
) -> None:
    column, lengths = binary_column(values)
    with pytest.raises(error, match=match):
        ColumnPlan(field, "t").convert(column, lengths, describe)


# -- the whole path: serialized ROW events -> Parquet, against decoded rows --------------------

MATRIX = [
    fld("id", T.INT64, flags=1 | 2, column_type="bigint"),
    fld("u", T.UINT64, flags=32, column_type="bigint unsigned"),
    fld("name", T.VARCHAR, charset=UTF8MB4, column_type="varchar(64)"),
    fld("price", T.DECIMAL, column_type="decimal(10,2)"),
    fld("big", T.DECIMAL, column_type="decimal(65,30)"),
    fld("at", T.DATETIME, column_type="datetime(6)", decimals=6),
    fld("ts", T.TIMESTAMP, column_type="timestamp(3)", decimals=3),
    fld("day", T.DATE),
    fld("dur", T.TIME),
    fld("f", T.FLOAT32),
    fld("blob", T.BLOB, charset=BINARY),
    fld("l1", T.VARCHAR, charset=LATIN1),
]


def matrix_row(i: int, *, long: bool = False) -> tuple[Text, ...]:
    return (
        str(i).encode(),
        str(2**64 - 1 - i).encode(),
        None if i % 7 == 3 else (f"name-{i}-" + "😀" * (i % 3) + ("x" * 300 if long else "")).encode(),
        f"{-i if i % 2 else i}.{i % 100:02d}".encode(),
        None if i % 5 == 0 else f"-{i}.{i:030d}".encode()[:67],
        f"2024-02-{i % 28 + 1:02d} {i % 24:02d}:{i % 60:02d}:{i % 60:02d}.{i * 7919 % 10**6:06d}".encode(),
        f"2001-09-09 01:46:{i % 60:02d}.{i % 1000:03d}".encode(),
        f"{1000 + i:04d}-01-01".encode(),
        f"-{i % 839}:{i % 60:02d}:00".encode(),
        f"{i}.25".encode(),
        bytes([i % 256]) * (i % 4) + (b"\x00" * 20000 if long else b""),
        f"caf{chr(0xE9)}-{i}".encode("latin-1" if i % 2 else "utf-8"),
    )


def field_event(fields: Sequence[query_pb2.Field], shard: str) -> binlogdata_pb2.VEvent:
    fe = binlogdata_pb2.FieldEvent(table_name=f"{KS}.t", fields=list(fields), keyspace=KS, shard=shard)
    return binlogdata_pb2.VEvent(type=E.FIELD, field_event=fe, keyspace=KS, shard=shard)


def row_event(
    changes: Sequence[tuple[query_pb2.Row | None, query_pb2.Row | None]], shard: str
) -> binlogdata_pb2.VEvent:
    re_ = binlogdata_pb2.RowEvent(table_name=f"{KS}.t", keyspace=KS, shard=shard)
    for before, after in changes:
        rc = re_.row_changes.add()
        if before is not None:
            rc.before.CopyFrom(before)
        if after is not None:
            rc.after.CopyFrom(after)
    return binlogdata_pb2.VEvent(type=E.ROW, row_event=re_, keyspace=KS, shard=shard, timestamp=1700000000)


def stage_both(
    tmp_path: Path, fields: Sequence[query_pb2.Field], events: list[binlogdata_pb2.VEvent], **kw: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events staged through add_rows (serialized) and through add_change (decoded)."""
    outputs = []
    for window, raw in ((1, True), (2, False)):
        decoder = EventDecoder()
        s = WindowStager(str(tmp_path), "sync", window, key_columns={"t": ["id"]}, **kw)
        seq = 0
        for vevent in events:
            event = decoder.decode(vevent)
            if isinstance(event, FieldEvent):
                s.set_schema(KS, "t", fields, shard=vevent.shard)
                continue
            assert isinstance(event, RowEvent)
            assert isinstance(event.changes, RawRows)
            if raw:
                s.add_rows(KS, "t", event.shard, event.timestamp, seq + 1, event.changes)
                seq += len(event.changes)
            else:
                for change in event.changes:
                    seq += 1
                    s.add_change(
                        KS,
                        "t",
                        event.shard,
                        change.operation,
                        event.timestamp,
                        seq,
                        change.before,
                        change.after,
                    )
        manifest = s.finish(POS, POS, POS)
        outputs.append(read_table(manifest, "t").to_pylist())
    return outputs[0], outputs[1]


def test_row_events_stage_like_decoded_rows(tmp_path: Path) -> None:
    rows = [row(*matrix_row(i)) for i in range(1, 301)]
    events = [
        field_event(MATRIX, "-80"),
        field_event(MATRIX, "80-"),
        row_event([(None, r) for r in rows[:100]], "-80"),
        row_event([(None, r) for r in rows[100:150]], "80-"),  # another shard in the same batch
        row_event([(rows[i], rows[i + 1]) for i in range(150, 200)], "-80"),  # updates
        row_event([(r, None) for r in rows[200:230]], "80-"),  # deletes
        row_event([(None, r) for r in rows[230:300]], "-80"),
    ]
    raw, decoded = stage_both(tmp_path, MATRIX, events)
    assert len(raw) == 300
    assert raw == decoded
    ops = [r["_op"] for r in raw]
    assert ops == ["insert"] * 150 + ["update"] * 50 + ["delete"] * 30 + ["insert"] * 70
    assert [r["_seq"] for r in raw] == list(range(1, 301))
    assert raw[150]["_before_id"] == 151 and raw[150]["id"] == 152
    assert raw[200]["id"] is None and raw[200]["_before_id"] == 201
    # Spot-check values against the decoder directly, not only against the other path.
    want = RowDecoder(MATRIX).decode(rows[0])
    got = tuple(raw[0][f.name] for f in MATRIX)
    ts = want[6]
    assert isinstance(ts, datetime.datetime)
    assert got[:6] == want[:6] and got[6] == ts.replace(tzinfo=datetime.timezone.utc) and got[7:] == want[7:]


def test_multibyte_varints_and_large_values(tmp_path: Path) -> None:
    """Lengths of 64+ bytes and rows over 16 KiB take multi-byte varints at every level."""
    rows = [row(*matrix_row(i, long=True)) for i in range(1, 21)]
    events = [field_event(MATRIX, "-80"), row_event([(None, r) for r in rows], "-80")]
    raw, decoded = stage_both(tmp_path, MATRIX, events)
    assert raw == decoded and len(raw[0]["blob"]) == 20001


def test_mixed_and_partial_events_take_the_per_row_decoder(tmp_path: Path) -> None:
    rows = [row(*matrix_row(i)) for i in range(1, 41)]
    mixed = row_event([(None, rows[0]), (rows[1], None), (rows[2], rows[3])], "-80")
    partial = row_event([(None, rows[4])], "-80")
    bitmap = binlogdata_pb2.RowChange.Bitmap(count=len(MATRIX), cols=b"\xff\x0f")
    partial.row_event.row_changes[0].data_columns.CopyFrom(bitmap)
    events = [
        field_event(MATRIX, "-80"),
        row_event([(None, r) for r in rows[10:20]], "-80"),
        mixed,
        partial,
        row_event([(None, r) for r in rows[20:40]], "-80"),
    ]
    raw, decoded = stage_both(tmp_path, MATRIX, events)
    assert raw == decoded
    assert [r["_op"] for r in raw[10:14]] == ["insert", "delete", "update", "insert"]


def test_malformed_rows_fail_with_the_per_row_decoders_error(tmp_path: Path) -> None:
    fields = [fld("a", T.INT64), fld("b", T.INT64)]
    for bad, match in (
        (query_pb2.Row(lengths=[1], values=b"1"), "row has 1 values but the table has 2 columns"),
        (query_pb2.Row(lengths=[1, 1], values=b"123"), "lengths add up to 2 bytes but the row has 3"),
    ):
        decoder = EventDecoder()
        decoder.decode(field_event(fields, "-80"))
        event = decoder.decode(row_event([(None, row(b"1", b"2")), (None, bad)], "-80"))
        assert isinstance(event, RowEvent)
        s = WindowStager(str(tmp_path / match[:5]), "sync", 1)
        s.set_schema(KS, "t", fields, shard="-80")
        s.add_rows(KS, "t", "-80", 1, 1, event.changes)
        with pytest.raises(ValueDecodeError, match=match):
            s.finish(POS, POS, POS)


def test_decoded_and_raw_rows_keep_their_order(tmp_path: Path) -> None:
    fields = [fld("id", T.INT64)]
    decoder = EventDecoder()
    decoder.decode(field_event(fields, "-80"))
    s = WindowStager(str(tmp_path), "sync", 1)
    s.set_schema(KS, "t", fields, shard="-80")
    s.add_change(KS, "t", "-80", Operation.INSERT, 1, 1, None, (1,))
    event = decoder.decode(row_event([(None, row(b"2")), (None, row(b"3"))], "-80"))
    assert isinstance(event, RowEvent)
    s.add_rows(KS, "t", "-80", 1, 2, event.changes)
    s.add_rows(KS, "t", "-80", 1, 4, event.changes[:1])  # a plain sequence: row by row
    s.add_change(KS, "t", "-80", Operation.INSERT, 1, 5, None, (5,))
    table = read_table(s.finish(POS, POS, POS), "t")
    assert table.column("_seq").to_pylist() == [1, 2, 3, 4, 5]
    assert table.column("id").to_pylist() == [1, 2, 3, 2, 5]


def test_small_batches_and_row_groups_stay_equal(tmp_path: Path) -> None:
    """Tiny size bounds: many conversions and row groups, same rows."""
    rows = [row(*matrix_row(i)) for i in range(1, 401)]
    events = [field_event(MATRIX, "-80")] + [
        row_event([(None, r) for r in rows[i : i + 25]], "-80") for i in range(0, 400, 25)
    ]
    raw, decoded = stage_both(tmp_path, MATRIX, events, row_group_bytes=4096)
    assert len(raw) == 400 and raw == decoded


# -- events carry serialized rows --------------------------------------------------------------


def test_row_events_decode_lazily_and_pickle_as_bytes() -> None:
    fields = [fld("id", T.INT64), fld("name", T.VARCHAR, charset=UTF8MB4)]
    decoder = EventDecoder()
    decoder.decode(field_event(fields, "-80"))
    event = decoder.decode(row_event([(None, row(b"1", b"a")), (row(b"1", b"a"), None)], "-80"))
    assert isinstance(event, RowEvent) and isinstance(event.changes, RawRows)
    assert len(event.changes) == 2
    events = SpillableEvents()
    events.append(event, 2)
    events.spill()
    (back,) = list(events)
    assert isinstance(back.changes, RawRows) and back.changes.data == event.changes.data
    assert [(c.before, c.after) for c in back.changes] == [(None, (1, "a")), ((1, "a"), None)]
    assert back == event
    assert pickle.loads(pickle.dumps(event.changes.decoder)).decode(row(b"7", None)) == (7, None)


def test_locate_rows_refuses_what_it_cannot_prove() -> None:
    def serialized(*changes: tuple[query_pb2.Row | None, query_pb2.Row | None]) -> bytes:
        return row_event(list(changes), "-80").row_event.SerializeToString()

    good = serialized((None, row(b"1", b"ab")), (None, row(None, b"")))
    located = locate_rows([good], [2], 2)
    assert located is not None and located.after is not None and located.before is None
    assert located.after.lengths.tolist() == [[1, 2], [-1, 0]]
    values = [located.buffer[s : s + 3] for s in located.after.starts.tolist()]
    assert values[0] == b"1ab"
    # Rows of another width, or whose values do not add up, even when the totals do.
    assert locate_rows([serialized((None, row(b"1")), (None, row(b"2", b"3", b"4")))], [2], 2) is None
    swapped = serialized(
        (None, query_pb2.Row(lengths=[0, 0], values=b"xy")), (None, query_pb2.Row(lengths=[1, 1], values=b""))
    )
    assert locate_rows([swapped], [2], 2) is None
    assert locate_rows([serialized((None, row(b"1", b"2")), (row(b"1", b"2"), None))], [2], 2) is None
    assert locate_rows([good], [2], 3) is None
    # A partial-image bitmap after the last row's image: the record is longer than predicted.
    event = row_event([(None, row(b"1", b"ab"))], "-80")
    bitmap = binlogdata_pb2.RowChange.Bitmap(count=2, cols=b"\x03")
    event.row_event.row_changes[0].data_columns.CopyFrom(bitmap)
    assert locate_rows([event.row_event.SerializeToString()], [1], 2) is None


def test_a_row_field_we_do_not_know_is_not_read_as_values(tmp_path: Path) -> None:
    """A query.Row with lengths [3] and, instead of values, an unknown field of 3 bytes: the
    record has the predicted size, but its values field is not where it should be."""
    fields = [fld("a", T.VARCHAR, charset=UTF8MB4)]
    odd = query_pb2.Row.FromString(bytes([0x0A, 0x01, 0x06, 0x1A, 0x03]) + b"abc")
    event = row_event([(None, odd)], "-80")
    assert locate_rows([event.row_event.SerializeToString()], [1], 1) is None
    decoder = EventDecoder()
    decoder.decode(field_event(fields, "-80"))
    decoded = decoder.decode(event)
    assert isinstance(decoded, RowEvent)
    s = WindowStager(str(tmp_path), "sync", 1)
    s.set_schema(KS, "t", fields, shard="-80")
    s.add_rows(KS, "t", "-80", 1, 1, decoded.changes)
    with pytest.raises(ValueDecodeError, match="lengths add up to 3 bytes but the row has 0"):
        s.finish(POS, POS, POS)
