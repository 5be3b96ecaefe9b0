"""Small files of a Delta table's ``_delta_log`` read directly, and the commit a session just made.

Two facts the merge needs after each write come from here rather than from ``DESCRIBE
HISTORY`` (which lists the log and parses commit files on every call, ~0.2 s a table even on a
warm session, and ran once for every table a window wrote):

- **which version the write committed, if any**: Delta records it in the writing session's
  ``spark.databricks.delta.lastCommitVersionInSession``. Each table is written on a session of
  its own at a time (:mod:`.sessions`), and the setting is cleared before the write, so a value
  after it is this write's commit and no value means Delta skipped the write (the table holds
  the window's transaction already). A MERGE also answers whether it ran; the job checks that
  the two agree, so a Delta that does not record the version fails instead of passing a write
  off as a skip;
- **what the commit did**: the ``commitInfo`` action of that version's commit file
  (``_delta_log/<version>.json``), the same operation and metrics ``DESCRIBE HISTORY`` shows.

Names and parsing only: the caller's ``read`` reads a log file (:mod:`.delta_access`: through
the session's Hadoop file system in a classic session, one small Spark read over Spark Connect).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LAST_COMMIT_CONF = "spark.databricks.delta.lastCommitVersionInSession"
# Reads one log file (None: it does not exist): DeltaAccess.read_log_file.
LogReader = Callable[["SparkSession", str], "str | None"]


@dataclass(frozen=True)
class Commit:
    version: int
    operation: str
    metrics: Mapping[str, str]


def log_dir(path: str) -> str:
    """The log directory of the Delta table at ``path``."""
    return f"{path.rstrip('/')}/_delta_log"


def log_file(path: str, version: int, suffix: str) -> str:
    """``<path>/_delta_log/<version, 20 digits>.<suffix>``: a commit (json), a checksum (crc) or
    a classic checkpoint (checkpoint.parquet)."""
    return f"{log_dir(path)}/{version:020d}.{suffix}"


def commit_info(text: str, version: int, file: str = "") -> Commit:
    """The ``commitInfo`` action of a commit file's text (one JSON action per line)."""
    for line in text.splitlines():
        action: dict[str, Any] = json.loads(line) if line.strip() else {}
        info = action.get("commitInfo")
        if info is not None:
            metrics = info.get("operationMetrics") or {}
            return Commit(
                version, str(info.get("operation", "")), {str(k): str(v) for k, v in metrics.items()}
            )
    raise ValueError(f"Delta commit file {file or version} has no commitInfo action")


def forget_last_commit(spark: SparkSession) -> None:
    """Clear the session's last commit version: call before the write :func:`last_commit` asks
    about."""
    spark.conf.unset(LAST_COMMIT_CONF)


def last_commit(spark: SparkSession, path: str, read: LogReader) -> Commit | None:
    """The commit the session's last write to the table at ``path`` made since
    :func:`forget_last_commit` (its commit file read with ``read``); None when it committed
    nothing."""
    version = spark.conf.get(LAST_COMMIT_CONF, None)
    if version is None:
        return None
    file = log_file(path, int(version), "json")
    text = read(spark, file)
    if text is None:
        raise FileNotFoundError(
            f"Delta commit file {file}, of the version this session just committed, is missing"
        )
    return commit_info(text, int(version), file)
