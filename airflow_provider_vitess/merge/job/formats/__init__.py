"""The table formats the merge writes, behind one protocol (:class:`.base.TableFormat`).

The merge's mode logic reaches a format only through the object :func:`for_session` returns
(:mod:`..run` picks it once per merge; :mod:`..window_step` writes through it): Delta
(:mod:`.delta`, classic session or Spark Connect chosen inside it) and Apache Iceberg
(:mod:`.iceberg`). Importing this package loads no PySpark: :func:`sql_at` (:mod:`.time_travel`)
serves the status page, which may run without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_vitess.merge.job.formats.base import Commit, Statement, TableFormat
from airflow_provider_vitess.merge.job.formats.time_travel import (
    DEFAULT_FORMAT,
    NoSqlAtVersion,
    known,
    sql_at,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog

__all__ = [
    "DEFAULT_FORMAT",
    "Commit",
    "NoSqlAtVersion",
    "Statement",
    "TableFormat",
    "for_session",
    "sql_at",
]


def for_session(
    spark: SparkSession, name: str = DEFAULT_FORMAT, iceberg_catalog: IcebergCatalog | None = None
) -> TableFormat:
    """The format ``name`` for ``spark``'s kind of session (Iceberg's tables in the JDBC catalog
    ``iceberg_catalog`` if one is given)."""
    known(name)
    if name == "iceberg":
        from airflow_provider_vitess.merge.job.formats.iceberg import IcebergFormat

        return IcebergFormat(iceberg_catalog)
    from airflow_provider_vitess.merge.job.formats.delta import DeltaFormat

    return DeltaFormat.for_session(spark)
