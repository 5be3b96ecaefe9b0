"""Parquet staging: type mapping, row layout, checkpoints/resume, manifest atomicity, checks."""

from __future__ import annotations

import datetime
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.decoding.values import RowDecoder
from airflow_provider_vitess.exceptions import CorruptStagedDataError, StagingError
from airflow_provider_vitess.staging import (
    PartInfo,
    WindowStager,
    arrow_type,
    load_manifest,
    read_table,
    verify,
)
from airflow_provider_vitess.staging.arrow_types import decimal_precision_scale
from airflow_provider_vitess.staging.files import fsync_dirs, is_local, write_atomically
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies, ZeroDatePolicy
from airflow_provider_vitess.vgtid import Vgtid

T = query_pb2.Type
UTF8MB4 = 45
UTF8MB4_BIN = 46
BINARY = 63
NOT_NULL = 1
UNSIGNED = 32
KS = "customer"
INS, UPD, DEL = Operation.INSERT, Operation.UPDATE, Operation.DELETE
UTC = datetime.timezone.utc
START = Vgtid.from_json(
    '[{"keyspace":"customer","shard":"-80","gtid":"MySQL56/a2cd2e7c-aa2a-11ee-8000-000000000001:1-5"}]'
)
END = Vgtid.from_json(
    '[{"keyspace":"customer","shard":"-80","gtid":"MySQL56/a2cd2e7c-aa2a-11ee-8000-000000000001:1-9"}]'
)


def fld(
    name: str,
    type_: int,
    *,
    charset: int = 0,
    column_type: str = "",
    flags: int = 0,
    column_length: int = 0,
    decimals: int = 0,
) -> query_pb2.Field:
    return query_pb2.Field(
        name=name,
        type=T.Name(type_),
        charset=charset,
        column_type=column_type,
        flags=flags,
        column_length=column_length,
        decimals=decimals,
    )


def stager(tmp_path: Path, window: int = 1, **kw: Any) -> WindowStager:
    return WindowStager(str(tmp_path), "sync1", window, **kw)


def finish(s: WindowStager, **kw: Any) -> Any:
    return s.finish(START, END, END, **kw)


def window_files(tmp_path: Path, window: int = 1) -> list[str]:
    root = tmp_path / "sync1" / f"window={window:010d}"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# -- type mapping --------------------------------------------------------------------------------

