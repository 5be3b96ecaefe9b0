"""What a Delta table holds now: its schema, version, files and this sync's transaction version.

A classic session asks Delta's JVM (the table's latest snapshot); Spark Connect has no JVM to
ask, so :mod:`.connect` reads the table's log and checksum files instead.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess.merge import connect
from airflow_provider_vitess.merge.steps import TableSize, TableState


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def _latest_snapshot(spark: SparkSession, path: str) -> Any:
    jvm = spark._jvm  # classic sessions only: Spark Connect has no JVM to ask (see .connect)
    assert jvm is not None, "the merge job needs a classic SparkSession (not Spark Connect)"
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    defaults = []
    for i in range(1, 8):  # DeltaLog.update's default arguments (Scala), as many as it has
        try:
            defaults.append(getattr(log, f"update$default${i}")())
        except Exception:
            break
    return log.update(*defaults)


def table_size(spark: SparkSession, path: str) -> TableSize:
    """How many data files the table's latest version has, and their bytes."""
    if connect.is_connect(spark):
        return connect.table_size(spark, path)
    snap = _latest_snapshot(spark, path)
    return TableSize(int(snap.numOfFiles()), int(snap.sizeInBytes()))


def table_state(spark: SparkSession, path: str, app_id: str, restores_after: int | None = None) -> TableState:
    """Whether the table exists, its schema, version and the latest txn version of ``app_id``
    in it; with ``restores_after``, the versions of the RESTORE commits after that version."""
    if connect.is_connect(spark):  # no JVM to ask: what Delta's Connect plugin serves
        return connect.table_state(spark, path, app_id, restores_after)
    snap = _latest_snapshot(spark, path)
    if snap.version() < 0:
        return TableState(exists=False)
    txn = snap.transactions().get(app_id)
    schema = T.StructType.fromJson(json.loads(snap.schema().json()))
    mode = snap.metadata().configuration().get("delta.columnMapping.mode")
    version = int(snap.version())
    return TableState(
        exists=True,
        schema=schema,
        txn_version=int(txn.get()) if txn.isDefined() else None,
        column_mapping=bool(mode.isDefined() and mode.get() != "none"),
        version=version,
        restores=restores(spark, path, restores_after, version),
    )


def restores(spark: SparkSession, path: str, after: int | None, latest: int) -> tuple[int, ...]:
    """RESTORE commits in (after, latest]: reads only those commits' info from the log."""
    if after is None or latest <= after:
        return ()
    rows = _history(spark, path, latest - after).select("version", "operation").collect()
    return tuple(sorted(int(r[0]) for r in rows if r[0] > after and str(r[1]) == "RESTORE"))


def _history(spark: SparkSession, path: str, limit: int) -> DataFrame:
    # SQL rather than DeltaTable's Python API: the same on a classic session and over Spark
    # Connect, where that API needs Delta's Connect plugin on the server.
    return spark.sql(f"DESCRIBE HISTORY delta.{q(path)} LIMIT {int(limit)}")
