"""Staged Parquet types -> Delta column types, and the schema decisions of a merge (pure).

Each staged column (:class:`~airflow_provider_vitess.staging.manifest.ColumnSchema`, its Arrow
type per :mod:`airflow_provider_vitess.staging.arrow_types`) lands in Delta as:

=================================  ========================  =====================================
MySQL (query.Type)                 staged Arrow              Delta / Spark
=================================  ========================  =====================================
TINYINT / SMALLINT / YEAR          int8 / int16              TINYINT / SMALLINT
MEDIUMINT / INT / BIGINT           int32 / int64             INT / BIGINT
TINYINT..MEDIUMINT UNSIGNED        uint8 / uint16 / uint32   SMALLINT / INT / BIGINT (next wider)
INT UNSIGNED                       uint32                    BIGINT
BIGINT UNSIGNED                    uint64                    DECIMAL(20,0)
DECIMAL(p,s), p <= 38              decimal128(p,s)           DECIMAL(p,s)
DECIMAL(p,s), p > 38               decimal256(p,s)           STRING: the exact value printed with
                                                             s decimals, as MySQL prints it
                                                             (Spark decimals stop at 38 digits)
FLOAT / DOUBLE                     float64                   DOUBLE
DATE                               date32                    DATE
DATETIME(n)                        timestamp[us]             TIMESTAMP_NTZ (microseconds)
TIMESTAMP(n)                       timestamp[us, UTC]        TIMESTAMP (the instant, microseconds)
TIME(n)                            duration[us]              BIGINT: signed microseconds
                                                             (-838:59:59 .. 838:59:59 does not fit
                                                             a time of day; Delta has no interval)
CHAR / VARCHAR / TEXT / JSON /     string                    STRING
ENUM / SET
BINARY / VARBINARY / BLOB          binary                    BINARY
BIT(n)                             binary                    BINARY: the big-endian bytes MySQL
                                                             returns (BIT(64) exceeds BIGINT)
=================================  ========================  =====================================

Spark reads Parquet's unsigned integers natively into the next wider signed type (UINT64 as
DECIMAL(20,0)), so the staged file is read with the Delta type itself, except DECIMAL(p > 38),
read as the raw two's-complement bytes and turned into text (see ``merge.apply``).

Schema changes between windows (and between the parts of one window) follow Delta's type
widening: a column may only become wider in place (TINYINT -> SMALLINT -> INT -> BIGINT, an
integer -> a DECIMAL that holds it, DECIMAL(p,s) -> DECIMAL(p+k, s+j) with k >= j >= 0,
TINYINT/SMALLINT/INT -> DOUBLE). A narrower incoming type is written into the wider column.
Anything else (VARCHAR -> INT, DATETIME -> TIMESTAMP, DECIMAL(30,2) -> DECIMAL(40,2) which
becomes text) is refused with :class:`MergeSchemaError` naming the table and column, before
anything is written; re-snapshotting the table (``resnapshot_tables``) takes the new type.
New source columns are added at the end (NULL in older rows).

A column the source dropped is dropped from the Delta table too, for every row at once: when a
merged window stages rows of the table and none of its schema versions has a Delta column (no
staged column lands in it), that column is dropped before the window's MERGE: the table is
rewritten once without it (one commit, as a widened column is rewritten), so that every Delta
reader still reads it. Delta's own ``ALTER TABLE ... DROP COLUMNS`` would need column mapping by
name, a reader feature Polars refuses and delta-rs's Arrow reader reads wrong (columns added after
it come back NULL); it is used only on a table that maps its columns by name already (a name that
needs it, or a table made so before). A rename at the source is a drop of the old name and an add of the
new one: the old column goes, the new one is NULL in rows not written since the rename (as any
added column). So after the window every row agrees: the column does not exist, as after a
re-snapshot of the table. A window that still stages rows with the column (written before the
DDL, or by a shard that has not run it yet) keeps it; the first merged window without it drops
it. A column that comes back is a new column, NULL in older rows (the dropped values stay gone).
A key column cannot be dropped this way: the window is refused (the key cannot be fed).

Why a drop and not "keep the column, NULL in every row": the decision depends only on the
Delta schema and the window, and its effect shows in the Delta schema, so a rerun after a crash
at any point decides again from what it finds (the column is there: drop it; gone: nothing to
do), like an added column, and ends with the same table; nothing needs to remember that a drop
was done. Setting every row NULL would rewrite the whole table in the window's MERGE commit and
need a marker, written in another commit, to not rewrite it again on each later window. The old
values stay in the replaced files (and in time travel) until ``VACUUM`` removes them (on a table
that maps its columns, until ``REORG TABLE ... APPLY (PURGE)`` rewrites them).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import types as T

from airflow_provider_vitess.exceptions import MergeSchemaError as MergeSchemaError
from airflow_provider_vitess.merge.plan import TableTarget
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.manifest import ColumnSchema, TableManifest, TableSchema

SPARK_MAX_DECIMAL_PRECISION = 38
# Delta refuses these in column names unless columns are mapped by name.
INVALID_NAME_CHARS = frozenset(" ,;{}()\n\t=")


class Conversion(enum.Enum):
    NONE = "none"  # read with the Delta type itself
    DECIMAL_TEXT = "decimal_text"  # read as the FIXED_LEN_BYTE_ARRAY decimal's bytes, print exactly
    NULL = "null"  # Arrow null column: nothing to read, always NULL


@dataclass(frozen=True)
class TargetColumn:
    """One column as it is read from a staged schema version and written to Delta."""

    name: str  # in Delta (after renames)
    source: str  # staged (source) column name
    type: T.DataType  # Delta type
    read_type: T.DataType  # how Spark reads the staged Parquet column
    conversion: Conversion = Conversion.NONE
    scale: int = 0  # DECIMAL_TEXT only
    comment: str = ""
    source_type: str = ""  # the MySQL column type, for messages

    def struct_field(self) -> T.StructField:
        return T.StructField(self.name, self.type, True, {"comment": self.comment} if self.comment else {})


_SIGNED: dict[int, T.DataType] = {8: T.ByteType(), 16: T.ShortType(), 32: T.IntegerType(), 64: T.LongType()}
_UNSIGNED: dict[int, T.DataType] = {
    8: T.ShortType(),
    16: T.IntegerType(),
    32: T.LongType(),
    64: T.DecimalType(20, 0),
}


def target_column(table: str, col: ColumnSchema, target: TableTarget | None = None) -> TargetColumn:
    """How staged column ``col`` is read and what Delta type it gets (module docstring)."""
    name = target.target_name(col.name) if target is not None else col.name
    what = col.column_type or col.type
    t, read, conversion, scale, comment = _types(table, col, arrow_types.arrow_type(col.to_field()), what)
    return TargetColumn(name, col.name, t, read, conversion, scale, comment, what)


def _types(
    table: str, col: ColumnSchema, arrow: pa.DataType, what: str
) -> tuple[T.DataType, T.DataType, Conversion, int, str]:
    if pa.types.is_integer(arrow):
        width = arrow.bit_width
        t = _SIGNED[width] if pa.types.is_signed_integer(arrow) else _UNSIGNED[width]
        return t, t, Conversion.NONE, 0, ""
    if pa.types.is_decimal(arrow):
        p, s = arrow.precision, arrow.scale
        if p <= SPARK_MAX_DECIMAL_PRECISION:
            return T.DecimalType(p, s), T.DecimalType(p, s), Conversion.NONE, 0, ""
        comment = f"MySQL {what}: the exact value as text (Spark decimals stop at 38 digits)"
        return T.StringType(), T.BinaryType(), Conversion.DECIMAL_TEXT, s, comment
    simple: T.DataType | None = None
    comment = ""
    if pa.types.is_floating(arrow):
        simple = T.FloatType() if arrow.bit_width == 32 else T.DoubleType()
    elif pa.types.is_date32(arrow):
        simple = T.DateType()
    elif pa.types.is_timestamp(arrow):
        simple = T.TimestampType() if arrow.tz else T.TimestampNTZType()
    elif pa.types.is_duration(arrow):
        simple, comment = T.LongType(), f"MySQL {what} as signed microseconds"
    elif pa.types.is_string(arrow) or pa.types.is_large_string(arrow):
        simple = T.StringType()
    elif pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        simple = T.BinaryType()
        comment = f"MySQL {what} as big-endian bytes" if col.type == "BIT" else ""
    elif pa.types.is_null(arrow):
        return T.StringType(), T.StringType(), Conversion.NULL, 0, ""
    if simple is None:
        raise MergeSchemaError(
            f"table {table!r} column {col.name!r}: staged type {arrow} ({what}) has no Delta type"
        )
    return simple, simple, Conversion.NONE, 0, comment


# -- widening ------------------------------------------------------------------------------------

_INTEGRAL_RANK: dict[type[T.DataType], int] = {T.ByteType: 0, T.ShortType: 1, T.IntegerType: 2, T.LongType: 3}
_INTEGRAL_DIGITS: dict[type[T.DataType], int] = {
    T.ByteType: 3,
    T.ShortType: 5,
    T.IntegerType: 10,
    T.LongType: 20,
}


def _integral(t: T.DataType) -> bool:
    return type(t) in _INTEGRAL_RANK


def can_widen(old: T.DataType, new: T.DataType) -> bool:
    """Whether a Delta column of type ``old`` may hold ``new`` values after an in-place widening
    that Delta's type widening supports (checked on Delta 4.4), or already holds them."""
    if old == new:
        return True
    if _integral(old) and _integral(new):
        return _INTEGRAL_RANK[type(old)] <= _INTEGRAL_RANK[type(new)]
    if isinstance(old, T.FloatType) and isinstance(new, T.DoubleType):
        return True
    if isinstance(new, T.DoubleType) and type(old) in (T.ByteType, T.ShortType, T.IntegerType):
        return True
    if _integral(old) and isinstance(new, T.DecimalType):
        return new.precision - new.scale >= _INTEGRAL_DIGITS[type(old)]
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


