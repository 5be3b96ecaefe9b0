"""Every table of a sync at one source position, read with the table format's time travel.

The merge commits each table of a window on its own (neither Delta nor Iceberg has a multi-table
transaction), so the latest versions of two tables can stand on two sides of one source
transaction. A cut (:mod:`airflow_provider_vitess.checkpoints.versions`) names, per table, the
version it had after one committed window, with the table's format and (Iceberg) the snapshot
of that version; reading each table at it gives them all at the window's end position, every
source transaction whole::

    from airflow_provider_vitess.consistent_reads import consistent_tables

    tables = consistent_tables(spark, store, "shop")  # at the committed position
    tables = consistent_tables(spark, store, "shop", window=42)  # after window 42
    orders = tables["corder"].join(tables["customer"], "customer_id")

Without this module: :func:`cut_sql` (and the status page's JSON API) gives the SQL, per table
``SELECT * FROM delta.`<path>` VERSION AS OF <version>`` for Delta and
``SELECT * FROM `<catalog>`.`<namespace>`.`<name>` VERSION AS OF <snapshot id>`` for Iceberg
(:mod:`airflow_provider_vitess.merge.job.formats.time_travel`).
"""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.versions import Cut, TableVersion, cut
from airflow_provider_vitess.exceptions import CutUnavailableError
from airflow_provider_vitess.merge.job.formats.time_travel import sql_at  # no PySpark: the page's

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
    from airflow_provider_vitess.merge.job.formats import TableFormat

__all__ = ["Cut", "consistent_cut", "consistent_tables", "cut_sql"]


def consistent_cut(
    store: CheckpointStore, sync_id: str, *, window: int | None = None, as_of: datetime | None = None
) -> Cut:
    """The cut after committed window ``window``, or after the newest window merged by
    ``as_of`` (an aware time), or at the committed position (neither given)."""
    with store.engine.connect() as conn:
        return cut(conn, sync_id, window, as_of)


def cut_sql(taken: Cut) -> dict[str, str]:
    """Per table, the Spark SQL that reads it at the cut, in its format. A table whose SQL
    cannot be written without a session (an Iceberg version recorded without its snapshot id)
    gets a SQL comment saying why, never a query that reads something else."""
    return {t.table: table_sql(t) for t in taken.tables.values()}


def table_sql(t: TableVersion) -> str:
    """The Spark SQL that reads one table of a cut (see :func:`cut_sql`)."""
    try:
        return sql_at(t.path, t.version, t.table_format, t.snapshot_id, t.catalog)
    except ValueError as exc:
        return f"-- no SQL for table {t.table!r} at version {t.version}: {exc}"


def consistent_tables(
    spark: SparkSession,
    store: CheckpointStore,
    sync_id: str,
    *,
    window: int | None = None,
    as_of: datetime | None = None,
    table_format: str | None = None,
    iceberg_catalog: IcebergCatalog | None = None,
) -> dict[str, DataFrame]:
    """Every table of the sync as a DataFrame at one cut (see :func:`consistent_cut`), each
    read in the format the store recorded for it.

    ``iceberg_catalog``: the JDBC catalog, with its credentials, that a sync with
    ``iceberg_catalog_conn_id`` names its tables in (``connections.iceberg_catalog(conn_id)``);
    such a table is refused without it.

    ``table_format`` is deprecated: the store records each table's format. Given, it names the
    format of the versions recorded before the store did (revision 0007: read as Delta
    otherwise), and one that disagrees with a recorded format is refused.

    Raises :class:`CutUnavailableError` when the table no longer has the cut's version (Delta:
    its log retention, ``delta.logRetentionDuration``, passed it; Iceberg: its snapshot was
    expired or left the metadata log), instead of reading another version. Files a ``VACUUM``
    (Delta) or ``expire_snapshots`` (Iceberg) removed fail when the DataFrame is read: keep
    ``delta.deletedFileRetentionDuration`` or the snapshots' age longer than the cuts you read.
    """
    from airflow_provider_vitess.merge.job.formats import for_session

    if table_format is not None:
        warnings.warn(
            "consistent_tables(table_format=...) is deprecated: the store records each table's "
            "format; it applies only to versions recorded before it did",
            DeprecationWarning,
            stacklevel=2,
        )
    taken = consistent_cut(store, sync_id, window=window, as_of=as_of)
    fmts: dict[tuple[str, str | None], TableFormat] = {}
    frames = {}
    for t in taken.tables.values():
        name = _format_of(sync_id, t, table_format)
        if (name, t.catalog) not in fmts:
            fmts[(name, t.catalog)] = for_session(spark, name, _catalog_of(sync_id, t, iceberg_catalog))
        fmt = fmts[(name, t.catalog)]
        try:
            frames[t.table] = fmt.read_at(spark, t.path, t.version, t.snapshot_id)
        except Exception as exc:  # Delta's time-travel errors differ between releases
            if "version" not in str(exc).lower():
                raise
            raise CutUnavailableError(
                f"sync {sync_id!r}: table {t.table!r} ({t.path}) has no {name} version {t.version} "
                f"any more (window {taken.seq}'s cut): its retention removed it (Delta: "
                "delta.logRetentionDuration or a VACUUM; Iceberg: expired snapshots or "
                "write.metadata.previous-versions-max); take a newer cut, or keep more history "
                f"({exc})"
            ) from exc
    return frames


def _catalog_of(sync_id: str, t: TableVersion, given: IcebergCatalog | None) -> IcebergCatalog | None:
    """The JDBC catalog ``t`` is read through: ``given``, when ``t`` is named in it."""
    if t.catalog is None:
        return None
    if given is None or given.name != t.catalog:
        raise ValueError(
            f"sync {sync_id!r}: table {t.table!r} is named in the Iceberg JDBC catalog "
            f"{t.catalog!r}, which this call was not given: pass iceberg_catalog="
            "connections.iceberg_catalog(<the sync's iceberg_catalog_conn_id>)"
        )
    return given


def _format_of(sync_id: str, t: TableVersion, given: str | None) -> str:
    """The format to read ``t`` in: the recorded one; for a version recorded without one, the
    caller's ``table_format`` if given, else Delta."""
    if given is None:
        return t.table_format
    if t.recorded_format is not None and t.recorded_format != given:
        raise ValueError(
            f"sync {sync_id!r}: table {t.table!r} is recorded in format {t.recorded_format!r}, not "
            f"{given!r}: leave table_format out (deprecated), the store knows each table's format"
        )
    return given