ALL_TYPES: list[tuple[query_pb2.Field, pa.DataType, list[Any]]] = [
    (fld("i8", T.INT8), pa.int8(), [-128, 127]),
    (fld("i16", T.INT16), pa.int16(), [-32768, 32767]),
    (fld("i24", T.INT24), pa.int32(), [-8388608, 8388607]),
    (fld("i32", T.INT32), pa.int32(), [-(2**31), 2**31 - 1]),
    (fld("i64", T.INT64), pa.int64(), [-(2**63), 2**63 - 1]),
    (fld("u8", T.UINT8), pa.uint8(), [0, 255]),
    (fld("u16", T.UINT16), pa.uint16(), [0, 65535]),
    (fld("u24", T.UINT24), pa.uint32(), [0, 16777215]),
    (fld("u32", T.UINT32), pa.uint32(), [0, 2**32 - 1]),
    (fld("u64", T.UINT64), pa.uint64(), [0, 2**64 - 1]),
    (fld("y", T.YEAR), pa.int16(), [0, 2155]),
    (
        fld("dec", T.DECIMAL, column_type="decimal(65,30)", column_length=67, decimals=30),
        pa.decimal256(65, 30),
        [Decimal("9" * 35 + "." + "9" * 30), Decimal("-0." + "0" * 29 + "1")],
    ),
    (
        fld("dec2", T.DECIMAL, column_length=12, decimals=2),
        pa.decimal128(10, 2),
        [Decimal("-12345678.90"), Decimal("0.01")],
    ),
    (fld("f32", T.FLOAT32), pa.float64(), [0.1, -3.40282e38]),
    (fld("f64", T.FLOAT64), pa.float64(), [1.7976931348623157e308, -2.2250738585072014e-308]),
    (fld("d", T.DATE), pa.date32(), [datetime.date(1000, 1, 1), datetime.date(9999, 12, 31)]),
    (
        fld("dt", T.DATETIME),
        pa.timestamp("us"),
        [datetime.datetime(1000, 1, 1, 0, 0, 0), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)],
    ),
    (
        fld("ts", T.TIMESTAMP),
        pa.timestamp("us", tz="UTC"),
        [datetime.datetime(1970, 1, 1, 0, 0, 1), datetime.datetime(2038, 1, 19, 3, 14, 7, 499999)],
    ),
    (
        fld("t", T.TIME),
        pa.duration("us"),
        [
            -datetime.timedelta(seconds=1, microseconds=500000),
            datetime.timedelta(hours=838, minutes=59, seconds=59),
        ],
    ),
    (fld("vc", T.VARCHAR, charset=UTF8MB4), pa.string(), ["héllo 🐬", ""]),
    (fld("ch", T.CHAR, charset=UTF8MB4), pa.string(), ["abcd", "x"]),
    (fld("tx", T.TEXT, charset=UTF8MB4), pa.string(), ["long 🐬 text", "a\x00b"]),
    (fld("js", T.JSON, charset=BINARY), pa.string(), ['{"a": [1, null]}', "null"]),
    (fld("en", T.ENUM, charset=UTF8MB4), pa.string(), ["a", "c"]),
    (fld("st", T.SET, charset=UTF8MB4), pa.string(), ["x,z", ""]),
    (fld("txb", T.TEXT, charset=BINARY), pa.binary(), [b"\x00\xff", b""]),
    (fld("bn", T.BINARY, charset=BINARY), pa.binary(), [b"\x00" * 8, b"ab\x00\x00\x00\x00\x00\x00"]),
    (fld("vb", T.VARBINARY, charset=BINARY), pa.binary(), [b"\x00\x01\x02", b""]),
    (fld("bl", T.BLOB, charset=BINARY), pa.binary(), [bytes(range(256)), b"\x00"]),
    # _bin collations are typed BINARY/VARBINARY/BLOB by Vitess, decoded as str.
    (fld("cb", T.BINARY, charset=UTF8MB4_BIN), pa.string(), ["ab🐬", ""]),
    (fld("vcb", T.VARBINARY, charset=UTF8MB4_BIN), pa.string(), ["x", "y"]),
    (fld("mjs", T.BLOB, charset=UTF8MB4_BIN), pa.string(), ['{"k": 1}', "[]"]),
    (fld("b1", T.BIT, charset=BINARY), pa.binary(), [b"\x01", b"\x00"]),
    (fld("b64", T.BIT, charset=BINARY), pa.binary(), [b"\xff" * 8, b"\x00" * 8]),
    (fld("g", T.GEOMETRY, charset=BINARY), pa.binary(), [b"\x00\x00\x00\x00\x01\x01\x00", b"\x00"]),
]


@pytest.mark.parametrize(("f", "expected", "_values"), ALL_TYPES, ids=[f.name for f, _, _ in ALL_TYPES])
def test_arrow_type(f: query_pb2.Field, expected: pa.DataType, _values: list[Any]) -> None:
    assert arrow_type(f) == expected


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (fld("d", T.DECIMAL, column_type="decimal(65,30)"), (65, 30)),
        (fld("d", T.DECIMAL, column_type="decimal(10,2) unsigned", column_length=11), (10, 2)),
        (fld("d", T.DECIMAL, column_type="decimal(38,0)"), (38, 0)),
        # No column_type: MySQL's display length = precision + sign + point.
        (fld("d", T.DECIMAL, column_length=67, decimals=30), (65, 30)),
        (fld("d", T.DECIMAL, column_length=11, decimals=0), (10, 0)),
        (fld("d", T.DECIMAL, column_length=10, decimals=0, flags=UNSIGNED), (10, 0)),
        (fld("d", T.DECIMAL, column_length=11, decimals=2, flags=UNSIGNED), (10, 2)),
    ],
)
def test_decimal_precision(f: query_pb2.Field, expected: tuple[int, int]) -> None:
    assert decimal_precision_scale(f) == expected
    assert arrow_type(f) == (pa.decimal128(*expected) if expected[0] <= 38 else pa.decimal256(*expected))


