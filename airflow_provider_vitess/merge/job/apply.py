"""The Delta side of the merge: a window's rows -> one Delta commit carrying its transaction id.

Every target mode writes through here: the schema changes before a step (:func:`evolve_table`),
a replace (:func:`write_replace`), an append (:func:`append`) and a MERGE (:func:`run_merge`,
its statement from :mod:`.merge_sql`), each one commit carrying (app id, window seq), which
Delta skips when the table holds that transaction already. The rows come from :mod:`.window_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import delta_features
from airflow_provider_vitess.merge.job.delta_log import forget_last_commit
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.delta_sql import table as sql_table
from airflow_provider_vitess.merge.job.pruning import (
    MAX_COLLECTED_KEYS,
    key_ranges,
    numeric_distance,
    sql_literal,
)
from airflow_provider_vitess.merge.job.schema import Evolution
from airflow_provider_vitess.merge.job.window_rows import col
from airflow_provider_vitess.merge.modes import TABLE_FEATURES, TYPE_WIDENING
from airflow_provider_vitess.merge.spark_conf import COLUMN_MAPPING_PROPERTIES

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def evolve_table(spark: SparkSession, path: str, ev: Evolution, *, widen_in_place: bool) -> None:
    """A step's schema changes before it writes, in every target mode (each its own commit;
    repeating them is a no-op). A widened column: ``widen_in_place`` (the table has Delta's type
    widening, or it was chosen for it: ``table_features``) widens it in place, refused before the
    first change where the cluster's Delta cannot (:func:`.delta_features.require_type_widening`:
    a half-changed table otherwise). A dropped column: ``ev.drop_in_place`` (the table maps its
    columns by name) drops it in place. Else the table is rewritten without the dropped columns
    and with the wider types (:func:`_rewrite`), which every Delta reader reads."""
    in_place = widen_in_place and bool(ev.widen)
    if in_place:
        delta_features.require_type_widening(spark, ev.table, ev.widen)
    add, widen = ev.add, [(n, b) for n, _, b in ev.widen]
    table = sql_table(path)
    props = dict(TABLE_FEATURES[TYPE_WIDENING]) if in_place else {}
    if ev.column_mapping:
        props.update(COLUMN_MAPPING_PROPERTIES)
    if props:
        sets = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({sets})")
    if ev.drop and ev.drop_in_place:
        # IF EXISTS: the plan was made from the schema read when the run started.
        spark.sql(f"ALTER TABLE {table} DROP COLUMNS IF EXISTS ({', '.join(q(n) for n in ev.drop)})")
    if add:
        cols = ", ".join(
            f"{q(f.name)} {f.dataType.simpleString()}"
            + (f" COMMENT '{_sql_string(f.metadata['comment'])}'" if f.metadata.get("comment") else "")
            for f in add
        )
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({cols})")
    rewrite_widen = () if in_place else widen
    rewrite_drop = () if ev.drop_in_place else ev.drop
    if rewrite_widen or rewrite_drop:
        _rewrite(spark, path, rewrite_widen, rewrite_drop)
    if in_place:
        for name, new in widen:
            spark.sql(f"ALTER TABLE {table} ALTER COLUMN {q(name)} TYPE {new.simpleString()}")


def _rewrite(
    spark: SparkSession, path: str, widen: Sequence[tuple[str, T.DataType]], drop: Sequence[str]
) -> None:
    """The table rewritten as one commit without ``drop``'s columns and with ``widen``'s cast to
    their wider types (INT -> BIGINT, DECIMAL(10,2) -> DECIMAL(12,2): every value survives),
    keeping each column's metadata and the table's properties: no reader-locking feature is
    needed, at the cost of writing the table once. A rerun after it finds the columns gone and
    wide already and does nothing."""
    old = spark.read.format("delta").load(path)
    wider, gone = dict(widen), set(drop)
    columns = [
        col(f.name).cast(wider[f.name]).alias(f.name, metadata=f.metadata) if f.name in wider else col(f.name)
        for f in old.schema.fields
        if f.name not in gone
    ]
    rows = plain_strings(old.select(*columns))
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def plain_strings(rows: DataFrame) -> DataFrame:
    """``rows`` with every string column cast to plain ``string``. Over Spark Connect (PySpark
    4.2), a column cast to a ``StringType()`` object carries the default collation explicitly,
    and Delta records it in the table's schema as ``string collate UTF8_BINARY``, a type delta-rs
    (and Polars on it) refuse: "Unsupported Delta table type". A cast by the type's name does not."""
    fields = rows.schema.fields
    if not any(isinstance(f.dataType, T.StringType) for f in fields):
        return rows
    return rows.select(
        *[
            col(f.name).cast("string").alias(f.name, metadata=f.metadata)
            if isinstance(f.dataType, T.StringType)
            else col(f.name)
            for f in fields
        ]
    )


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def laid_out(rows: DataFrame, keys: Sequence[str], files: int) -> DataFrame:
    """A replace's rows: about ``files`` files of key ranges, sorted by key (so a later MERGE's
    key ranges skip most files), strings plain (:func:`plain_strings`). Every format's replace."""
    key_cols = [col(k) for k in keys]
    return plain_strings(rows).repartitionByRange(max(1, files), *key_cols).sortWithinPartitions(*key_cols)


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
    writer = (
        laid_out(rows, keys, files)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("txnAppId", app_id)
        .option("txnVersion", str(seq))
    )
    props = dict(COLUMN_MAPPING_PROPERTIES) if column_mapping else {}
    props.update(properties or {})  # the mode's and the chosen features' (.shapes.properties)
    for k, v in props.items():
        writer = writer.option(k, v)
    forget_last_commit(rows.sparkSession)
    writer.save(path)


def append(
    rows: DataFrame, path: str, app_id: str, seq: int, create: Mapping[str, str] | None, column_mapping: bool
) -> None:
    """Append ``rows`` as one commit carrying (app id, seq): Delta skips it when the table holds
    that transaction already (:func:`.delta_log.last_commit` then finds no commit). ``create``:
    the table does not exist yet, and is created with these properties."""
    writer = (
        plain_strings(rows)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(seq))
    )
    if create is not None:
        table_props = {**(COLUMN_MAPPING_PROPERTIES if column_mapping else {}), **create}
        for k, v in table_props.items():
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
    commit carrying (app id, seq), unless the table holds that transaction already (another run
    committed the window first: Delta skips it). Returns whether Delta ran the MERGE: it answers a
    MERGE it ran with one row of counts, and one it skipped with none. Which version it committed,
    :func:`.delta_log.last_commit` says. ``rewrite_files``: touched files are rewritten, no
    deletion vectors (:data:`REWRITE_BELOW_BYTES`). SQL ``MERGE INTO`` over a temporary view
    (:mod:`.merge_sql`): the same statement on a classic session and over Spark Connect."""
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


def persist(df: DataFrame) -> DataFrame:
    return df.persist(StorageLevel.MEMORY_AND_DISK)
