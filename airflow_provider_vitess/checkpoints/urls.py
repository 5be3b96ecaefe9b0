"""Which database an Airflow connection names for the checkpoint store, as a SQLAlchemy URL.

Duck-typed on the connection (``conn_type``, ``host``, ``get_uri()``) so that the task side
(``airflow.sdk`` connections) and the API server (``airflow.models`` connections) share it
without this module importing Airflow.
"""

from __future__ import annotations

from typing import Protocol

# Airflow connection types -> the SQLAlchemy driver the store uses for them.
_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
    "sqlite": "sqlite",
}


class ConnectionLike(Protocol):
    conn_type: str | None
    host: str | None

    def get_uri(self) -> str: ...


def url_from_connection(conn: ConnectionLike) -> str:
    """The store's URL; the credentials stay in the connection and are never logged."""
    if conn.conn_type == "sqlite" and conn.host:
        return f"sqlite:///{conn.host}"
    scheme, _, rest = conn.get_uri().partition("://")
    driver = _DRIVERS.get(scheme.split("+")[0], scheme)
    return f"{driver}://{rest}"
