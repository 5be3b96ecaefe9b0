"""An Iceberg table at a location, as Spark SQL names it.

The merge knows a target by its location, as with Delta. Iceberg's Spark SQL names a table
through a catalog, so the location is read as a Hadoop (file) catalog's table: its warehouse the
location's grandparent, its namespace the parent's name, its name the last part
(``s3a://lake/cdc/orders`` is ``orders`` in namespace ``cdc`` of the warehouse ``s3a://lake``).
The catalog is registered on the session under a name derived from the warehouse
(:func:`register`), so two warehouses never share one. A sync given a JDBC catalog
(:mod:`..iceberg_catalog`) names its tables the same way in that catalog instead, under the
catalog's own name, and creates each at its location. Every part is quoted: a location is data,
never SQL.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_vitess.merge.job.delta_sql import q

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog

CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
# A session setting whose keys Iceberg copies into the summary of every snapshot the session
# commits (Iceberg 1.11+ on Spark 4.0+): how a window's commit carries its app id, seq and mark.
SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."


@dataclass(frozen=True)
class IcebergTable:
    """The table at ``location``: ``namespace.name`` of a Hadoop catalog under ``warehouse``, or
    of the JDBC catalog ``jdbc``."""

    location: str
    warehouse: str
    namespace: str
    name: str
    jdbc: IcebergCatalog | None = None

    @property
    def catalog(self) -> str:
        """The catalog's name in Spark SQL."""
        if self.jdbc is not None:
            return self.jdbc.name
        return "vitess_" + hashlib.sha256(self.warehouse.encode()).hexdigest()[:12]

    @property
    def sql(self) -> str:
        """The table's name in Spark SQL."""
        return self.sql_in(None)

    def sql_in(self, catalog: str | None) -> str:
        """The table's name in Spark SQL in the catalog named ``catalog`` (None: its own)."""
        return f"{q(catalog or self.catalog)}.{q(self.namespace)}.{q(self.name)}"

    def metadata(self, kind: str) -> str:
        """One of the table's metadata tables (``snapshots``, ``metadata_log_entries``...)."""
        return f"{self.sql}.{q(kind)}"


def at(location: str, jdbc: IcebergCatalog | None = None) -> IcebergTable:
    """The table at ``location`` (a path or a URI with at least a warehouse, a namespace and a
    name below its root), in the JDBC catalog ``jdbc`` if one is given."""
    scheme, sep, rest = location.rstrip("/").rpartition("://")
    prefix = f"{scheme}{sep}"
    table_dir, name = posixpath.split(rest)
    warehouse, namespace = posixpath.split(table_dir)
    if not name or not namespace or not warehouse.strip("/"):
        raise ValueError(
            f"Iceberg target {location!r}: an Iceberg target's path needs two levels below the "
            "warehouse it is in (<warehouse>/<namespace>/<table>, e.g. s3a://lake/cdc/orders). "
            "Remedy: give the table a path with a namespace directory above it."
        )
    return IcebergTable(location.rstrip("/"), prefix + warehouse, namespace, name, jdbc)


def register(spark: SparkSession, table: IcebergTable) -> IcebergTable:
    """Make ``table``'s catalog known to ``spark`` (each session has its own catalogs; setting the
    same values again is a no-op)."""
    prefix = f"spark.sql.catalog.{table.catalog}"
    if spark.conf.get(prefix, None) == CATALOG_CLASS:
        return table
    if table.jdbc is None:
        spark.conf.set(f"{prefix}.type", "hadoop")
        spark.conf.set(f"{prefix}.warehouse", table.warehouse)
        spark.conf.set(prefix, CATALOG_CLASS)
        return table
    for key, value in table.jdbc.spark_conf(table.warehouse).items():
        spark.conf.set(f"{prefix}.{key}", value)
    spark.conf.set(prefix, CATALOG_CLASS)
    _open_jdbc_catalog(spark, table.catalog)
    return table


# A JDBC catalog creates (or migrates) its tables in its database when a session first uses it,
# and two doing so at once fail ("Cannot check and eventually update SQL schema"): the job's
# sessions (one a table, in threads) open it one at a time, and a process that lost the race
# to another process opens it again, when the tables exist.
_JDBC_OPENING = threading.Lock()
_JDBC_ATTEMPTS = 3


def _open_jdbc_catalog(spark: SparkSession, catalog: str) -> None:
    with _JDBC_OPENING:
        for attempt in range(1, _JDBC_ATTEMPTS + 1):
            try:
                spark.sql(f"SHOW NAMESPACES IN {q(catalog)}").collect()
                return
            except Exception as exc:  # a Py4J or Connect error, by kind of session
                if "update SQL schema" not in str(exc) or attempt == _JDBC_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
