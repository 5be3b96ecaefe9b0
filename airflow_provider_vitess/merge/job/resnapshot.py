"""A re-snapshot of a ``history``, ``soft_delete`` or ``changelog`` table that exists: the past stays.

A snapshot's copy says what the table holds at the copy, not what happened since the sync's last
merged change: a change in between is seen only as a difference. So the table is rewritten,
as one commit carrying the window's transaction id, from what it holds and the copy:

* ``history``: every closed version stays as it is. A key's current version that the copy
  holds with the same values stays current (a re-snapshot adds no version where nothing
  changed); one it holds with other values is closed at the copy's second and the copy's row
  starts a version there (``op`` update); one the copy lacks is closed there as deleted. A key
  only the copy holds (new, or deleted earlier and back) starts a version there (``op`` insert).
* ``soft_delete``: the copy's rows are the live rows (flags reset); a key the copy lacks stays,
  flagged deleted (a tombstone keeps its ``deleted_at``; a live row becomes one, deleted at the
  copy's second, ``op`` delete, ``commit_ts`` NULL: the delete's own time is unknown).

The copy's second (:func:`copy_second`) is the snapshot window's plan time: every change the sync
merged before committed before it, every change read after the copy after it. A key's new
version, close or delete is never dated before the latest time its rows hold (a worker clock
behind the source's), so a key's versions never overlap.

* ``changelog``: the copy's rows are appended to the log (``op`` snapshot). Only when a column's
  type changed (the copy's type is not the log's) is the log rewritten, in the same commit: its
  earlier rows as they were, their values cast to the new type as below (:func:`log_rows`), then
  the copy's rows; an append alone would fail on the log's old type, run after run.

Columns: those of the copy, in its order (:func:`.steps.kept_schema`), then in ``history`` those
the source dropped. A column whose type the table cannot hold any longer (a type change that is
no widening, e.g. INT -> VARCHAR) takes the copy's type, and the past's values are cast to it
when the cast keeps every value (it casts back to the same value: INT 12 -> '12'); a value that
does not survive it (VARCHAR 'abc' -> INT) fails the merge before anything is written, naming the
table, column and value, with the remedy: a new target location (the old table stays as it is).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.schema import can_widen
from airflow_provider_vitess.merge.job.shapes import commit_time, meta_columns, typed_null
from airflow_provider_vitess.merge.job.window_rows import CHANGE, col
from airflow_provider_vitess.merge.modes import (
    COMMIT_TS,
    CURRENT,
    DELETED,
    DELETED_AT,
    OP,
    SYNCED_AT,
    VALID_FROM,
    VALID_TO,
    WINDOW_SEQ,
    TargetMode,
    TargetShape,
)
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.manifest import Manifest

_S = "_copy_"  # the copy's columns in the join, by this prefix
_AT = "_at"  # the key's second of the re-snapshot


def copy_second(manifest: Manifest) -> int:
    """The second a re-snapshot's findings are dated at (module docstring): the window's plan
    time, else (a window staged before it was recorded) its manifest's creation, else now."""
    if manifest.copy_started_at:
        return manifest.copy_started_at
    if manifest.created_at:
        return int(datetime.datetime.fromisoformat(manifest.created_at).timestamp())
    return int(time.time())


