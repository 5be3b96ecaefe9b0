"""A window's staged rows in Spark, and the rule that reduces them to one change per key.

Every target mode reads its rows here (:func:`read_window`) and ranks them by the same rule
(:func:`key_events`, :func:`last_per_key`); the writes are :mod:`.apply`'s.

Needs a SparkSession with Delta Lake (see :mod:`.spark_conf`), classic or Spark Connect (the
table state then comes from :mod:`.connect`, which needs no JVM); executors need only
PySpark (the one Python function shipped to them, for DECIMAL(p > 38) text, has no imports of
this provider).

The rule per key (the same as ``tests/support/replay.py`` and the README): a staged row is an
event at its after-image key (an upsert; not for deletes) and, for updates and deletes, at its
before-image key (a delete; skipped for an update that keeps its key). Within a shard, events are
in binlog order (``_seq``; a before-image delete precedes its own row's upsert), so each shard's
last event for the key says whether that shard holds the row at the end of the window. A key
lives on one shard at a time, so the row exists if any shard's last event is an upsert, and the
latest such upsert gives its values; otherwise it is deleted. A row moved between shards is a
DELETE on one and an INSERT on the other, in either order and possibly in different seconds: it
exists afterwards whatever the cross-shard order. No timestamp is compared.

The two halves of a move are two shard commits, so a window's stop position can fall between them
(the stop is read per shard). The shard that still holds the row may then have its event in an
earlier window: ``context`` brings those events (:mod:`.lookback`), ordered before the window's
own, so they count as their shard's last event only when the window has none for that shard.

A reshard retires shards: their events all precede the journal, and the shards that took over
their keys (``retired``: old shard -> its successors) start from a copy with no event for the
keys they received. So a retired shard's last event counts only when no successor has an event
for the key: a row inserted on shard ``0`` and deleted on ``-80`` after the switch is deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import conflicts, order, partial
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.lookback import SEQ_SHIFT
from airflow_provider_vitess.merge.job.schema import Conversion, TargetColumn, WindowColumns
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.files import window_dir
from airflow_provider_vitess.staging.manifest import Manifest, TableManifest

OP = "_op"  # in the per-key frame: "upsert" or "delete" (a name no staged column may have)
UPSERT, DELETE = "upsert", "delete"
# Columns of the per-key events (:func:`key_events`): the shard, the staged order (a before-image
# delete precedes its own row's upsert), whether the event leaves the key existing on its shard,
# and whether it is a look-back context's (not this window's).
SHARD, ORD, UP, CTX = "_shard", "_ord", "_up", "_ctx"
CHANGE = "_change"  # per key event: insert, update or delete (target modes' metadata, .shapes)


def col(name: str, alias: str | None = None) -> Column:
    return F.col(f"{alias}.{q(name)}" if alias else q(name))


# -- reading a window ------------------------------------------------------------------------------


def _decimal_text(scale: int) -> Callable[[Any], str | None]:
    """Big-endian two's-complement unscaled bytes -> the decimal printed with ``scale`` digits.
    A closure, so Spark ships it by value: executors need no import of this provider."""

    def convert(raw: Any) -> str | None:
        if raw is None:
            return None
        n = int.from_bytes(bytes(raw), "big", signed=True)
        digits = tuple(int(c) for c in str(abs(n)))
        return format(Decimal((1 if n < 0 else 0, digits, -scale)), "f")

    return convert


def _value(c: TargetColumn, staged_name: str, unified: T.DataType) -> Column:
    if c.conversion is Conversion.NULL:
        return F.lit(None).cast(unified)
    source = col(staged_name)
    if c.conversion is Conversion.DECIMAL_TEXT:
        source = F.udf(_decimal_text(c.scale), T.StringType(), useArrow=False)(source)
    return source.cast(unified)


def staged_path(manifest: Manifest, relative: str) -> str:
    """Where Spark reads a part: the staging location as given (a path or a Hadoop URL)."""
    return f"{window_dir(manifest.location, manifest.sync_id, manifest.window_seq)}/{relative}"


def read_window(
    spark: SparkSession,
    manifest: Manifest,
    tm: TableManifest,
    wc: WindowColumns,
    *,
    context_of: int | None = None,
    earlier: Sequence[Manifest] = (),
) -> DataFrame:
    """The table's staged rows: ``_op``, ``_shard``, ``_commit_ts``, ``_seq``, the unified
    columns (target names, unified types), ``_before_<target key>`` for each target key and
    ``_has_<column>`` for each column a partial row image may leave out (:mod:`.partial`).

    ``context_of``: the rows are a look-back's context for that later window (:mod:`.lookback`):
    ``_seq`` moves :data:`.lookback.SEQ_SHIFT` lower per window back. ``earlier``: more windows
    of that context whose table has the same schema versions as ``tm``, read with ``manifest``
    in one scan per schema version: a chain of small windows then costs one file listing and one
    plan branch, not one each (one each made a look-back of ten windows ~2 s of a 5 s merge over
    Spark Connect)."""
    index = {s.to_json(): i for i, s in enumerate(tm.schemas)}
    groups: dict[int, list[str]] = {}
    for source, parts in ((manifest, tm.parts), *((e, e.tables[tm.table].parts) for e in earlier)):
        for part in parts:
            groups.setdefault(index[part.schema_json], []).append(staged_path(source, part.path))
    seq = col(A.SEQ)
    if context_of is not None:
        # Each row's window: its manifest's, or with ``earlier`` the directory of its file
        # (window_dir: ".../window=<seq, 10 digits>/<part>").
        window = F.lit(manifest.window_seq)
        if earlier:
            path = F.col("_metadata.file_path")
            window = F.regexp_extract(path, r".*/window=(\d{10})/", 1).cast(T.LongType())
        seq = seq + (window - F.lit(context_of)) * F.lit(SEQ_SHIFT)
    key_sources = dict(zip(wc.key_sources, (wc.column(k) for k in _key_names(wc)), strict=True))
    blobs = partial.candidates(tm, wc)
    frames = []
    for i, paths in sorted(groups.items()):
        version = wc.versions[i]
        by_source = {c.source: c for c in version.values()}
        fields = fields_of_meta()
        fields += [
            T.StructField(c.source, c.read_type) for c in version.values() if c.conversion != Conversion.NULL
        ]
        fields += [
            T.StructField(A.BEFORE_PREFIX + s, by_source[s].read_type)
            for s in wc.key_sources
            if by_source[s].conversion != Conversion.NULL
        ]
        if blobs:
            fields.append(partial.ABSENT_FIELD)
        df = spark.read.schema(T.StructType(fields)).parquet(*paths)
        out = [col(A.OP), col(A.SHARD), col(A.COMMIT_TS), seq.alias(A.SEQ)]
        for c in wc.columns:
            v = version.get(c.name)
            out.append((_value(v, v.source, c.type) if v else F.lit(None).cast(c.type)).alias(c.name))
        for s, unified in key_sources.items():
            out.append(
                _value(by_source[s], A.BEFORE_PREFIX + s, unified.type).alias(A.BEFORE_PREFIX + unified.name)
            )
        frames.append(df.select(*out, *partial.has_columns(wc, i, blobs)))
    if not frames:  # a snapshot of an empty table: its schema, no rows
        empty = [*fields_of_meta(), *[T.StructField(c.name, c.type) for c in wc.columns]]
        empty += [T.StructField(A.BEFORE_PREFIX + c.name, c.type) for c in key_sources.values()]
        empty += [T.StructField(partial.HAS + n, T.BooleanType()) for n in blobs]
        return spark.createDataFrame([], T.StructType(empty))
    return reduce(DataFrame.unionByName, frames)


def fields_of_meta() -> list[T.StructField]:
    return [
        T.StructField(A.OP, T.StringType()),
        T.StructField(A.SHARD, T.StringType()),
        T.StructField(A.COMMIT_TS, T.LongType()),
        T.StructField(A.SEQ, T.LongType()),
    ]


def _key_names(wc: WindowColumns) -> list[str]:
    names = {c.source: c.name for c in wc.columns}
    return [names[s] for s in wc.key_sources]


# -- the last event per key ------------------------------------------------------------------------


def key_events(
    frame: DataFrame, keys: Sequence[str], data: Sequence[str], partial_names: Sequence[str] | None = None
) -> DataFrame:
    """Each staged row as events at its keys: the after image (an upsert) and, for a delete or an
    update that changes the key, the before image's key (a delete)."""
    op = col(A.OP)
    blobs = partial.in_frame(frame, data) if partial_names is None else partial_names
    before_differs = reduce(lambda a, b: a | b, [~col(A.BEFORE_PREFIX + k).eqNullSafe(col(k)) for k in keys])
    after = frame.where(op != "delete").select(
        col(A.SEQ),
        col(A.COMMIT_TS),
        col(SHARD),
        F.lit(1).alias("_sub"),
        F.lit(True).alias(UP),
        # What the change is to this key: an update that changes the key inserts the new one.
        F.when((op == "update") & before_differs, F.lit("insert")).otherwise(op).alias(CHANGE),
        *[col(c) for c in data],
        *[partial.has_value(frame, c, after=True) for c in blobs],
    )
    before = frame.where((op == "delete") | ((op == "update") & before_differs)).select(
        col(A.SEQ),
        col(A.COMMIT_TS),
        col(SHARD),
        F.lit(0).alias("_sub"),
        F.lit(False).alias(UP),
        F.lit("delete").alias(CHANGE),
        *[
            col(A.BEFORE_PREFIX + c).alias(c)
            if c in keys
            else F.lit(None).cast(frame.schema[c].dataType).alias(c)
            for c in data
        ],
        *[partial.has_value(frame, c, after=False) for c in blobs],
    )
    # A before-image delete precedes its own row's upsert. The staged order, to be ranked per key
    # by :func:`.order.key_order` (the order the merge compares).
    return after.unionByName(before).withColumn(ORD, col(A.SEQ) * 2 + col("_sub"))


