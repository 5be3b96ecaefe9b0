"""A Delta table's state over Spark Connect, where no JVM is at hand: SQL and log files.

The same functions as :mod:`.tables` (:class:`.delta_access.DeltaAccess`), which asks Delta's
``DeltaLog`` through py4j; here :func:`table_state` asks the same through SQL (``DESCRIBE
HISTORY``, the table's schema) and reads the rest from the version's checksum file
(:mod:`.checksum`), else from the table (``SHOW TBLPROPERTIES``, and this sync's latest
transaction version from the log files of the table's snapshot, :func:`txn_version`).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from airflow_provider_vitess.merge.job.checksum import read_checksum
from airflow_provider_vitess.merge.job.delta_log import log_dir, log_file
from airflow_provider_vitess.merge.job.delta_sql import history_since
from airflow_provider_vitess.merge.job.delta_sql import table as sql_table
from airflow_provider_vitess.merge.job.steps import TableSize, TableState
from airflow_provider_vitess.merge.modes import SHAPE_PROPERTIES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


# Delta's error conditions for a path that holds no Delta table (yet), as the classic job's
# DeltaLog sees it (version -1): the merge creates it.
NO_TABLE = frozenset(
    {"DELTA_TABLE_ONLY_OPERATION", "DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND", "PATH_NOT_FOUND"}
)


def table_version(spark: SparkSession, path: str) -> int:
    """The table's latest version (-1: no table)."""
    try:
        row = spark.sql(f"DESCRIBE HISTORY {sql_table(path)} LIMIT 1").select("version").first()
    except AnalysisException as exc:
        if exc.getCondition() in NO_TABLE:
            return -1
        raise
    assert row is not None, f"Delta table {path} has no history"
    return int(row[0])


def table_size(spark: SparkSession, path: str) -> TableSize:
    """How many data files the table's latest version has, and their bytes."""
    row = spark.sql(f"DESCRIBE DETAIL {sql_table(path)}").select("numFiles", "sizeInBytes").first()
    return TableSize(0, 0) if row is None else TableSize(int(row[0] or 0), int(row[1] or 0))