def wider(a: T.DataType, b: T.DataType) -> T.DataType | None:
    """The one of ``a``, ``b`` that the other widens to, or None."""
    if can_widen(a, b):
        return b
    if can_widen(b, a):
        return a
    return None


# -- a window's columns ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowColumns:
    """A table's columns over all the schema versions of one staged window.

    ``columns``: the unified columns (first-seen order, widest type). ``versions[i]`` maps the
    target names of schema version ``i`` (``TableManifest.schemas[i]``) to how that version's
    column is read; the reader casts each to the unified type and fills absent ones with NULL.
    """

    table: str
    columns: tuple[TargetColumn, ...]
    versions: tuple[Mapping[str, TargetColumn], ...]
    key_sources: tuple[str, ...]  # source columns feeding the target key, in target key order

    def column(self, name: str) -> TargetColumn:
        return next(c for c in self.columns if c.name == name)


def _incompatible(table: str, column: str, old: str, new: TargetColumn) -> MergeSchemaError:
    source = f" (source type {new.source_type})" if new.source_type else ""
    return MergeSchemaError(
        f"table {table!r} column {column!r}: the staged type {new.type.simpleString()}{source} cannot "
        f"be written to {old}: "
        "Delta can only widen a column in place (e.g. INT -> BIGINT, DECIMAL(10,2) -> "
        "DECIMAL(12,2)); nothing was written. Re-snapshot the table to take the new type: trigger the "
        f'DAG with {{"resnapshot_tables": ["{table}"]}} (its changes from before the copy are skipped; '
        "a history or soft_delete table keeps its past, cast to the new type)"
    )