@pytest.mark.parametrize(("f", "expected", "_values"), ALL_TYPES, ids=[f.name for f, _, _ in ALL_TYPES])
def test_text_versus_bytes_follows_the_decoder(
    f: query_pb2.Field, expected: pa.DataType, _values: list[Any]
) -> None:
    """The staged type must hold what values.RowDecoder yields: str <-> string, bytes <-> binary."""
    if not (pa.types.is_string(expected) or pa.types.is_binary(expected)):
        return
    data = b"x"
    decoded = RowDecoder([f]).decode(query_pb2.Row(lengths=[len(data)], values=data))[0]
    assert isinstance(decoded, str if pa.types.is_string(expected) else bytes)


def _expected(f: query_pb2.Field, value: Any) -> Any:
    # Arrow gives TIMESTAMP back as an aware UTC datetime; the decoder's value is naive UTC.
    if f.type == T.TIMESTAMP and value is not None:
        return value.replace(tzinfo=UTC)
    return value


def test_round_trip_of_every_type(tmp_path: Path) -> None:
    fields = [f for f, _, _ in ALL_TYPES]
    rows = [tuple(vals[i] for _, _, vals in ALL_TYPES) for i in (0, 1)] + [(None,) * len(fields)]
    s = stager(tmp_path, key_columns={"all_types": ["i64"]})
    s.set_schema(KS, "all_types", fields)
    for seq, row in enumerate(rows, start=1):
        s.add_change(KS, "all_types", "-80", INS, 1700000000 + seq, seq, None, row)
    manifest = finish(s)
    table = read_table(manifest, "all_types")
    for f, expected_type, _ in ALL_TYPES:
        assert table.schema.field(f.name).type == expected_type
    got = table.to_pylist()
    for out, row in zip(got, rows, strict=True):
        assert {f.name: out[f.name] for f in fields} == {
            f.name: _expected(f, v) for f, v in zip(fields, row, strict=True)
        }
    # The schema record keeps what a consumer needs.
    cols = {c.name: c for c in manifest.tables["all_types"].schema.columns}
    assert cols["dec"].arrow == "decimal256(65, 30)"
    assert cols["dec"].column_type == "decimal(65,30)"
    assert cols["u64"].type == "UINT64"


def test_decoded_rows_round_trip(tmp_path: Path) -> None:
    """From query.Row text through RowDecoder into Parquet and back."""
    fields = [
        fld("id", T.INT64, flags=NOT_NULL),
        fld("amount", T.DECIMAL, column_type="decimal(10,2)", decimals=2),
        fld("at", T.DATETIME, column_type="datetime(6)", decimals=6),
        fld("name", T.VARCHAR, charset=UTF8MB4),
        fld("dur", T.TIME),
    ]
    texts = [b"7", b"-12.50", b"2024-02-29 23:59:59.000001", "🐬".encode(), b"-00:00:01.500000"]
    row = query_pb2.Row(lengths=[len(t) for t in texts], values=b"".join(texts))
    decoded = RowDecoder(fields).decode(row)
    s = stager(tmp_path)
    s.set_schema(KS, "t", fields)
    s.add_change(KS, "t", "0", INS, 1, 1, None, decoded)
    out = read_table(finish(s), "t").to_pylist()[0]
    assert tuple(out[f.name] for f in fields) == decoded


def test_zero_date_under_the_error_policy_is_a_clear_error(tmp_path: Path) -> None:
    s = stager(tmp_path, key_columns={"events": ["id"]}, zero_dates=ZeroDatePolicies(ZeroDatePolicy.ERROR))
    s.set_schema(KS, "events", [fld("id", T.INT64), fld("day", T.DATE)])
    s.add_change(KS, "events", "-80", INS, 1, 1, None, (1, datetime.date(2020, 1, 1)))
    s.add_change(KS, "events", "-80", INS, 1, 2, None, (2, "0000-00-00"))
    with pytest.raises(StagingError) as err:
        s.checkpoint()
    msg = str(err.value)
    assert "'events'" in msg and "'day'" in msg and "'0000-00-00'" in msg and "seq 2" in msg
    assert "key {'id': 2}" in msg


def test_integer_out_of_range_is_a_clear_error(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.set_schema(KS, "t", [fld("n", T.INT8)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (300,))
    with pytest.raises(StagingError, match=r"column 'n'.*300"):
        s.checkpoint()


def test_row_before_schema(tmp_path: Path) -> None:
    s = stager(tmp_path)
    with pytest.raises(StagingError, match="before its schema"):
        s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))