def txn_version(
    spark: SparkSession, path: str, app_id: str, version: int, checkpoint_interval: int = 10
) -> int | None:
    """The latest transaction version of ``app_id`` in the table at ``version`` (None: never
    written).

    Delta's snapshot keeps, per app id, the last ``txn`` action in log order; the merge writes
    an app id's versions in increasing window order only (Delta skips a lower one), so the
    highest version in a checkpoint at or before ``version`` and the commits after it is that
    one. The whole log keeps a commit per window for the log retention (30 days by default):
    thousands of files, which a read of all of them would parse on every window. So, in turn
    while a named file is missing: the checkpoint Delta writes every ``checkpoint_interval``
    commits (one read, no listing), the newest complete checkpoint Spark lists, the whole log.
    """
    interval = max(1, checkpoint_interval)
    for files in (
        lambda: _files_since(path, version // interval * interval, version),
        lambda: _listed_checkpoint_files(spark, path, version),
    ):
        try:
            named = files()
            if named is None:
                break
            return _max_txn(spark, named, app_id)
        except AnalysisException as exc:
            if exc.getCondition() != "PATH_NOT_FOUND":
                raise
    log.info("Delta log of %s: no checkpoint named here is whole; reading the whole log", path)
    return _max_txn(spark, [], app_id, whole_log=log_dir(path))


def _files_since(
    path: str, checkpoint: int, version: int, parts: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """(path, format) of the table's classic checkpoint at ``checkpoint`` (its ``parts``, or its
    one file; none for 0, which Delta does not write) and the commits after it up to
    ``version``."""
    files = [(p, "parquet") for p in parts]
    if checkpoint > 0 and not parts:
        files.append((log_file(path, checkpoint, "checkpoint.parquet"), "parquet"))
    first = checkpoint + 1 if checkpoint > 0 else 0
    return files + [(log_file(path, v, "json"), "json") for v in range(first, version + 1)]


# A classic checkpoint: one file, or part i of n. (A V2 checkpoint names a UUID: not matched.)
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


def _listed_checkpoint_files(spark: SparkSession, path: str, version: int) -> list[tuple[str, str]] | None:
    """:func:`_files_since` the newest complete classic checkpoint at or before ``version`` that
    Spark lists (names only: ``binaryFile`` without its content column reads no file); None when
    a V2 checkpoint, whose files are not named here, is newer."""
    listed = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", "*.checkpoint*.parquet")
        .load(log_dir(path))
        .select("path")
        .collect()
    )
    parts: dict[int, dict[int, str]] = {}  # version -> part -> path
    counts: dict[int, int] = {}
    newest_other = -1
    for (file,) in listed:
        found = _CHECKPOINT.search(str(file))
        if found is None:
            newest_other = max(newest_other, _version_prefix(str(file)))
            continue
        at = int(found[1])
        parts.setdefault(at, {})[int(found[2] or 1)] = str(file)
        counts[at] = int(found[3] or 1)
    complete = [v for v in parts if v <= version and len(parts[v]) == counts[v]]
    since = max(complete, default=0)
    if since < newest_other <= version:
        return None
    return _files_since(path, since, version, [parts[since][i] for i in sorted(parts.get(since, {}))])


def _version_prefix(file: str) -> int:
    name = file.rsplit("/", 1)[-1]
    return int(name[:20]) if name[:20].isdigit() else -1


def _max_txn(
    spark: SparkSession, files: Sequence[tuple[str, str]], app_id: str, whole_log: str | None = None
) -> int | None:
    """The highest txn version of ``app_id`` in ``files`` ((path, format) pairs), or in every
    commit and checkpoint file of the log directory ``whole_log``."""
    schema = "txn struct<appId: string, version: bigint>"
    frames = []
    if whole_log is not None:  # a filter, not a glob path: no error when no checkpoint exists yet
        for fmt, glob in (("json", "*.json"), ("parquet", "*.checkpoint*.parquet")):
            frames.append(
                spark.read.schema(schema).option("pathGlobFilter", glob).format(fmt).load(whole_log)
            )
    for fmt in ("json", "parquet"):
        paths = [p for p, f in files if f == fmt]
        if paths:
            frames.append(spark.read.schema(schema).format(fmt).load(paths))
    if not frames:
        return None
    union = functools.reduce(lambda a, b: a.unionByName(b), frames)
    found = union.where(F.col("txn.appId") == F.lit(app_id)).agg(F.max("txn.version")).first()
    return None if found is None or found[0] is None else int(found[0])


def table_state(spark: SparkSession, path: str, app_id: str, restores_after: int | None) -> TableState:
    """:func:`.tables.table_state` over Spark Connect.

    What the version's checksum file says (:mod:`.checksum`: properties, the transaction
    versions, files and bytes) is read from it: one small read, where asking the table costs a
    metadata query, a read of log files and a rebuild of the version's file list (``DESCRIBE
    DETAIL``, ~1.4 s a table on 2 cores); what it leaves out is asked of the table."""
    version = table_version(spark, path)
    if version < 0:
        return TableState(exists=False)
    crc = read_checksum(spark, path, version, read_log_file)
    props = crc.properties if crc is not None else None
    if props is None:  # metadata only: no file list built
        props = {str(k): str(v) for k, v in spark.sql(f"SHOW TBLPROPERTIES {sql_table(path)}").collect()}
    if crc is not None and crc.knows_txns():
        txn = crc.txn_version(app_id)
    else:
        txn = txn_version(spark, path, app_id, version, int(props.get("delta.checkpointInterval") or 10))
    since = history_since(spark, path, restores_after, version)
    return TableState(
        exists=True,
        schema=spark.read.format("delta").load(path).schema,
        txn_version=txn,
        column_mapping=props.get("delta.columnMapping.mode", "none") != "none",
        version=version,
        restores=since.restores,
        marks=since.marks,
        size=crc.size if crc is not None else None,
        properties={k: v for k, v in props.items() if k in SHAPE_PROPERTIES},
    )


def read_log_file(spark: SparkSession, file: str) -> str | None:
    """The text of one log file (one small Spark read); None when it does not exist."""
    try:
        rows = spark.read.text(file, wholetext=True).collect()
    except AnalysisException as exc:
        if exc.getCondition() == "PATH_NOT_FOUND":
            return None
        raise
    return str(rows[0][0]) if rows else ""


def activate(spark: SparkSession) -> None:
    """Nothing to do: a Connect session's JVM is the server's, which tracks its sessions."""
