"""The Spark side of the merge: staged parts -> the last event of each key -> one Delta commit.

Needs a SparkSession with Delta Lake (see :mod:`.spark_conf`), classic or Spark Connect (the
table state then comes from :mod:`.connect`, which needs no JVM); executors need only
PySpark (the one Python function shipped to them, for DECIMAL(p > 38) text, has no imports of
this provider).

The rule per key (the same as ``tests/integration/replay.py`` and the README): a staged row is an
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
earlier window: ``context`` brings those events (:mod:`.context`), ordered before the window's
own, so they count as their shard's last event only when the window has none for that shard.

A reshard retires shards: their events all precede the journal, and the shards that took over
their keys (``retired``: old shard -> its successors) start from a copy with no event for the
keys they received. So a retired shard's last event counts only when no successor has an event
for the key: a row inserted on shard ``0`` and deleted on ``-80`` after the switch is deleted.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import reduce
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import conflicts, delta_features, merge_sql, order, partial
from airflow_provider_vitess.merge.job.delta_log import forget_last_commit
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.pruning import (
    MAX_COLLECTED_KEYS,
    key_ranges,
    numeric_distance,
    sql_literal,
)
from airflow_provider_vitess.merge.job.schema import Conversion, Evolution, TargetColumn, WindowColumns
from airflow_provider_vitess.merge.spark_conf import COLUMN_MAPPING_PROPERTIES, TABLE_PROPERTIES
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.files import window_dir
from airflow_provider_vitess.staging.manifest import Manifest, TableManifest

OP = "_op"  # in the per-key frame: "upsert" or "delete" (a name no staged column may have)
UPSERT, DELETE = "upsert", "delete"
_SHARD, _ORD, _UP, _CTX = "_shard", "_ord", "_up", "_ctx"
CHANGE = "_change"  # per key event: insert, update or delete (target modes' metadata, .shapes)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


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


def read_window(spark: SparkSession, manifest: Manifest, tm: TableManifest, wc: WindowColumns) -> DataFrame:
    """The table's staged rows: ``_op``, ``_shard``, ``_commit_ts``, ``_seq``, the unified
    columns (target names, unified types), ``_before_<target key>`` for each target key and
    ``_has_<column>`` for each column a partial row image may leave out (:mod:`.partial`)."""
    index = {s.to_json(): i for i, s in enumerate(tm.schemas)}
    groups: dict[int, list[str]] = {}
    for part in tm.parts:
        groups.setdefault(index[part.schema_json], []).append(staged_path(manifest, part.path))
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
        out = [col(A.OP), col(A.SHARD), col(A.COMMIT_TS), col(A.SEQ)]
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


def _key_events(
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
        col(_SHARD),
        F.lit(1).alias("_sub"),
        F.lit(True).alias(_UP),
        # What the change is to this key: an update that changes the key inserts the new one.
        F.when((op == "update") & before_differs, F.lit("insert")).otherwise(op).alias(CHANGE),
        *[col(c) for c in data],
        *[partial.has_value(frame, c, after=True) for c in blobs],
    )
    before = frame.where((op == "delete") | ((op == "update") & before_differs)).select(
        col(A.SEQ),
        col(A.COMMIT_TS),
        col(_SHARD),
        F.lit(0).alias("_sub"),
        F.lit(False).alias(_UP),
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
    return after.unionByName(before).withColumn(_ORD, col(A.SEQ) * 2 + col("_sub"))


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
    events = _key_events(staged, keys, data, blobs).withColumn(_CTX, F.lit(False))
    if context is not None:
        events = events.unionByName(_key_events(context, keys, data, blobs).withColumn(_CTX, F.lit(True)))
    by_key = Window.partitionBy(*[col(k) for k in keys])
    # The keys the window touches, ranked (a grouped snapshot's copies as of their group's end).
    ends = conflicts.copy_ends_of(covered)
    events = order.key_order(events, keys, retired, copies_at=ends)
    by_shard = Window.partitionBy(*[col(k) for k in keys], col(_SHARD)).orderBy(col(_ORD).desc())
    events = partial.carry(events, blobs, by_shard)
    shard_last = events.withColumn("_in_shard", F.row_number().over(by_shard)).where(col("_in_shard") == 1)
    for old, new in (retired or {}).items():
        superseded = F.max(F.when(col(_SHARD).isin(list(new)), 1).otherwise(0)).over(by_key) == 1
        shard_last = (
            shard_last.withColumn("_superseded", (col(_SHARD) == old) & superseded)
            .where(~col("_superseded"))
            .drop("_superseded")
        )
    # A shard holding the row (its last event an upsert) wins, the latest of them; else the latest.
    ranked = shard_last.withColumn(
        "_rank", F.row_number().over(by_key.orderBy(col(_UP).desc(), col(_ORD).desc()))
    )
    op = F.when(col(_UP), F.lit(UPSERT)).otherwise(F.lit(DELETE))
    if replace:  # no Delta row to keep a left-out value from
        op = partial.keep_guard(blobs, table, op, col(_UP))
    ranked = ranked.withColumn("_guarded", conflicts.guarded_op(keys, table, covered or {}, op))
    keep = [col(partial.KEEP + c) for c in blobs]
    extra = [col(A.COMMIT_TS), col(CHANGE)] if meta else []  # the deciding event's (.shapes)
    return ranked.where(col("_rank") == 1).select(col("_guarded").alias(OP), *map(col, data), *keep, *extra)


# -- Delta --------------------------------------------------------------------------------------


def evolve_table(spark: SparkSession, path: str, ev: Evolution) -> None:
    """A step's schema changes before it writes, in every target mode (each its own commit;
    repeating them is a no-op). Refused before the first where the cluster's Delta cannot widen a
    column (:func:`.delta_features.require_type_widening`): a half-changed table otherwise.
    Dropping needs column mapping, which ``ev.column_mapping`` turns on first."""
    delta_features.require_type_widening(spark, ev.table, ev.widen)
    add, widen, column_mapping, drop = ev.add, [(n, b) for n, _, b in ev.widen], ev.column_mapping, ev.drop
    table = f"delta.{q(path)}"
    props = dict(TABLE_PROPERTIES)
    if column_mapping:
        props.update(COLUMN_MAPPING_PROPERTIES)
    if widen or column_mapping:
        sets = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({sets})")
    if drop:
        # IF EXISTS: the plan was made from the schema read when the run started.
        spark.sql(f"ALTER TABLE {table} DROP COLUMNS IF EXISTS ({', '.join(q(n) for n in drop)})")
    if add:
        cols = ", ".join(
            f"{q(f.name)} {f.dataType.simpleString()}"
            + (f" COMMENT '{_sql_string(f.metadata['comment'])}'" if f.metadata.get("comment") else "")
            for f in add
        )
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({cols})")
    for name, new in widen:
        spark.sql(f"ALTER TABLE {table} ALTER COLUMN {q(name)} TYPE {new.simpleString()}")


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def write_replace(
    rows: DataFrame,
    path: str,
    keys: Sequence[str],
    app_id: str,
    seq: int,
    *,
    files: int,
    column_mapping: bool,
    properties: Mapping[str, str] | None = None,
) -> None:
    """Create or overwrite the table with ``rows``, range-partitioned and sorted by key (so a later
    MERGE's key ranges skip most files), as one commit carrying (app id, seq); which one, if
    Delta did not skip it, :func:`.delta_log.last_commit` says."""
    key_cols = [col(k) for k in keys]
    data = rows.repartitionByRange(max(1, files), *key_cols).sortWithinPartitions(*key_cols)
    writer = (
        data.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("txnAppId", app_id)
        .option("txnVersion", str(seq))
    )
    props = dict(TABLE_PROPERTIES)
    if column_mapping:
        props.update(COLUMN_MAPPING_PROPERTIES)
    props.update(properties or {})  # a target mode's (.shapes)
    for k, v in props.items():
        writer = writer.option(k, v)
    forget_last_commit(rows.sparkSession)
    writer.save(path)


_RANGE_TYPES = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.DoubleType,
    T.FloatType,
    T.DateType,
    T.StringType,
)


def prune_condition(spark: SparkSession, final: DataFrame, key: str, key_type: T.DataType) -> str | None:
    """Ranges of the window's values of the first key column, as a target-only SQL predicate
    over ``t`` (:mod:`.pruning`); None for types without useful file statistics (binary,
    timestamps). Delta analyses MERGE before SQL parameters are bound, so the values are
    literals, each rendered by :func:`sql_literal` (strings as hex: data never becomes SQL)."""
    if not isinstance(key_type, _RANGE_TYPES):
        return None
    keys = final.select(col(key).alias("k")).distinct()
    # One job: ascending order puts a NULL key first.
    values = [
        r["k"] for r in keys.orderBy(F.col("k").asc_nulls_first()).limit(MAX_COLLECTED_KEYS + 2).collect()
    ]
    has_null = bool(values) and values[0] is None
    values = values[1:] if has_null else values[: MAX_COLLECTED_KEYS + 1]
    if len(values) > MAX_COLLECTED_KEYS:
        lo_hi = keys.agg(F.min("k"), F.max("k")).first()
        assert lo_hi is not None
        ranges = [(lo_hi[0], lo_hi[1])]
    else:
        numeric = not isinstance(key_type, T.StringType)
        ranges = key_ranges(values, distance=numeric_distance if numeric else None)
    if any(isinstance(v, float) and not math.isfinite(v) for r in ranges for v in r):
        return None  # NaN or infinite keys: no useful range
    target, typed = f"t.{q(key)}", key_type.simpleString()

    def param(value: Any) -> str:
        return f"CAST({sql_literal(value)} AS {typed})"

    terms = [
        f"{target} = {param(lo)}" if lo == hi else f"{target} BETWEEN {param(lo)} AND {param(hi)}"
        for lo, hi in ranges
    ]
    if has_null:
        terms.append(f"{target} IS NULL")
    return " OR ".join(terms) or "false"


# Below this many bytes of data a table's MERGE rewrites the files it touches instead of writing
# deletion vectors: on a small table the rewrite costs less than the vectors' extra pass over the
# touched files (bench/bench_merge_latency.py, a 20,000-row table on 2 cores: 1.2 s vs 1.9 s a
# MERGE), and it stays bounded by this size. Above it, the vectors keep a MERGE's cost with the
# window, not with the files it touches (the table property stays on either way).
REWRITE_BELOW_BYTES = 8 * 1024 * 1024
_PERSISTENT_DV_CONF = "spark.databricks.delta.merge.deletionVectors.persistent"


def merge_into(
    spark: SparkSession,
    final: DataFrame,
    path: str,
    keys: Sequence[str],
    schema: T.StructType,
    app_id: str,
    seq: int,
    prune: str | None,
    rewrite_files: bool = False,
    table: str = "",
) -> bool:
    """One MERGE of the per-key rows into the table, as one commit carrying (app id, seq), unless
    the table holds that transaction already (another run committed the window first: Delta
    skips it). Returns whether Delta ran the MERGE: it answers a MERGE it ran with one row of
    counts, and one it skipped with none. Which version it committed,
    :func:`.delta_log.last_commit` says. ``schema`` is the table's after the
    window's evolution: every column is one of the window's (the others were dropped,
    ``merge.schema``). ``rewrite_files``: touched files are rewritten, no deletion vectors
    (:data:`REWRITE_BELOW_BYTES`). SQL ``MERGE INTO`` over a temporary view: the same statement on
    a classic session and over Spark Connect."""
    view = f"vitess_merge_{uuid.uuid4().hex}"
    keep = [n for n in schema.fieldNames() if partial.KEEP + n in final.columns]
    statement = merge_sql.keyed(path, view, keys, schema, (), keep, prune, table)
    return run_merge(spark, final, view, statement, app_id, seq, rewrite_files)


def run_merge(
    spark: SparkSession,
    final: DataFrame,
    view: str,
    statement: str,
    app_id: str,
    seq: int,
    rewrite_files: bool,
) -> bool:
    """Run a MERGE ``statement`` whose source is ``final`` as the temporary view ``view``, as one
    commit carrying (app id, seq); whether Delta ran it (:func:`merge_into`)."""
    final.createOrReplaceTempView(view)
    forget_last_commit(spark)
    spark.conf.set(TXN_APP_ID_CONF, app_id)
    spark.conf.set(TXN_VERSION_CONF, str(seq))
    if rewrite_files:
        spark.conf.set(_PERSISTENT_DV_CONF, "false")
    try:
        return bool(spark.sql(statement).collect())
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)
        if rewrite_files:
            spark.conf.unset(_PERSISTENT_DV_CONF)
        spark.catalog.dropTempView(view)


def files_for(rows: int, rows_per_file: int) -> int:
    return max(1, math.ceil(rows / max(1, rows_per_file)))


def persist(df: DataFrame) -> DataFrame:
    return df.persist(StorageLevel.MEMORY_AND_DISK)