def test_row_of_wrong_width(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.set_schema(KS, "t", [fld("a", T.INT64), fld("b", T.INT64)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1, 2))
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (1,))
    with pytest.raises(StagingError, match="after image has 1 values but the schema has 2"):
        s.checkpoint()


def test_before_image_of_wrong_width(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.set_schema(KS, "t", [fld("a", T.INT64), fld("b", T.INT64)])
    s.add_change(KS, "t", "-80", UPD, 1, 1, (1,), (1, 2))
    with pytest.raises(StagingError, match="before image has 1 values but the schema has 2"):
        s.checkpoint()


def test_column_clashing_with_the_layout(tmp_path: Path) -> None:
    s = stager(tmp_path)
    with pytest.raises(StagingError, match="clash"):
        s.set_schema(KS, "t", [fld("_seq", T.INT64)])


# -- row layout --------------------------------------------------------------------------------


def test_layout_ops_seq_and_before_image(tmp_path: Path) -> None:
    s = stager(tmp_path, key_columns={"c": ["id"]})
    s.set_schema(KS, "c", [fld("id", T.INT64), fld("email", T.VARCHAR, charset=UTF8MB4)])
    s.add_change(KS, "c", "-80", INS, 100, 1, None, (1, "a@x"))
    s.add_change(KS, "c", "-80", UPD, 101, 2, (1, "a@x"), (2, "b@x"))  # key change
    s.add_change(KS, "c", "80-", DEL, 102, 3, (5, "e@x"), None)
    manifest = finish(s)
    table = read_table(manifest, "c")
    assert table.column_names == [
        "_op",
        "_keyspace",
        "_shard",
        "_commit_ts",
        "_seq",
        "id",
        "email",
        "_before_id",
        "_absent",
    ]
    assert table.to_pylist() == [
        {"_op": "insert", "_keyspace": KS, "_shard": "-80", "_commit_ts": 100, "_seq": 1,
         "id": 1, "email": "a@x", "_before_id": None, "_absent": None},
        {"_op": "update", "_keyspace": KS, "_shard": "-80", "_commit_ts": 101, "_seq": 2,
         "id": 2, "email": "b@x", "_before_id": 1, "_absent": None},
        {"_op": "delete", "_keyspace": KS, "_shard": "80-", "_commit_ts": 102, "_seq": 3,
         "id": None, "email": None, "_before_id": 5, "_absent": None},
    ]  # fmt: skip
    assert manifest.tables["c"].op_counts == {"delete": 1, "insert": 1, "update": 1}
    assert manifest.tables["c"].key_columns == ("id",)
    assert not table.schema.field("_seq").nullable


def test_before_image_composite_and_default_keys(tmp_path: Path) -> None:
    s = stager(tmp_path, key_columns={"k2": ["b", "a"]})
    cols = [fld("a", T.INT64), fld("b", T.VARCHAR, charset=UTF8MB4), fld("c", T.INT64)]
    s.set_schema(KS, "k2", cols)
    s.set_schema(KS, "nokey", cols)
    for t in ("k2", "nokey"):
        s.add_change(KS, t, "0", UPD, 1, 1, (1, "x", 3), (1, "y", 4))
        s.add_change(KS, t, "0", INS, 1, 2, None, (9, "z", 9))
    m = finish(s)
    k2 = read_table(m, "k2")
    assert k2.column_names[-3:] == ["_before_b", "_before_a", "_absent"]
    assert k2.select(["_before_b", "_before_a"]).to_pylist() == [
        {"_before_b": "x", "_before_a": 1},
        {"_before_b": None, "_before_a": None},
    ]
    nokey = read_table(m, "nokey")
    assert nokey.column_names[-4:] == ["_before_a", "_before_b", "_before_c", "_absent"]
    assert nokey.slice(0, 1).select(["_before_a", "_before_b", "_before_c"]).to_pylist() == [
        {"_before_a": 1, "_before_b": "x", "_before_c": 3}
    ]
    assert m.tables["nokey"].key_columns == ("a", "b", "c")


def test_unknown_key_column(tmp_path: Path) -> None:
    s = stager(tmp_path, key_columns={"t": ["nope"]})
    with pytest.raises(StagingError, match="'nope'"):
        s.set_schema(KS, "t", [fld("id", T.INT64)])


# -- checkpoints, resume, schema changes ---------------------------------------------------------


def test_checkpoint_resume_and_finish(tmp_path: Path) -> None:
    fields = [fld("id", T.INT64), fld("v", T.VARCHAR, charset=UTF8MB4)]
    s1 = stager(tmp_path, row_group_bytes=1)  # every row flushed at once: files exist early
    s1.set_schema(KS, "t", fields)
    s1.add_change(KS, "t", "-80", INS, 1, 1, None, (1, "a"))
    s1.add_change(KS, "t", "-80", INS, 1, 2, None, (2, "b"))
    first = s1.checkpoint()
    assert [(p.table, p.path, p.rows) for p in first] == [("t", "t/part-00001.parquet", 2)]
    assert s1.checkpoint() == []  # nothing new
    s1.add_change(KS, "t", "-80", INS, 2, 3, None, (3, "lost"))
    assert window_files(tmp_path) == ["t/part-00001.parquet", "t/part-00002.parquet"]
    # The process dies here. The caller's checkpoint store kept `first` as JSON.
    stored = json.loads(json.dumps([p.to_dict() for p in first]))
    kept = [PartInfo.from_dict(d) for d in stored]
    assert kept == first
    assert load_manifest(str(tmp_path), "sync1", 1) is None

    deleted = WindowStager.discard_uncommitted(str(tmp_path), "sync1", 1, keep=[p.path for p in kept])
    assert deleted == ["t/part-00002.parquet"]
    s2 = stager(tmp_path)
    s2.set_schema(KS, "t", fields)
    s2.add_change(KS, "t", "-80", INS, 2, 3, None, (3, "c"))
    manifest = finish(s2, parts=kept, stats={"events_read": 3})
    tm = manifest.tables["t"]
    assert [p.path for p in tm.parts] == ["t/part-00001.parquet", "t/part-00002.parquet"]
    assert tm.rows == 3 and tm.op_counts == {"insert": 3}
    assert read_table(manifest, "t").column("v").to_pylist() == ["a", "b", "c"]
    loaded = load_manifest(str(tmp_path), "sync1", 1)
    assert loaded == manifest
    assert loaded is not None and loaded.stats == {"events_read": 3}
    verify(loaded)


def test_finish_lists_checkpointed_parts_once(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.set_schema(KS, "t", [fld("id", T.INT64)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    parts = s.checkpoint()
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2,))
    m = finish(s, parts=parts)  # the caller passes what its store holds, including this run's
    assert [p.path for p in m.tables["t"].parts] == ["t/part-00001.parquet", "t/part-00002.parquet"]
    assert m.rows == 2


def test_schema_change_mid_window(tmp_path: Path) -> None:
    v1 = [fld("id", T.INT64), fld("n", T.INT32)]
    v2 = [*v1, fld("note", T.VARCHAR, charset=UTF8MB4)]
    s = stager(tmp_path)
    s.set_schema(KS, "t", v1)
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1, 10))
    s.set_schema(KS, "t", v1)  # same schema again: no-op
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2, 20))
    s.add_ddl(KS, "-80", "alter table t add column note varchar(10)", 2)
    s.set_schema(KS, "t", v2)
    s.add_change(KS, "t", "-80", UPD, 3, 3, (2, 20, None), (2, 21, "hi"))
    m = finish(s)
    tm = m.tables["t"]
    assert len(tm.schemas) == 2 and len(tm.parts) == 2
    assert [c.name for c in tm.schemas[0].columns] == ["id", "n"]
    assert [c.name for c in tm.schemas[1].columns] == ["id", "n", "note"]
    assert [tm.schemas.index(tm.schema_of(p)) for p in tm.parts] == [0, 1]
    assert tm.schema.names == ("id", "n", "note")
    assert [d.statement for d in m.ddls] == ["alter table t add column note varchar(10)"]
    table = read_table(m, "t")
    assert table.select(["_seq", "id", "n", "note"]).to_pylist() == [
        {"_seq": 1, "id": 1, "n": 10, "note": None},
        {"_seq": 2, "id": 2, "n": 20, "note": None},
        {"_seq": 3, "id": 2, "n": 21, "note": "hi"},
    ]
    loaded = load_manifest(str(tmp_path), "sync1", 1)
    assert loaded is not None and loaded.tables["t"].schemas == tm.schemas