def rows(
    old: DataFrame,
    copy: DataFrame | None,
    keys: Sequence[str],
    schema: T.StructType,
    past: T.StructType,
    shape: TargetShape,
    seq: int,
    table: str,
    at: int,
) -> DataFrame:
    """The table's rows after the re-snapshot (module docstring). ``old``: its rows before (as
    the table format reads them), ``copy``: the copy's rows (data
    columns, ``_commit_ts``, ``_change``; None: the copy holds no row), ``schema``: the data
    schema after the step, ``past``: before it, ``at``: :func:`copy_second`."""
    have = set(old.columns)
    meta = [shape.name(r) for r in shape.roles()]
    old = old.select(*[_past_value(f, past, have, table) for f in schema.fields], *map(col, meta))
    if copy is None:
        extra = [T.StructField(A.COMMIT_TS, T.LongType()), T.StructField(CHANGE, T.StringType())]
        copy = old.sparkSession.createDataFrame([], T.StructType([*schema.fields, *extra]))
    compared = [c for c in copy.columns if c in schema.fieldNames() and c not in keys]
    s = copy.select(
        *[
            (col(f.name).cast(f.dataType) if f.name in copy.columns else F.lit(None).cast(f.dataType)).alias(
                _S + f.name
            )
            for f in schema.fields
        ],
        col(A.COMMIT_TS).alias(_S + A.COMMIT_TS),
        col(CHANGE).alias(_S + CHANGE),
        F.lit(True).alias(_S + "in"),
    )
    on = reduce(lambda a, b: a & b, [col(k).eqNullSafe(col(_S + k)) for k in keys])
    if shape.mode is TargetMode.HISTORY:
        return _history(old, s, on, keys, compared, schema, shape, seq, at)
    return _soft_delete(old, s, on, schema, shape, seq, at)


def log_rows(
    old: DataFrame, schema: T.StructType, past: T.StructType, shape: TargetShape, table: str
) -> DataFrame:
    """A changelog's rows ``old`` as they are, in ``schema``'s columns (cast from ``past``'s types,
    losslessly or failing: :func:`_past_value`), with its metadata columns."""
    have = set(old.columns)
    meta = [shape.name(r) for r in shape.roles()]
    return old.select(*[_past_value(f, past, have, table) for f in schema.fields], *map(col, meta))


def _past_value(f: T.StructField, past: T.StructType, have: set[str], table: str) -> Column:
    """Column ``f`` of the table's rows: NULL where they lack it (added by the copy), cast where
    its type changed, losslessly or failing (module docstring)."""
    name, new = f.name, f.dataType
    before = next((p.dataType for p in past.fields if p.name == name), None)
    if before is None or name not in have:
        return F.lit(None).cast(new).alias(name)
    if before == new:
        return col(name)
    if can_widen(before, new):
        return col(name).cast(new).alias(name)
    value, to, back = q(name), new.simpleString(), before.simpleString()
    cast = F.expr(f"try_cast({value} AS {to})")
    round_trip = F.expr(f"try_cast(try_cast({value} AS {to}) AS {back})")
    lost = col(name).isNotNull() & ~round_trip.eqNullSafe(col(name))
    message = F.concat(
        F.lit(
            f"table {table!r} column {name!r}: the re-snapshot's copy has type {to}, and the "
            f"table's {back} value '"
        ),
        col(name).cast(T.StringType()),
        F.lit(
            "' of an earlier version or deleted row does not survive a cast to it, so the table's "
            "past cannot be kept in that column; nothing was written. Give the table a new target "
            "location (targets[table]['path'] or target_location) and run the DAG again: the "
            "snapshot is merged there and the old table stays as it is"
        ),
    )
    return F.when(lost, F.raise_error(message)).otherwise(cast).alias(name)


