"""``query.Field`` -> Arrow type, and decoded Python values -> Arrow arrays (pure, no I/O).

The mapping and why each type is staged as it is: ``docs/types.md``. A value the Arrow type
cannot hold raises :class:`StagingError` naming the table, column and value; a zero or invalid
date goes through the column's zero-date policy (:mod:`.zero_dates`) first.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.exceptions import StagingError

T = query_pb2.Type
BINARY_CHARSET = 63
NOT_NULL_FLAG = 1
UNSIGNED_FLAG = 32
MAX_DECIMAL_PRECISION = 76  # decimal256; MySQL's maximum is 65
_MAX_EXCERPT = 80

_FIXED: dict[int, pa.DataType] = {
    T.INT8: pa.int8(),
    T.INT16: pa.int16(),
    T.INT24: pa.int32(),
    T.INT32: pa.int32(),
    T.INT64: pa.int64(),
    T.UINT8: pa.uint8(),
    T.UINT16: pa.uint16(),
    T.UINT24: pa.uint32(),
    T.UINT32: pa.uint32(),
    T.UINT64: pa.uint64(),
    T.YEAR: pa.int16(),
    T.FLOAT32: pa.float64(),
    T.FLOAT64: pa.float64(),
    T.DATE: pa.date32(),
    T.DATETIME: pa.timestamp("us"),
    T.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    T.TIME: pa.duration("us"),
    T.JSON: pa.string(),
    T.ENUM: pa.string(),
    T.SET: pa.string(),
    T.EXPRESSION: pa.string(),
    T.BIT: pa.binary(),
    T.GEOMETRY: pa.binary(),
    T.HEXNUM: pa.binary(),
    T.HEXVAL: pa.binary(),
    T.BITNUM: pa.binary(),
    T.NULL_TYPE: pa.null(),
}
# Types whose columns usually repeat few values: worth a Parquet dictionary.
FEW_VALUE_TYPES = frozenset({T.ENUM, T.SET, T.YEAR, T.BIT})
_TEXT_TYPES = frozenset({T.TEXT, T.VARCHAR, T.CHAR})
_BINARY_STRING_TYPES = frozenset({T.BLOB, T.VARBINARY, T.BINARY})
_DECIMAL_RE = re.compile(r"^\s*(?:decimal|numeric|dec|fixed)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)", re.I)


def type_name(type_: int) -> str:
    try:
        return T.Name(type_)
    except ValueError:
        return str(type_)


def decimal_precision_scale(field: query_pb2.Field) -> tuple[int, int]:
    """``(precision, scale)`` of a DECIMAL column (see the module docstring)."""
    m = _DECIMAL_RE.match(field.column_type)
    if m:
        precision, scale = int(m[1]), int(m[2] or 0)
    else:
        scale = field.decimals
        sign = 0 if field.flags & UNSIGNED_FLAG else 1
        precision = field.column_length - sign - (1 if scale else 0)
    if scale > MAX_DECIMAL_PRECISION:
        raise StagingError(
            f"column {field.name!r} ({field.column_type or 'DECIMAL'}): scale {scale} is more than "
            f"Parquet's decimal can hold ({MAX_DECIMAL_PRECISION} digits)"
        )
    # A derived precision can only be off for odd metadata: widen it rather than lose digits.
    return min(max(precision, scale, 1), MAX_DECIMAL_PRECISION), scale


def arrow_type(field: query_pb2.Field) -> pa.DataType:
    """The Arrow type a column of ``field`` is staged as."""
    type_ = field.type
    if type_ in _TEXT_TYPES or (type_ in _BINARY_STRING_TYPES and field.charset not in (0, BINARY_CHARSET)):
        return pa.binary() if field.charset == BINARY_CHARSET else pa.string()
    if type_ == T.DECIMAL:
        precision, scale = decimal_precision_scale(field)
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    # BINARY/VARBINARY/BLOB with the binary charset, and types newer than our protos, are bytes.
    return _FIXED.get(type_, pa.binary())


def is_nullable(field: query_pb2.Field) -> bool:
    return not field.flags & NOT_NULL_FLAG


# -- the staged row layout ---------------------------------------------------------------------

OP = "_op"
KEYSPACE = "_keyspace"
SHARD = "_shard"
COMMIT_TS = "_commit_ts"
SEQ = "_seq"
BEFORE_PREFIX = "_before_"
# Last staged column: the columns a partial row image left out (NULL: a whole image); see
# staging/row_images.py. Staged files from before it read it as NULL.
ABSENT = "_absent"
ABSENT_TYPE = pa.list_(pa.string())
# Never NULL, hence not nullable: a consumer can rely on them.
META_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(KEYSPACE, pa.string(), nullable=False),
    pa.field(SHARD, pa.string(), nullable=False),
    pa.field(COMMIT_TS, pa.int64(), nullable=False),
    pa.field(SEQ, pa.int64(), nullable=False),
)


def staged_schema(table: str, fields: Sequence[query_pb2.Field], key_columns: Sequence[str]) -> pa.Schema:
    """Metadata columns, then the after image, then ``_before_<key column>``, then ``_absent``.

    Image columns are nullable whatever the source says: a delete has no after image and an
    insert no before image.
    """
    types = {f.name: arrow_type(f) for f in fields}
    out = list(META_FIELDS)
    out += [pa.field(f.name, types[f.name]) for f in fields]
    out += [pa.field(BEFORE_PREFIX + k, types[k]) for k in key_columns]
    out.append(pa.field(ABSENT, ABSENT_TYPE))
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise StagingError(
            f"table {table!r}: column name(s) {dup} clash with the staged layout's own columns "
            f"({', '.join(f.name for f in META_FIELDS)}, {BEFORE_PREFIX}<key column>, {ABSENT})"
        )
    return pa.schema(out)


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_EXCERPT else f"{text[:_MAX_EXCERPT]}...({len(text)} chars)"


# (values, describe) -> the values to convert instead, or None when there is nothing to repair.
Repair = Callable[[list[Any], Callable[[int], str]], "list[Any] | None"]


def to_array(
    values: list[Any],
    type_: pa.DataType,
    describe: Callable[[int], str],
    *,
    maybe_constant: bool = False,
    repair: Repair | None = None,
) -> pa.Array:
    """One column of Python values as an Arrow array of ``type_``.

    ``describe(i)`` names the table/column/row of value ``i`` for the error message; it is only
    called on failure, so the fast path is a single ``pa.array`` call. With ``maybe_constant``
    a column whose values are all equal (a C-level ``count``, ~1 ns a value) is built with
    ``pa.repeat`` instead of converting every value (~40-80 ns each). When Arrow refuses the
    values, ``repair`` may give others to convert instead (or raise its own error).
    """
    try:
        if maybe_constant and values and values.count(values[0]) == len(values):
            first = values[0]
            # A str enum (Operation) as its plain value: the scalar must be a str.
            value = first.value if isinstance(first, enum.Enum) else first
            return pa.repeat(pa.scalar(value, type_), len(values))
        return pa.array(values, type=type_)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        refused = exc
    # Outside the except block: a repair's own error is not chained to Arrow's.
    repaired = repair(values, describe) if repair is not None else None
    if repaired is None:
        raise _explain(values, type_, describe, refused) from refused
    return to_array(repaired, type_, describe, maybe_constant=maybe_constant)


def _explain(
    values: Sequence[Any], type_: pa.DataType, describe: Callable[[int], str], exc: Exception
) -> StagingError:
    """Slow path: find the first value Arrow refuses, to name it."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=type_)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as one:
            return StagingError(
                f"{describe(i)}: cannot stage value {_excerpt(value)} ({type(value).__name__}) as "
                f"Parquet {type_}: {one}"
            )
    return StagingError(f"{describe(0)}: cannot build a {type_} column: {type(exc).__name__}: {exc}")
