"""Columns a partial row image left out: the merge keeps their earlier value.

With ``binlog_row_image=NOBLOB`` an UPDATE's after image leaves out the BLOB/TEXT columns the
statement did not set; the stager lists them in the row's ``_absent`` column
(:mod:`airflow_provider_vitess.staging.row_images`, which refuses every image it cannot
complete). Such a column is unchanged, not NULL. So, for each BLOB/TEXT/JSON column of the table:

* ``read_window`` adds ``_has_<column>``: whether the row's image has the column (a delete's
  before image has none; a staged file from before ``_absent`` existed has every column);
* per key and shard, the column's value is the one of the shard's latest event that has it
  (an INSERT always does, so a row re-inserted never takes a value from before its delete);
* when none of the events read has it, ``_keep_<column>`` is set and the MERGE keeps the Delta
  row's value. A snapshot, or a key the Delta table does not hold, has no value to keep: that
  is an error, never a NULL (it cannot happen from a real binlog: an UPDATE of a row follows
  the copy or INSERT of it).

Only tables with such columns pay for this: one more expression per column in the window
functions the merge runs anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.schema import Conversion, WindowColumns
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.manifest import TableManifest
from airflow_provider_vitess.staging.row_images import BLOB_TYPES

HAS, KEEP = "_has_", "_keep_"
ABSENT_FIELD = T.StructField(A.ABSENT, T.ArrayType(T.StringType()))


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def candidates(tm: TableManifest, wc: WindowColumns) -> list[str]:
    """Target names of the columns a NOBLOB image can leave out in some version of the table."""
    out = []
    for c in wc.columns:
        for schema, version in zip(tm.schemas, wc.versions, strict=True):
            v = version.get(c.name)
            types = {s.name: s.type for s in schema.columns}
            if v is not None and v.conversion != Conversion.NULL and types.get(v.source) in BLOB_TYPES:
                out.append(c.name)
                break
    return out


def has_columns(wc: WindowColumns, version_index: int, names: Sequence[str]) -> list[Column]:
    """``_has_<name>`` for a version's staged rows (read with :data:`ABSENT_FIELD`)."""
    version = wc.versions[version_index]
    out = []
    for name in names:
        v = version.get(name)
        if v is None or v.conversion == Conversion.NULL:
            has = F.lit(True)
        else:
            has = ~F.coalesce(F.array_contains(F.col(q(A.ABSENT)), v.source), F.lit(False))
        out.append(has.alias(HAS + name))
    return out


def in_frame(frame: DataFrame, data: Sequence[str]) -> list[str]:
    """The data columns ``frame`` says may be left out (it has their ``_has_`` column)."""
    return [c for c in data if HAS + c in frame.columns]


def has_value(frame: DataFrame, name: str, after: bool) -> Column:
    """An event's ``_has_<name>``: a before-image (delete) event has no value; a context frame
    without the column (its window had no such column) has every value."""
    if not after:
        return F.lit(False).alias(HAS + name)
    if HAS + name not in frame.columns:
        return F.lit(True).alias(HAS + name)
    return F.coalesce(F.col(q(HAS + name)), F.lit(True)).alias(HAS + name)


def carry(events: DataFrame, names: Sequence[str], by_shard: WindowSpec) -> DataFrame:
    """Each partial column's value: the shard's latest event that has it, else ``_keep_``.
    ``by_shard`` orders a (key, shard)'s events latest first."""
    whole = by_shard.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    for name in names:
        latest = F.first(
            F.when(F.col(q(HAS + name)), F.struct(F.col(q(name)).alias("v"))), ignorenulls=True
        ).over(whole)
        events = events.withColumn(KEEP + name, latest.isNull()).withColumn(name, latest["v"])
    return events


def keep_guard(names: Sequence[str], table: str, op: Column, up: Column) -> Column:
    """For a replacing write (a snapshot): an upsert with a value to keep is an error."""
    if not names:
        return op
    keep = F.lit(False)
    for name in names:
        keep = keep | F.col(q(KEEP + name))
    left_out = F.concat_ws(", ", *[F.when(F.col(q(KEEP + n)), F.lit(n)) for n in names])
    message = F.concat(
        F.lit(
            f"table {table!r}: an UPDATE's partial row image (binlog_row_image=NOBLOB) left out column(s) "
        ),
        left_out,
        F.lit(
            " and the window read no earlier value of them for the row; nothing was written. Remedy: "
            "re-snapshot the table (resnapshot_tables)"
        ),
    )
    return F.when(up & keep, F.raise_error(message)).otherwise(op)


def set_value(name: str, value: str, keep: Sequence[str]) -> str:
    """The MERGE's UPDATE SET value of ``name``: the Delta row's own when the window has none."""
    if name not in keep:
        return value
    return f"CASE WHEN s.{q(KEEP + name)} THEN t.{q(name)} ELSE {value} END"


def insert_value(name: str, value: str, typed: str, keep: Sequence[str], table: str) -> str:
    """The MERGE's INSERT value of ``name``: a value to keep without a Delta row is an error."""
    if name not in keep:
        return value
    text = (
        f"table {table!r} column {name!r}: an UPDATE's partial row image (binlog_row_image=NOBLOB) left "
        "it out and the Delta table has no row to keep its value from: it is not the table this sync "
        "built. Remedy: re-snapshot the table (resnapshot_tables)"
    )
    literal = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"CASE WHEN s.{q(KEEP + name)} THEN CAST(raise_error({literal}) AS {typed}) ELSE {value} END"
