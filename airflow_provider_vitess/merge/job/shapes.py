"""The rows of a window in a target mode's shape (:mod:`...modes`): its metadata columns.

A plain mirror has none: its rows and statement are a keyed table's without them
(:class:`.strategies.Keyed`). Every write is one Delta commit per (window, table) carrying the
sync's transaction id (app id, window seq), so a rerun after the commit is skipped by Delta,
whatever the mode:

* ``mirror`` with metadata columns and ``soft_delete``: the same per-key reduction as a mirror
  (:func:`.window_rows.last_per_key`), MERGEd with the metadata columns; ``soft_delete`` flags a
  deleted key (``deleted``, ``deleted_at`` = the delete's source commit time) instead of
  deleting it, and an insert of the key brings it back live. A key inserted and deleted in one
  window becomes a flagged row with its key only (its values were never merged).
* ``changelog``: every change of the window, in the merge's per-key order (the events of
  :func:`.window_rows.key_events`: an update that changes the key is a delete of the old key and an
  insert of the new one), appended (Delta skips an append whose transaction id it holds).
* ``history``: :mod:`.history`.

A snapshot (a replacing window) writes the copy: live rows (``soft_delete``, ``mirror``), current
versions with an unknown start (``history``), or ``snapshot`` rows appended (``changelog``: the
log keeps what it had). A re-snapshot of an existing table keeps a ``history``'s and a
``soft_delete``'s past (:mod:`.resnapshot`), except one for a changed column choice, which
replaces the table in every mode, a ``changelog`` too (its ``snapshot`` rows, in the copy's
schema, start the log afresh): the past holds what the new choice hides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import order, partial
from airflow_provider_vitess.merge.job.delta_sql import table as sql_table
from airflow_provider_vitess.merge.job.window_rows import CHANGE, DELETE, OP, ORD, UPSERT, col, key_events
from airflow_provider_vitess.merge.job.window_rows import SHARD as EVENT_SHARD
from airflow_provider_vitess.merge.modes import (
    CDF_PROPERTY,
    COMMIT_TS,
    CURRENT,
    DELETED,
    DELETED_AT,
    ORDER,
    SHARD,
    SYNCED_AT,
    VALID_FROM,
    VALID_TO,
    WINDOW_SEQ,
    TargetShape,
)
from airflow_provider_vitess.merge.modes import OP as OP_ROLE
from airflow_provider_vitess.staging import arrow_types as A

SNAPSHOT_OP = "snapshot"  # a changelog row of a snapshot's copy
ROLE_TYPES: Mapping[str, T.DataType] = {
    OP_ROLE: T.StringType(),
    COMMIT_TS: T.TimestampType(),
    WINDOW_SEQ: T.LongType(),
    SYNCED_AT: T.TimestampType(),
    DELETED: T.BooleanType(),
    DELETED_AT: T.TimestampType(),
    VALID_FROM: T.TimestampType(),
    VALID_TO: T.TimestampType(),
    CURRENT: T.BooleanType(),
    SHARD: T.StringType(),
    ORDER: T.LongType(),
}


def meta_fields(shape: TargetShape) -> list[T.StructField]:
    return [
        T.StructField(shape.name(r), ROLE_TYPES[r], True, _marker(shape, i))
        for i, r in enumerate(shape.roles())
    ]


def _marker(shape: TargetShape, i: int) -> dict[str, str]:
    """The first metadata column records the table's shape (:func:`...modes.shape_marker`)."""
    return shape.properties() if i == 0 else {}


def meta_columns(shape: TargetShape, values: Mapping[str, Column]) -> list[Column]:
    """The shape's metadata columns from their values by role, typed, the first one marked."""
    return [
        values[r].cast(ROLE_TYPES[r]).alias(shape.name(r), metadata=_marker(shape, i))
        for i, r in enumerate(shape.roles())
    ]


def properties(shape: TargetShape) -> dict[str, str]:
    """The table properties a table is created with: Change Data Feed, the chosen features."""
    return {**({CDF_PROPERTY: "true"} if shape.change_data_feed else {}), **shape.feature_properties()}


def commit_time(seconds: Column) -> Column:
    """A staged commit second as a timestamp; NULL for a copied row (0: no binlog time)."""
    return F.when(seconds > 0, F.timestamp_seconds(seconds)).cast(T.TimestampType())