def test_shards_switch_schema_at_different_times(tmp_path: Path) -> None:
    """During a DDL one shard already sends the new columns while another still sends the old."""
    v1 = [fld("id", T.INT64)]
    v2 = [fld("id", T.INT64), fld("x", T.INT64)]
    s = stager(tmp_path)
    s.set_schema(KS, "t", v1, shard="-80")
    s.set_schema(KS, "t", v1, shard="80-")
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    s.set_schema(KS, "t", v2, shard="-80")
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2, 20))
    s.add_change(KS, "t", "80-", INS, 1, 3, None, (3,))  # still the old schema
    s.set_schema(KS, "t", v2, shard="80-")
    s.add_change(KS, "t", "80-", INS, 1, 4, None, (4, 40))
    m = finish(s)
    assert len(m.tables["t"].parts) == 2
    assert read_table(m, "t").select(["_seq", "id", "x"]).to_pylist() == [
        {"_seq": 1, "id": 1, "x": None},
        {"_seq": 2, "id": 2, "x": 20},
        {"_seq": 3, "id": 3, "x": None},
        {"_seq": 4, "id": 4, "x": 40},
    ]


def test_table_with_schema_but_no_rows(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.set_schema(KS, "empty", [fld("id", T.INT64)])
    m = finish(s)
    assert m.tables["empty"].parts == () and m.tables["empty"].keyspace == KS
    assert read_table(m, "empty").num_rows == 0
    assert read_table(m, "empty").column_names == [
        "_op",
        "_keyspace",
        "_shard",
        "_commit_ts",
        "_seq",
        "id",
        "_before_id",
        "_absent",
    ]


# -- manifest atomicity and integrity ------------------------------------------------------------


def test_no_manifest_until_finish(tmp_path: Path) -> None:
    s = stager(tmp_path, row_group_bytes=1)
    s.set_schema(KS, "t", [fld("id", T.INT64)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    s.checkpoint()
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2,))
    assert "_manifest.json" not in window_files(tmp_path)
    assert load_manifest(str(tmp_path), "sync1", 1) is None  # a crash now: the window does not exist
    m = finish(s)
    assert window_files(tmp_path) == ["_manifest.json", "t/part-00001.parquet", "t/part-00002.parquet"]
    assert load_manifest(str(tmp_path), "sync1", 1) == m
    with pytest.raises(StagingError, match="finished"):
        s.add_ddl(KS, "-80", "x", 1)
    again = stager(tmp_path)
    with pytest.raises(StagingError, match="already has a manifest"):
        finish(again)
    with pytest.raises(StagingError, match="has a manifest"):
        WindowStager.discard_uncommitted(str(tmp_path), "sync1", 1, keep=[])


def _staged(tmp_path: Path) -> Any:
    s = stager(tmp_path)
    s.set_schema(KS, "t", [fld("id", T.INT64)])
    for i in range(100):
        s.add_change(KS, "t", "-80", INS, 1, i + 1, None, (i,))
    return finish(s)


def test_corrupt_part(tmp_path: Path) -> None:
    m = _staged(tmp_path)
    part = tmp_path / "sync1" / "window=0000000001" / "t" / "part-00001.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    for check in (lambda: verify(m), lambda: read_table(m, "t")):
        with pytest.raises(CorruptStagedDataError) as err:
            check()
        assert "sync1/window=0000000001" in str(err.value)
        assert "'t'" in str(err.value) and "t/part-00001.parquet" in str(err.value)
        assert "sha256" in str(err.value)


def test_missing_part(tmp_path: Path) -> None:
    m = _staged(tmp_path)
    os.remove(tmp_path / "sync1" / "window=0000000001" / "t" / "part-00001.parquet")
    with pytest.raises(CorruptStagedDataError, match=r"t/part-00001\.parquet is missing"):
        verify(m)


def test_row_count_mismatch(tmp_path: Path) -> None:
    _staged(tmp_path)
    wdir = tmp_path / "sync1" / "window=0000000001"
    text = (wdir / "_manifest.json").read_text()
    (wdir / "_manifest.json").write_text(text.replace('"rows": 100', '"rows": 99'))
    loaded = load_manifest(str(tmp_path), "sync1", 1)
    assert loaded is not None
    with pytest.raises(CorruptStagedDataError, match="has 100 rows, the manifest says 99"):
        verify(loaded)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not a valid staging manifest"),
        ("[]", "must be a JSON object"),
        ('{"format_version": 1}', "missing key 'sync_id'"),
        ('{"format_version": 99}', "format_version 99"),
    ],
)
def test_malformed_manifest(tmp_path: Path, text: str, problem: str) -> None:
    wdir = tmp_path / "sync1" / "window=0000000001"
    wdir.mkdir(parents=True)
    (wdir / "_manifest.json").write_text(text)
    with pytest.raises(CorruptStagedDataError) as err:
        load_manifest(str(tmp_path), "sync1", 1)
    assert str(wdir / "_manifest.json") in str(err.value)
    assert problem in str(err.value)


