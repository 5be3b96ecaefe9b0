"""A table at an earlier commit as Spark SQL, per format, without PySpark: the consistent cut's SQL.

The status page (``consistent_reads.cut_sql``) builds it without a session, and each format's
:meth:`.base.TableFormat.sql_at` is this same text; Iceberg's ``read_at`` runs it, so for an
Iceberg table the SQL the page shows is the read ``consistent_tables`` makes (Delta's reads the
same version through Delta's reader):

* Delta: ``SELECT * FROM delta.`<path>` VERSION AS OF <version>``; Delta's version is its own.
* Iceberg: ``SELECT * FROM <catalog>.<namespace>.<name> VERSION AS OF <snapshot id>``, the table
  named as the merge names it (:func:`..iceberg_sql.at`; in its JDBC catalog, if it has one).
  Iceberg's time travel names a snapshot; our Iceberg version (the snapshot's sequence number
  less one, :mod:`..iceberg_log`) does not tell which without the table's metadata log, so the
  store records the snapshot each window's commit made. A version recorded without one has no
  SQL here (:class:`NoSqlAtVersion`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from airflow_provider_vitess.merge.job.delta_sql import version_sql
from airflow_provider_vitess.merge.job.iceberg_sql import at
from airflow_provider_vitess.merge.plan import TABLE_FORMATS

DEFAULT_FORMAT = "delta"


def known(name: str) -> None:
    """Refuse a table format that is not one of ``TABLE_FORMATS``."""
    if name not in TABLE_FORMATS:
        raise ValueError(f"table format {name!r} is not one of {', '.join(TABLE_FORMATS)}")


class NoSqlAtVersion(ValueError):
    """The table's SQL at that version cannot be written without a session."""


def _delta(path: str, version: int, snapshot_id: int | None, catalog: str | None) -> str:
    return version_sql(path, version)


def _iceberg(path: str, version: int, snapshot_id: int | None, catalog: str | None) -> str:
    if snapshot_id is None:
        raise NoSqlAtVersion(
            f"Iceberg table {path}: version {version} was recorded without its snapshot id (by a "
            "provider before the store kept them), and Iceberg's time travel names a snapshot; "
            "consistent_tables finds it in the table's metadata log"
        )
    return f"SELECT * FROM {at(path).sql_in(catalog)} VERSION AS OF {int(snapshot_id)}"


# One entry per name of ``merge.plan.TABLE_FORMATS`` (a unit test keeps them equal).
_SQL_AT: Mapping[str, Callable[[str, int, int | None, str | None], str]] = {
    "delta": _delta,
    "iceberg": _iceberg,
}


def sql_at(
    path: str,
    version: int,
    name: str = DEFAULT_FORMAT,
    snapshot_id: int | None = None,
    catalog: str | None = None,
) -> str:
    """Spark SQL that reads the ``name`` table at ``path`` as of ``version``, whose commit is
    ``snapshot_id`` where the format names commits by an id (Iceberg), in the JDBC catalog
    ``catalog`` where the table is named in one. ValueError for a format
    that is not one of ``TABLE_FORMATS``; :class:`NoSqlAtVersion` for an Iceberg version without
    its snapshot."""
    known(name)
    return _SQL_AT[name](path, version, snapshot_id, catalog)