def typed_null(role: str) -> Column:
    return F.lit(None).cast(ROLE_TYPES[role])


def set_change_data_feed(
    spark: SparkSession, path: str, shape: TargetShape, props: Mapping[str, str]
) -> None:
    """Turn Change Data Feed on or off on an existing table when the option changed (its own
    commit, before the window's; repeating it is a no-op)."""
    have = props.get(CDF_PROPERTY, "false").lower() == "true"
    if have != shape.change_data_feed:
        value = "true" if shape.change_data_feed else "false"
        spark.sql(f"ALTER TABLE {sql_table(path)} SET TBLPROPERTIES ('{CDF_PROPERTY}' = '{value}')")


# -- replace (a snapshot) and truncate --------------------------------------------------------------


def replace_rows(final: DataFrame, data: Sequence[Column], shape: TargetShape, seq: int) -> DataFrame:
    """The copy's rows (``final``'s upserts, from ``last_per_key(meta=True)``) in ``shape``."""
    values = {
        OP_ROLE: col(CHANGE),
        COMMIT_TS: commit_time(col(A.COMMIT_TS)),
        WINDOW_SEQ: F.lit(seq).cast(T.LongType()),
        SYNCED_AT: F.current_timestamp(),
        DELETED: F.lit(False),
        DELETED_AT: typed_null(DELETED_AT),
        VALID_FROM: commit_time(col(A.COMMIT_TS)),  # a copied row: since an unknown time
        VALID_TO: typed_null(VALID_TO),
        CURRENT: F.lit(True),
    }
    rows = final.where(col(OP) == UPSERT)
    return rows.select(*data, *meta_columns(shape, values))


def empty_rows(spark: SparkSession, schema: T.StructType, shape: TargetShape) -> DataFrame:
    return spark.createDataFrame([], T.StructType([*schema.fields, *meta_fields(shape)]))


# -- mirror with metadata columns, soft_delete -------------------------------------------------------


def merge_rows(final: DataFrame, types: Mapping[str, T.DataType], shape: TargetShape, seq: int) -> DataFrame:
    """``final`` (``last_per_key(meta=True)``) as the MERGE's source: the data cast to the
    table's types, ``_keep_*`` (:mod:`.partial`) and the metadata columns' values."""
    is_delete = col(OP) == DELETE
    ts = commit_time(col(A.COMMIT_TS))
    values = {
        OP_ROLE: col(CHANGE),
        COMMIT_TS: ts,
        WINDOW_SEQ: F.lit(seq).cast(T.LongType()),
        SYNCED_AT: F.current_timestamp(),
        DELETED: is_delete,
        DELETED_AT: F.when(is_delete, ts),
    }
    keep = [col(c) for c in final.columns if c.startswith(partial.KEEP)]
    return final.select(
        col(OP),
        *[col(n).cast(t).alias(n) for n, t in types.items()],
        *keep,
        *meta_columns(shape, values),
    )


# -- changelog ---------------------------------------------------------------------------------------


def changelog_rows(
    staged: DataFrame,
    keys: Sequence[str],
    schema: T.StructType,
    shape: TargetShape,
    seq: int,
    snapshot: bool,
    retired: Mapping[str, Sequence[str]] | None = None,
    copies_at: Mapping[str, int] | None = None,
) -> DataFrame:
    """One row per change of the window at each key it touches, in the table's columns
    (``schema``: the data columns; one the window lacks, a dropped column, is NULL), in the
    merge's per-key order (``retired``: a reshard's, ``copies_at``: a grouped snapshot's copy
    ends, :func:`.order.key_order`)."""
    data = [c for c in schema.fieldNames() if c in staged.columns]
    events = order.key_order(key_events(staged, keys, data), keys, retired, copies_at=copies_at)
    values = {
        OP_ROLE: F.lit(SNAPSHOT_OP) if snapshot else col(CHANGE),
        COMMIT_TS: commit_time(col(A.COMMIT_TS)),
        WINDOW_SEQ: F.lit(seq).cast(T.LongType()),
        SHARD: col(EVENT_SHARD),
        ORDER: col(ORD),
        SYNCED_AT: F.current_timestamp(),
    }
    out = [
        (col(f.name) if f.name in data else F.lit(None)).cast(f.dataType).alias(f.name) for f in schema.fields
    ]
    return events.select(*out, *meta_columns(shape, values))
