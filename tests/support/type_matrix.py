"""A column per MySQL type family and rows at the types' limits, awkward values and NULLs: the
type matrix's table (``capture/test_type_matrix.py``), also written by the merge workload."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

COLUMNS: dict[str, str] = {
    "i8": "TINYINT",
    "u8": "TINYINT UNSIGNED",
    "i16": "SMALLINT",
    "u16": "SMALLINT UNSIGNED",
    "i24": "MEDIUMINT",
    "u24": "MEDIUMINT UNSIGNED",
    "i32": "INT",
    "u32": "INT UNSIGNED",
    "i64": "BIGINT",
    "u64": "BIGINT UNSIGNED",
    "dec": "DECIMAL(65,30)",
    "f32": "FLOAT",
    "f64": "DOUBLE",
    "d": "DATE",
    "t": "TIME(6)",
    "dt": "DATETIME(6)",
    "ts": "TIMESTAMP(6) NULL",
    "y": "YEAR",
    "ch": "CHAR(10)",
    "vc": "VARCHAR(64)",
    "tx": "TEXT",
    "bn": "BINARY(8)",
    "vb": "VARBINARY(16)",
    "bl": "BLOB",
    "js": "JSON",  # MariaDB: LONGTEXT utf8mb4_bin, typed BLOB by Vitess
    "cb": "CHAR(4) COLLATE utf8mb4_bin",  # typed BINARY by Vitess
    "vcb": "VARCHAR(16) COLLATE utf8mb4_bin",  # typed VARBINARY by Vitess
    "en": "ENUM('a','b','c')",
    "st": "SET('x','y','z')",
    "b1": "BIT(1)",
    "b64": "BIT(64)",
}

# DECIMAL(65,30): 35 integer digits, 30 decimals (spelled out: -DEC_MAX would round to 28 digits)
DEC_MAX = Decimal("9" * 35 + "." + "9" * 30)
DEC_MIN = Decimal("-" + "9" * 35 + "." + "9" * 30)
EMOJI = "😀"
TIME_MAX = datetime.timedelta(hours=838, minutes=59, seconds=59)
MIN_ROW: dict[str, Any] = {
    "id": 1,
    **{"i8": -128, "i16": -32768, "i24": -8388608, "i32": -(2**31), "i64": -(2**63)},
    **{c: 0 for c in ("u8", "u16", "u24", "u32", "u64")},
    "dec": DEC_MIN,
    "f32": -3.40282e38,
    "f64": -1.7976931348623157e308,
    "d": datetime.date(1000, 1, 1),
    "t": -TIME_MAX,
    "dt": datetime.datetime(1000, 1, 1),
    "ts": datetime.datetime(1970, 1, 1, 0, 0, 1),
    "y": 1901,
    **{c: "" for c in ("ch", "vc", "tx")},
    **{c: b"" for c in ("bn", "vb", "bl")},
    "js": "[]",
    "cb": "",
    "vcb": "",
    "en": "a",
    "st": "",
    "b1": 0,
    "b64": 0,
}
MAX_ROW: dict[str, Any] = {
    "id": 2,
    **{"i8": 127, "i16": 32767, "i24": 8388607, "i32": 2**31 - 1, "i64": 2**63 - 1},
    **{"u8": 255, "u16": 65535, "u24": 2**24 - 1, "u32": 2**32 - 1, "u64": 2**64 - 1},
    "dec": DEC_MAX,
    "f32": 3.40282e38,
    "f64": 1.7976931348623157e308,
    "d": datetime.date(9999, 12, 31),
    "t": TIME_MAX,
    "dt": datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
    "ts": datetime.datetime(2038, 1, 19, 3, 14, 7, 999999),
    "y": 2155,
    "ch": f"{EMOJI}é𝄞中 z",
    "vc": f"ünïcødé {EMOJI}🚀 中文 ",  # the trailing space stays in a VARCHAR
    "tx": f"line1\nline2\t'\"\\ {EMOJI * 3}",
    "bn": b"\x00\xffA\x00",  # padded with 0x00 to 8 bytes
    "vb": b"a\x00b\x00\x00",
    "bl": bytes(range(256)),
    "js": f'{{"k": [1, 2.5, "x", null, {{"n": "{EMOJI}é"}}], "b": true}}',
    "cb": f"é{EMOJI}z",
    "vcb": f"{EMOJI} bin ",
    "en": "c",
    "st": "x,z",
    "b1": 1,
    "b64": 2**64 - 1,
}
ODD_ROW: dict[str, Any] = {
    "id": 3,
    **{c: -1 for c in ("i8", "i16", "i24", "i32", "i64")},
    **{c: 1 for c in ("u8", "u16", "u24", "u32", "u64")},
    "dec": Decimal("-0." + "0" * 29 + "1"),
    "f32": 123456789.0,  # printed by MariaDB with 6 significant digits
    "f64": 0.1,
    "d": datetime.date(2024, 2, 29),
    "t": -datetime.timedelta(seconds=1.5),
    "dt": datetime.datetime(2024, 2, 29, 12, 34, 56, 123456),
    "ts": datetime.datetime(2024, 2, 29, 12, 34, 56, 500000),
    "y": 2000,
    "ch": "ab  ",  # CHAR drops trailing spaces
    "vc": "a\x00b",
    "tx": "nul\x00inside",
    "bn": b"\x00" * 8,
    "vb": b"\x00",
    "bl": b"\x00\x00x\x00",
    "js": "null",
    "cb": "a ",
    "vcb": "\x00",
    "en": "b",
    "st": "x,y,z",
    "b1": 1,
    "b64": 2**63 + 1,
}
NULL_ROW: dict[str, Any] = {"id": 4, **dict.fromkeys(COLUMNS)}
ROWS = [MIN_ROW, MAX_ROW, ODD_ROW, NULL_ROW]

# The merged table's columns as delta-rs (an Arrow type) and Polars (a dtype) read them: the Delta
# type the merge writes (merge/job/schema.py), in each reader's terms. Their values equal Spark's
# but TIMESTAMP's: an aware UTC instant where Spark gives a naive one in its session time zone.
# docs/reading-the-tables.md has this table.
READER_TYPES: dict[str, tuple[str, str]] = {
    **{c: ("int8", "Int8") for c in ("i8",)},
    **{c: ("int16", "Int16") for c in ("u8", "i16", "y")},
    **{c: ("int32", "Int32") for c in ("u16", "i24", "i32")},
    **{c: ("int64", "Int64") for c in ("u24", "u32", "i64", "t")},
    "u64": ("decimal128(20, 0)", "Decimal(precision=20, scale=0)"),
    **{c: ("double", "Float64") for c in ("f32", "f64")},
    "d": ("date32[day]", "Date"),
    "dt": ("timestamp[us]", "Datetime(time_unit='us', time_zone=None)"),
    "ts": ("timestamp[us, tz=UTC]", "Datetime(time_unit='us', time_zone='UTC')"),
    **{c: ("string", "String") for c in ("dec", "ch", "vc", "tx", "js", "cb", "vcb", "en", "st")},
    **{c: ("binary", "Binary") for c in ("bn", "vb", "bl", "b1", "b64")},
}