def test_manifest_json_round_trip(tmp_path: Path) -> None:
    m = _staged(tmp_path)
    d = json.loads(m.to_json())
    assert d["format_version"] == 1 and d["window_seq"] == 1
    assert Vgtid.from_json(json.dumps(d["start_vgtid"])) == START
    assert d["stop_vgtid"] == d["end_vgtid"]
    assert d["tables"]["t"]["parts"][0]["sha256"] == m.tables["t"].parts[0].sha256


def test_abort_deletes_own_files_only(tmp_path: Path) -> None:
    other = stager(tmp_path, window=2)
    other.set_schema(KS, "t", [fld("id", T.INT64)])
    other.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    other.checkpoint()
    s = stager(tmp_path, row_group_bytes=1)
    s.set_schema(KS, "t", [fld("id", T.INT64)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    s.checkpoint()
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2,))
    assert window_files(tmp_path) == ["t/part-00001.parquet", "t/part-00002.parquet"]
    s.abort(keep_checkpointed=True)
    assert window_files(tmp_path) == ["t/part-00001.parquet"]
    s.abort()
    assert window_files(tmp_path) == []
    assert window_files(tmp_path, window=2) == ["t/part-00001.parquet"]


def test_unsafe_names(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="sync id"):
        WindowStager(str(tmp_path), "../x", 1)
    s = stager(tmp_path)
    with pytest.raises(StagingError, match="table"):
        s.set_schema(KS, "a/b", [fld("id", T.INT64)])


