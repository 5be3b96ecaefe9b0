"""An Iceberg JDBC catalog, from an Airflow connection: where an Iceberg sync registers its tables.

Without one, a sync's Iceberg tables are a Hadoop (file) catalog's, found by their locations alone
(:mod:`.job.iceberg_sql`). A JDBC catalog keeps the pointer to each table's current metadata in a
database instead (Iceberg's ``JdbcCatalog``), so every engine configured with that catalog finds
the tables by name, and a commit is a row update the database serialises.

The connection (a ``postgres`` one) gives the database and its credentials; its extra may give
``catalog`` (the catalog's name, which every reader configures too; default: the connection id),
``warehouse`` (where the catalog puts tables by default; default: each table's location less its
last two parts) and ``sslmode``. The parts are split by who may see them:

* :meth:`IcebergCatalog.document`: the name, the JDBC URL and the warehouse, which go in the merge
  plan (a file the job reads);
* :meth:`IcebergCatalog.environment`: the user and password, for the merge job's process
  environment only (never on a command line, in a plan, an operator field or a log).

The Spark session gets both as catalog settings at run time (:mod:`.job.iceberg_sql`), where
Spark's UI redacts the password (``spark.redaction.regex``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from airflow_provider_vitess.exceptions import VitessConnectionError

ENV_USER = "VITESS_ICEBERG_CATALOG_USER"
ENV_PASSWORD = "VITESS_ICEBERG_CATALOG_PASSWORD"

# The connection types a catalog's database may be, with the JDBC URL scheme and the driver Spark
# loads for it (a Maven coordinate served by Maven Central).
DRIVERS: Mapping[str, tuple[str, str]] = {
    "postgres": ("jdbc:postgresql", "org.postgresql:postgresql:42.7.14"),
}
_KNOWN_EXTRAS = frozenset({"catalog", "warehouse", "sslmode"})
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


@dataclass(frozen=True)
class IcebergCatalog:
    """A JDBC catalog named ``name`` in the database at ``uri``; ``user`` and ``password`` are
    its credentials (None in a job that has not read them from its environment yet)."""

    name: str
    uri: str
    driver: str
    warehouse: str | None = None
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    # -- from an Airflow connection ---------------------------------------------------------------

    @classmethod
    def from_connection(
        cls, *, conn_id: str, conn_type: str | None, host: str | None, port: int | None,
        schema: str | None, login: str | None, password: str | None, extra: Mapping[str, Any],
    ) -> IcebergCatalog:  # fmt: skip
        """The catalog a connection names; raises naming the field on anything unusable."""
        kind = (conn_type or "").lower()
        if kind not in DRIVERS:
            raise VitessConnectionError(
                f"connection {conn_id!r} has type {conn_type!r}; an Iceberg JDBC catalog needs a "
                f"{' or '.join(map(repr, DRIVERS))} connection (host, port, schema = the database, "
                "login and password; extra catalog, warehouse, sslmode)"
            )
        unknown = sorted(set(extra) - _KNOWN_EXTRAS)
        if unknown:
            raise VitessConnectionError(
                f"connection {conn_id!r}: unknown extra(s) {', '.join(map(repr, unknown))} for an "
                f"Iceberg catalog; known: {', '.join(sorted(_KNOWN_EXTRAS))}"
            )
        if not host or not schema:
            raise VitessConnectionError(
                f"connection {conn_id!r}: an Iceberg JDBC catalog needs the database's host and "
                "its name (the connection's schema)"
            )
        sslmode = str(extra.get("sslmode") or "")
        if sslmode and sslmode not in _SSLMODES:
            raise VitessConnectionError(
                f"connection {conn_id!r}: extra sslmode must be one of {', '.join(_SSLMODES)}, "
                f"got {sslmode!r}"
            )
        scheme, driver = DRIVERS[kind]
        address = host if port is None else f"{host}:{int(port)}"
        query = f"?{urlencode({'sslmode': sslmode})}" if sslmode else ""
        return cls(
            name=str(extra.get("catalog") or conn_id),
            uri=f"{scheme}://{address}/{quote(schema, safe='')}{query}",
            driver=driver,
            warehouse=str(extra.get("warehouse") or "").rstrip("/") or None,
            user=login or None,
            password=password or None,
        )

    # -- the merge plan and the job's environment -------------------------------------------------

    def document(self) -> dict[str, str]:
        """What the merge plan carries: everything but the credentials."""
        doc = {"name": self.name, "uri": self.uri, "driver": self.driver}
        return doc if self.warehouse is None else {**doc, "warehouse": self.warehouse}

    def environment(self) -> dict[str, str]:
        """The credentials, for the merge job's process environment only."""
        env = {ENV_USER: self.user, ENV_PASSWORD: self.password}
        return {k: v for k, v in env.items() if v}

    @classmethod
    def from_document(cls, doc: Mapping[str, str], env: Mapping[str, str]) -> IcebergCatalog:
        """The catalog :meth:`document` wrote, with the credentials :meth:`environment` gave."""
        return cls(
            name=doc["name"],
            uri=doc["uri"],
            driver=doc["driver"],
            warehouse=doc.get("warehouse"),
            user=env.get(ENV_USER) or None,
            password=env.get(ENV_PASSWORD) or None,
        )

    def spark_conf(self, warehouse: str) -> dict[str, str]:
        """The catalog's settings below ``spark.sql.catalog.<name>`` (``warehouse``: the one to use
        when the connection names none)."""
        # Schema V1 (views as well as tables): Spark asks a catalog for both when it looks a table
        # up, and Iceberg refuses on a V0 schema; an existing V0 database is migrated in place.
        conf = {
            "type": "jdbc",
            "uri": self.uri,
            "warehouse": self.warehouse or warehouse,
            "jdbc.schema-version": "V1",
        }
        if self.user:
            conf["jdbc.user"] = self.user
        if self.password:
            conf["jdbc.password"] = self.password
        return conf


def of_plan(
    document: Mapping[str, str] | None, env: Mapping[str, str], given: IcebergCatalog | None = None
) -> IcebergCatalog | None:
    """The catalog a merge plan names (None: none): ``given`` when the caller read it from its
    connection (a merge on Spark Connect, in the task's process), else the plan's document with
    the credentials from ``env`` (the spark-submit job's process environment)."""
    if document is None:
        return None
    return given if given is not None else IcebergCatalog.from_document(document, env)