def window_columns(tm: TableManifest, target: TableTarget) -> WindowColumns:
    """Unify the table's schema versions of a window and check the target key can be fed."""
    table = tm.table
    if not tm.schemas:
        raise MergeSchemaError(f"table {table!r}: the staged window has no schema for it")
    order: list[str] = []
    unified: dict[str, TargetColumn] = {}
    versions: list[dict[str, TargetColumn]] = []
    for schema in tm.schemas:
        _check_key_staged(table, schema, target)
        version: dict[str, TargetColumn] = {}
        for col in schema.columns:
            tc = target_column(table, col, target)
            if tc.name in version:
                raise MergeSchemaError(
                    f"table {table!r}: source columns {version[tc.name].source!r} and {col.name!r} "
                    f"both map to target column {tc.name!r}"
                )
            version[tc.name] = tc
            seen = unified.get(tc.name)
            if seen is None:
                order.append(tc.name)
                unified[tc.name] = tc
                continue
            w = wider(seen.type, tc.type)
            if w is None:
                raise _incompatible(table, tc.name, seen.type.simpleString(), tc)
            if w != seen.type:
                unified[tc.name] = tc
        versions.append(version)
    return WindowColumns(
        table, tuple(unified[n] for n in order), tuple(versions), tuple(target.key_from_source)
    )