def last_per_key(
    staged: DataFrame,
    keys: Sequence[str],
    data: Sequence[str],
    context: DataFrame | None = None,
    retired: Mapping[str, Sequence[str]] | None = None,
    *,
    table: str = "",
    covered: Mapping[str, int] | None = None,
    replace: bool = False,
    meta: bool = False,
) -> DataFrame:
    """One row per key the window touches: ``_op`` (upsert/delete), the key and data columns (NULL
    for deletes). ``keys`` are target key column names (in ``data``); ``staged`` and ``context``
    have ``_before_<key>``, and ``context``'s ``_seq`` are below the window's (module docstring).
    A key two shards hold at once makes the first Spark action on the result fail
    (:mod:`.conflicts`; ``covered``: per shard, how far in commit seconds a catch-up window read
    it). Columns a partial row image left out take the shard's latest value, else
    ``_keep_<column>`` (:mod:`.partial`), an error for a ``replace`` (no Delta row to keep)."""
    blobs = partial.in_frame(staged, data)
    events = key_events(staged, keys, data, blobs).withColumn(CTX, F.lit(False))
    if context is not None:
        events = events.unionByName(key_events(context, keys, data, blobs).withColumn(CTX, F.lit(True)))
    by_key = Window.partitionBy(*[col(k) for k in keys])
    # The keys the window touches, ranked (a grouped snapshot's copies as of their group's end).
    ends = conflicts.copy_ends_of(covered)
    events = order.key_order(events, keys, retired, copies_at=ends)
    by_shard = Window.partitionBy(*[col(k) for k in keys], col(SHARD)).orderBy(col(ORD).desc())
    events = partial.carry(events, blobs, by_shard)
    shard_last = events.withColumn("_in_shard", F.row_number().over(by_shard)).where(col("_in_shard") == 1)
    for old, new in (retired or {}).items():
        superseded = F.max(F.when(col(SHARD).isin(list(new)), 1).otherwise(0)).over(by_key) == 1
        shard_last = (
            shard_last.withColumn("_superseded", (col(SHARD) == old) & superseded)
            .where(~col("_superseded"))
            .drop("_superseded")
        )
    # A shard holding the row (its last event an upsert) wins, the latest of them; else the latest.
    ranked = shard_last.withColumn(
        "_rank", F.row_number().over(by_key.orderBy(col(UP).desc(), col(ORD).desc()))
    )
    op = F.when(col(UP), F.lit(UPSERT)).otherwise(F.lit(DELETE))
    if replace:  # no Delta row to keep a left-out value from
        op = partial.keep_guard(blobs, table, op, col(UP))
    ranked = ranked.withColumn("_guarded", conflicts.guarded_op(keys, table, covered or {}, op))
    keep = [col(partial.KEEP + c) for c in blobs]
    extra = [col(A.COMMIT_TS), col(CHANGE)] if meta else []  # the deciding event's (.shapes)
    return ranked.where(col("_rank") == 1).select(col("_guarded").alias(OP), *map(col, data), *keep, *extra)


def with_comments(wc: WindowColumns) -> list[Column]:
    """The window's columns as the table has them, each with its source column's comment."""
    return [
        col(c.name).alias(c.name, metadata={"comment": c.comment} if c.comment else {}) for c in wc.columns
    ]