def _history(
    old: DataFrame,
    s: DataFrame,
    on: Column,
    keys: Sequence[str],
    compared: Sequence[str],
    schema: T.StructType,
    shape: TargetShape,
    seq: int,
    at: int,
) -> DataFrame:
    current, valid_from, valid_to = (shape.name(r) for r in (CURRENT, VALID_FROM, VALID_TO))
    # The latest time each key's rows hold: its re-snapshot is dated no earlier.
    latest = old.groupBy(*[col(k).alias(_AT + k) for k in keys]).agg(
        F.max(F.greatest(col(valid_from), col(valid_to))).alias("_latest")
    )
    joined = old.where(col(current)).withColumn("_t_in", F.lit(True)).join(s, on, "full")
    in_t, in_s = col("_t_in").isNotNull(), col(_S + "in").isNotNull()
    joined = joined.withColumns({"_k" + k: F.when(in_t, col(k)).otherwise(col(_S + k)) for k in keys})
    by_key = reduce(lambda a, b: a & b, [col("_k" + k).eqNullSafe(col(_AT + k)) for k in keys])
    joined = joined.join(latest, by_key, "left")
    at_ts = F.greatest(F.timestamp_seconds(F.lit(at)), col("_latest"))
    same = in_t & in_s
    for c in compared:
        same = same & col(c).eqNullSafe(col(_S + c))
    old_meta = {r: col(shape.name(r)) for r in shape.roles()}
    kept = joined.where(same).select(*[col(f.name) for f in schema.fields], *meta_columns(shape, old_meta))
    closed_meta = {**old_meta, VALID_TO: at_ts, CURRENT: F.lit(False), DELETED: ~in_s}
    closed = joined.where(in_t & ~same).select(
        *[col(f.name) for f in schema.fields], *meta_columns(shape, closed_meta)
    )
    new_meta: Mapping[str, Column] = {
        OP: F.when(in_t, F.lit("update")).otherwise(F.lit("insert")),
        COMMIT_TS: commit_time(col(_S + A.COMMIT_TS)),
        WINDOW_SEQ: F.lit(seq),
        SYNCED_AT: F.current_timestamp(),
        VALID_FROM: F.greatest(at_ts, commit_time(col(_S + A.COMMIT_TS))),
        VALID_TO: typed_null(VALID_TO),
        CURRENT: F.lit(True),
        DELETED: F.lit(False),
    }
    started = joined.where(in_s & ~same).select(
        *[col(_S + f.name).alias(f.name) for f in schema.fields], *meta_columns(shape, new_meta)
    )
    ended = old.where(~col(current))  # closed versions: as they are
    return reduce(DataFrame.unionByName, [ended, kept, closed, started])


def _soft_delete(
    old: DataFrame, s: DataFrame, on: Column, schema: T.StructType, shape: TargetShape, seq: int, at: int
) -> DataFrame:
    deleted, deleted_at = shape.name(DELETED), shape.name(DELETED_AT)
    joined = old.join(s, on, "full")
    in_t, in_s = col(deleted).isNotNull(), col(_S + "in").isNotNull()
    old_meta = {r: col(shape.name(r)) for r in shape.roles()}
    # A row the sync held live: deleted at the copy's second, never before its own last change.
    when = F.timestamp_seconds(F.lit(at))
    if COMMIT_TS in shape.roles():
        when = F.greatest(when, col(shape.name(COMMIT_TS)))
    was, none = col(deleted), F.lit(None)  # a tombstone already: it stays as it is
    tombstone = {
        **old_meta,
        OP: F.when(was, old_meta.get(OP, none)).otherwise(F.lit("delete")),
        COMMIT_TS: F.when(was, old_meta.get(COMMIT_TS, none)),
        WINDOW_SEQ: F.when(was, old_meta.get(WINDOW_SEQ, none)).otherwise(F.lit(seq)),
        SYNCED_AT: F.when(was, old_meta.get(SYNCED_AT, none)).otherwise(F.current_timestamp()),
        DELETED: F.lit(True),
        DELETED_AT: F.when(was, col(deleted_at)).otherwise(when),
    }
    gone = joined.where(in_t & ~in_s).select(
        *[col(f.name) for f in schema.fields], *meta_columns(shape, tombstone)
    )
    live_meta = {
        OP: col(_S + CHANGE),
        COMMIT_TS: commit_time(col(_S + A.COMMIT_TS)),
        WINDOW_SEQ: F.lit(seq),
        SYNCED_AT: F.current_timestamp(),
        DELETED: F.lit(False),
        DELETED_AT: typed_null(DELETED_AT),
    }
    live = joined.where(in_s).select(
        *[col(_S + f.name).alias(f.name) for f in schema.fields], *meta_columns(shape, live_meta)
    )
    return gone.unionByName(live)
