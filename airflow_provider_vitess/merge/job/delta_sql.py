"""Delta SQL both kinds of session speak: a quoted identifier, a read at a version, and the RESTOREs
and window marks in a table's recent history.

SQL rather than ``DeltaTable``'s Python API: the same on a classic session and over Spark
Connect, where that API needs Delta's Connect plugin on the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_vitess.merge.job.marks import parse_mark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def table(path: str) -> str:
    """The Delta table at ``path`` as Spark SQL names it (quoted: a path is data, never SQL)."""
    return f"delta.{q(path)}"


def version_sql(path: str, version: int) -> str:
    """``SELECT`` of the Delta table at ``path`` as of ``version`` (time travel: the consistent
    cut); text only, so the status page builds it without PySpark."""
    return f"SELECT * FROM {table(path)} VERSION AS OF {int(version)}"


@dataclass(frozen=True)
class Since:
    """What the commits after the version a sync last wrote say (target integrity)."""

    restores: tuple[int, ...] = ()  # the RESTORE commits' versions
    marks: Mapping[int, str] = field(default_factory=dict)  # window seq -> read (.marks)


def history_since(spark: SparkSession, path: str, after: int | None, latest: int) -> Since:
    """The RESTOREs and the windows' marks in (after, latest]: reads only those commits' info
    from the log."""
    if after is None or latest <= after:
        return Since()
    rows = _history(spark, path, latest - after).select("version", "operation", "userMetadata").collect()
    rows = [r for r in rows if r[0] > after]
    marks = dict(m for r in rows if (m := parse_mark(r[2])) is not None)
    return Since(tuple(sorted(int(r[0]) for r in rows if str(r[1]) == "RESTORE")), marks)


def _history(spark: SparkSession, path: str, limit: int) -> DataFrame:
    return spark.sql(f"DESCRIBE HISTORY {table(path)} LIMIT {int(limit)}")