# -- memory bound --------------------------------------------------------------------------------


def test_bounded_buffer_over_two_million_rows(tmp_path: Path) -> None:
    row_group = 1 << 20
    s = stager(tmp_path, row_group_bytes=row_group)
    s.set_schema(KS, "t", [fld("id", T.INT64), fld("name", T.VARCHAR, charset=UTF8MB4)])
    add = s.add_change
    peak = 0
    n = 2_000_000
    for i in range(n):
        add(KS, "t", "-80", INS, 1, i, None, (i, "name"))
        if i % 1000 == 0:
            peak = max(peak, s.buffered_bytes)
    m = finish(s)
    # One Python batch (<= row_group) plus Arrow batches (<= row_group) plus one check interval.
    assert 0 < peak <= 2.5 * row_group
    assert m.rows == n
    meta = pq.ParquetFile(tmp_path / "sync1" / "window=0000000001" / "t" / "part-00001.parquet").metadata
    assert meta.num_row_groups > 10
    sizes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups - 1)]
    assert max(sizes) <= 2 * row_group  # row groups follow row_group_bytes


def test_many_tables_share_one_budget(tmp_path: Path) -> None:
    row_group = 256 << 10
    s = stager(tmp_path, row_group_bytes=row_group, max_buffered_bytes=row_group)
    tables = [f"t{i}" for i in range(20)]
    for t in tables:
        s.set_schema(KS, t, [fld("id", T.INT64), fld("v", T.VARCHAR, charset=UTF8MB4)])
    peak = 0
    for i in range(200_000):
        s.add_change(KS, tables[i % 20], "-80", INS, 1, i, None, (i, "some text value"))
        if i % 500 == 0:
            peak = max(peak, s.buffered_bytes)
    assert peak <= 3 * row_group
    assert finish(s).rows == 200_000


# -- locations and keyspaces ---------------------------------------------------------------------


