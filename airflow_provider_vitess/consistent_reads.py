"""Every table of a sync at one source position, read with the table format's time travel (Delta's).

The merge commits each table of a window on its own (Delta has no multi-table transaction), so
the latest versions of two tables can stand on two sides of one source transaction. A cut
(:mod:`airflow_provider_vitess.checkpoints.versions`) names, per table, the Delta version it had
after one committed window; reading each table at that version gives them all at the window's
end position, every source transaction whole::

    from airflow_provider_vitess.consistent_reads import consistent_tables

    tables = consistent_tables(spark, store, "shop")  # at the committed position
    tables = consistent_tables(spark, store, "shop", window=42)  # after window 42
    orders = tables["corder"].join(tables["customer"], "customer_id")

Without this module: :func:`cut_sql` (and the status page's JSON API) gives the SQL, one
``SELECT * FROM delta.`<path>` VERSION AS OF <n>`` per table.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.versions import Cut, cut
from airflow_provider_vitess.exceptions import CutUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Cut", "consistent_cut", "consistent_tables", "cut_sql"]


def consistent_cut(
    store: CheckpointStore, sync_id: str, *, window: int | None = None, as_of: datetime | None = None
) -> Cut:
    """The cut after committed window ``window``, or after the newest window merged by
    ``as_of`` (an aware time), or at the committed position (neither given)."""
    with store.engine.connect() as conn:
        return cut(conn, sync_id, window, as_of)


def cut_sql(taken: Cut) -> dict[str, str]:
    """Per table, the Spark SQL that reads it at the cut."""
    from airflow_provider_vitess.merge.job.formats import sql_at  # no PySpark: the status page's

    return {t.table: sql_at(t.path, t.version) for t in taken.tables.values()}


def consistent_tables(
    spark: SparkSession,
    store: CheckpointStore,
    sync_id: str,
    *,
    window: int | None = None,
    as_of: datetime | None = None,
    table_format: str = "delta",
) -> dict[str, DataFrame]:
    """Every table of the sync as a DataFrame at one cut (see :func:`consistent_cut`);
    ``table_format``: the sync's (``target.table_format``).

    Raises :class:`CutUnavailableError` when Delta no longer has a version of the cut (its log
    retention, ``delta.logRetentionDuration``, passed it), instead of reading another version.
    Files a ``VACUUM`` removed fail when the DataFrame is read: keep
    ``delta.deletedFileRetentionDuration`` longer than the cuts you read.
    """
    from airflow_provider_vitess.merge.job.formats import for_session

    taken = consistent_cut(store, sync_id, window=window, as_of=as_of)
    fmt = for_session(spark, table_format)
    frames = {}
    for t in taken.tables.values():
        try:
            frames[t.table] = fmt.read_at(spark, t.path, t.version)
        except Exception as exc:  # Delta's time-travel errors differ between releases
            if "version" not in str(exc).lower():
                raise
            raise CutUnavailableError(
                f"sync {sync_id!r}: table {t.table!r} ({t.path}) has no Delta version {t.version} "
                f"any more (window {taken.seq}'s cut): its log retention (delta.logRetentionDuration) "
                f"or a VACUUM removed it; take a newer cut, or keep the log longer ({exc})"
            ) from exc
    return frames
