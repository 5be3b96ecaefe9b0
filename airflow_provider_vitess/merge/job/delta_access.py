"""How the merge reads Delta's side of a table: one small interface, two implementations.

A classic session asks Delta's JVM (:mod:`.tables`); a Spark Connect session has no JVM on
this side and asks through SQL and log files (:mod:`.connect_tables`). Both modules have the
same functions (:class:`DeltaAccess`), as Delta's own Python API keeps ``tables.py`` and
``connect/tables.py``; the merge picks one once, from its first session (:func:`for_session`),
and every table's work uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.job.steps import TableSize, TableState


class DeltaAccess(Protocol):
    def table_state(
        self, spark: SparkSession, path: str, app_id: str, restores_after: int | None
    ) -> TableState: ...

    def table_size(self, spark: SparkSession, path: str) -> TableSize: ...

    def read_log_file(self, spark: SparkSession, file: str) -> str | None: ...

    def activate(self, spark: SparkSession) -> None: ...


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect (remote) session rather than a classic one (by its
    class's module: importing Connect's client costs a classic job a second)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def for_session(spark: SparkSession) -> DeltaAccess:
    """The implementation for ``spark``'s kind of session."""
    if is_connect(spark):
        from airflow_provider_vitess.merge.job import connect_tables

        return connect_tables
    from airflow_provider_vitess.merge.job import tables

    return tables