def test_object_store_location(tmp_path: Path) -> None:
    """An fsspec URL (memory:// stands in for s3://): the manifest is a single PUT, no rename."""
    location = f"memory://staging-{tmp_path.name}"
    s = WindowStager(location, "sync1", 3, row_group_bytes=1)
    s.set_schema(KS, "t", [fld("id", T.INT64)])
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    parts = s.checkpoint()
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2,))
    assert load_manifest(location, "sync1", 3) is None
    assert WindowStager.discard_uncommitted(location, "sync1", 3, keep=[p.path for p in parts]) == [
        "t/part-00002.parquet"
    ]
    s2 = WindowStager(location, "sync1", 3)
    s2.set_schema(KS, "t", [fld("id", T.INT64)])
    s2.add_change(KS, "t", "-80", INS, 1, 2, None, (2,))
    m = s2.finish(START, None, END, parts=parts)
    assert m.path == f"{location}/sync1/window=0000000003/_manifest.json"
    loaded = load_manifest(location, "sync1", 3)
    assert loaded == m and loaded is not None and loaded.stop_vgtid is None
    verify(loaded)
    assert read_table(loaded, "t").column("id").to_pylist() == [1, 2]


def test_manifest_path_local(tmp_path: Path) -> None:
    m = _staged(tmp_path)
    assert m.path == f"{tmp_path}/sync1/window=0000000001/_manifest.json"
    assert os.path.exists(m.path)


def test_table_from_two_keyspaces(tmp_path: Path) -> None:
    """Across a MoveTables cut-over the same table streams from the target keyspace."""
    s = stager(tmp_path)
    for ks in ("commerce", KS):
        s.set_schema(ks, "t", [fld("id", T.INT64)])
    s.add_change("commerce", "t", "0", INS, 1, 1, None, (1,))
    s.add_change(KS, "t", "-80", INS, 2, 2, None, (2,))
    m = finish(s)
    assert m.tables["t"].keyspaces == ("commerce", KS) and m.tables["t"].keyspace == "commerce"
    assert read_table(m, "t").column("_keyspace").to_pylist() == ["commerce", KS]


def test_keyspace_wide_schema_replaces_shard_schemas(tmp_path: Path) -> None:
    v1, v2 = [fld("id", T.INT64)], [fld("id", T.INT64), fld("x", T.INT64)]
    s = stager(tmp_path)
    s.set_schema(KS, "t", v1, shard="-80")
    s.add_change(KS, "t", "-80", INS, 1, 1, None, (1,))
    s.set_schema(KS, "t", v2)  # no shard: every shard of the keyspace
    s.add_change(KS, "t", "-80", INS, 1, 2, None, (2, 20))
    s.add_change(KS, "t", "80-", INS, 1, 3, None, (3, 30))
    m = finish(s)
    assert [p.rows for p in m.tables["t"].parts] == [1, 2]
    assert read_table(m, "t").column("x").to_pylist() == [None, 20, 30]


def test_manifest_part_path_cannot_escape(tmp_path: Path) -> None:
    _staged(tmp_path)
    path = tmp_path / "sync1" / "window=0000000001" / "_manifest.json"
    path.write_text(path.read_text().replace('"t/part-00001.parquet"', '"t/../../x.parquet"'))
    with pytest.raises(CorruptStagedDataError, match="not inside the table's directory"):
        load_manifest(str(tmp_path), "sync1", 1)


def test_durable_writes_on_local_disks_only_and_atomic_everywhere(tmp_path: Path) -> None:
    """Local staging takes the fsync path (parts, directories, manifest before and after its
    rename: ``staging/files.py``); object stores take the single-PUT path, durable on return.

    What this cannot show is a power loss: the fsync calls themselves are checked by review
    (HashingSink.close, WindowStager.checkpoint, write_atomically). Here: which path each
    filesystem takes, and that both leave exactly the final file."""
    local, _ = fsspec.core.url_to_fs(str(tmp_path))
    memory, _ = fsspec.core.url_to_fs("memory://durable")
    assert is_local(local) and is_local(fsspec.filesystem("file"))
    assert not is_local(memory)
    for fs, directory in ((local, f"{tmp_path}/w"), (memory, "/durable/w")):
        write_atomically(fs, f"{directory}/_manifest.json", b'{"ok": true}')
        assert fs.cat_file(f"{directory}/_manifest.json") == b'{"ok": true}'
        assert [os.path.basename(p) for p in fs.ls(directory, detail=False)] == ["_manifest.json"]
    fsync_dirs(local, [f"{tmp_path}/w", f"{tmp_path}/never-created"])  # absent: nothing to sync
