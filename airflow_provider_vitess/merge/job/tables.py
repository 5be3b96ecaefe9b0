"""A Delta table's state on a classic session: asked of Delta's own ``DeltaLog`` through py4j.

What a table holds now (its schema, version, files and this sync's transaction version), the
log files the merge reads after a write, and the per-thread session Delta's threads need. The
same functions over Spark Connect, which has no JVM to ask, are :mod:`.connect_tables`'s; the
merge picks one of the two once (:mod:`.delta_access`).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.delta_sql import history_since
from airflow_provider_vitess.merge.job.steps import TableSize, TableState
from airflow_provider_vitess.merge.modes import SHAPE_PROPERTIES


def _jvm(spark: SparkSession) -> Any:
    jvm = spark._jvm
    assert jvm is not None, "a classic SparkSession was expected (this one has no JVM: Spark Connect)"
    return jvm


def _latest_snapshot(spark: SparkSession, path: str) -> Any:
    log = _jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    defaults = []
    for i in range(1, 8):  # DeltaLog.update's default arguments (Scala), as many as it has
        try:
            defaults.append(getattr(log, f"update$default${i}")())
        except Exception:
            break
    return log.update(*defaults)


def table_size(spark: SparkSession, path: str) -> TableSize:
    """How many data files the table's latest version has, and their bytes."""
    snap = _latest_snapshot(spark, path)
    return TableSize(int(snap.numOfFiles()), int(snap.sizeInBytes()))


def table_state(spark: SparkSession, path: str, app_id: str, restores_after: int | None = None) -> TableState:
    """Whether the table exists, its schema, version and the latest txn version of ``app_id``
    in it; with ``restores_after``, the versions of the RESTORE commits after that version and
    the marks of the windows committed since (:mod:`.marks`)."""
    snap = _latest_snapshot(spark, path)
    if snap.version() < 0:
        return TableState(exists=False)
    txn = snap.transactions().get(app_id)
    schema = T.StructType.fromJson(json.loads(snap.schema().json()))
    configuration = snap.metadata().configuration()
    mode = configuration.get("delta.columnMapping.mode")
    version = int(snap.version())
    props = {}
    for name in SHAPE_PROPERTIES:
        value = configuration.get(name)
        if value.isDefined():
            props[name] = str(value.get())
    since = history_since(spark, path, restores_after, version)
    return TableState(
        exists=True,
        schema=schema,
        txn_version=int(txn.get()) if txn.isDefined() else None,
        column_mapping=bool(mode.isDefined() and mode.get() != "none"),
        version=version,
        restores=since.restores,
        marks=since.marks,
        properties=props,
    )


def read_log_file(spark: SparkSession, file: str) -> str | None:
    """The text of one log file, through the session's Hadoop file system (no Spark job); None
    when it does not exist."""
    jvm = _jvm(spark)
    hadoop_path = jvm.org.apache.hadoop.fs.Path(file)
    fs = hadoop_path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    if not fs.exists(hadoop_path):
        return None
    stream = fs.open(hadoop_path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def activate(spark: SparkSession) -> None:
    """Make ``spark`` this thread's active session in the JVM. Delta's own threads take the
    caller's active session (reading a table's checkpoint fails with
    DELTA_SPARK_SESSION_NOT_SET without one), and a pool thread has none until told; sessions
    also move between threads."""
    _jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