def _check_key_staged(table: str, schema: TableSchema, target: TableTarget) -> None:
    names = set(schema.names)
    missing = [c for c in target.key_from_source if c not in names]
    if missing:
        raise MergeSchemaError(
            f"table {table!r}: target key column(s) {list(target.key_columns)} are fed by source "
            f"column(s) {missing} that the staged schema does not have (columns: {list(schema.names)})"
        )
    for key, source in zip(target.key_columns, target.key_from_source, strict=True):
        if target.target_name(source) != key:
            raise MergeSchemaError(
                f"table {table!r}: target key column {key!r} is fed by source column {source!r}, which "
                f"lands in column {target.target_name(source)!r}; add the rename {source!r} -> {key!r}"
            )
    unstaged = [c for c in target.key_from_source if c not in schema.key_columns]
    if unstaged:
        raise MergeSchemaError(
            f"table {table!r}: source column(s) {unstaged} feed the target key but their before image "
            f"is not staged (staged key columns: {list(schema.key_columns)}), so an update that changes "
            "them could not delete the old row; stage the table with that key"
        )


# -- evolution of a Delta table -------------------------------------------------------------------


@dataclass(frozen=True)
class Evolution:
    """What to change on an existing Delta table before writing a window to it."""

    table: str
    add: tuple[T.StructField, ...] = ()
    widen: tuple[tuple[str, T.DataType, T.DataType], ...] = ()  # (column, from, to)
    # Columns must be mapped by name first: for a name in INVALID_NAME_CHARS.
    column_mapping: bool = False
    result: T.StructType = field(default_factory=T.StructType)
    drop: tuple[str, ...] = ()  # Delta columns the source no longer has (module docstring)
    # The table maps columns by name (or is switched to it now): Delta drops ``drop`` in place.
    # Else the table is rewritten once without them, so no reader-locking feature is turned on.
    drop_in_place: bool = False

    @property
    def changes(self) -> list[str]:
        out = ["map columns by name"] if self.column_mapping else []
        out += [f"drop column {n}" for n in self.drop]
        out += [f"add column {f.name} {f.dataType.simpleString()}" for f in self.add]
        out += [f"widen column {n} {a.simpleString()} -> {b.simpleString()}" for n, a, b in self.widen]
        return out

    @property
    def empty(self) -> bool:
        return not (self.add or self.widen or self.column_mapping or self.drop)


def needs_column_mapping(names: Sequence[str]) -> bool:
    return any(INVALID_NAME_CHARS.intersection(n) for n in names)


def evolve(
    table: str,
    current: T.StructType,
    incoming: WindowColumns,
    *,
    column_mapping_enabled: bool = False,
) -> Evolution:
    """Columns to drop, add and widen so that ``current`` takes the window's columns and keeps no
    other (module docstring); raises :class:`MergeSchemaError` (table, column, both types) when
    a column cannot take them."""
    drop = dropped_columns(current, incoming)
    by_lower = {f.name.lower(): f for f in current.fields}
    fields = [f for f in current.fields if f.name not in drop]
    index = {f.name: i for i, f in enumerate(fields)}
    add: list[T.StructField] = []
    widen: list[tuple[str, T.DataType, T.DataType]] = []
    for col in incoming.columns:
        existing = by_lower.get(col.name.lower())
        if existing is None:
            f = col.struct_field()
            add.append(f)
            fields.append(f)
            continue
        if existing.name != col.name:
            raise MergeSchemaError(
                f"table {table!r}: staged column {col.name!r} differs only in case from Delta column "
                f"{existing.name!r} (Delta column names are case-insensitive)"
            )
        if can_widen(col.type, existing.dataType):
            continue  # same or narrower: written into the wider column
        if can_widen(existing.dataType, col.type):
            widen.append((col.name, existing.dataType, col.type))
            fields[index[col.name]] = T.StructField(col.name, col.type, True, existing.metadata)
            continue
        raise _incompatible(table, col.name, existing.dataType.simpleString(), col)
    mapping = not column_mapping_enabled and needs_column_mapping([f.name for f in add])
    in_place = bool(drop) and (column_mapping_enabled or mapping)
    return Evolution(table, tuple(add), tuple(widen), mapping, T.StructType(fields), drop, in_place)


def dropped_columns(current: T.StructType, incoming: WindowColumns) -> tuple[str, ...]:
    """The Delta columns none of the window's schema versions feeds: the source dropped or renamed
    them. Names compare case-insensitively, as Delta's do (a case-only rename is refused by
    :func:`evolve`, not dropped)."""
    fed = {c.name.lower() for c in incoming.columns}
    return tuple(f.name for f in current.fields if f.name.lower() not in fed)


def write_types(incoming: WindowColumns, result: T.StructType) -> dict[str, T.DataType]:
    """The Delta type each window column is cast to when written into ``result``."""
    types = {f.name: f.dataType for f in result.fields}
    return {c.name: types.get(c.name, c.type) for c in incoming.columns}
