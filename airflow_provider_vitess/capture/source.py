"""Questions asked of the source through vtgate's MySQL port: which keyspaces and tables exist,
and how many rows a table has (the ``rows_known`` of snapshot progress).

Names from users only ever reach SQL text as quoted identifiers.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import sqlalchemy

from airflow_provider_vitess.exceptions import UnknownKeyspaceError, UnknownTableError
from airflow_provider_vitess.hooks.protocol import VitessClient, quote

_SYSTEM_SCHEMAS = {"information_schema", "mysql", "performance_schema", "sys", "_vt"}


def _hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def list_keyspaces(hook: VitessClient) -> list[str]:
    with hook.connect_sql() as conn:
        names = [row[0] for row in conn.execute(sqlalchemy.text("SHOW DATABASES"))]
    return sorted(n for n in names if n not in _SYSTEM_SCHEMAS)


def list_tables(hook: VitessClient, keyspace: str) -> list[str]:
    with hook.connect_sql() as conn:
        rows = conn.execute(sqlalchemy.text(f"SHOW TABLES FROM {quote(hook, keyspace)}"))
        return sorted(row[0] for row in rows)


def validate(hook: VitessClient, keyspace: str, tables: list[str]) -> None:
    """Raises an error naming the keyspace or the tables that vtgate does not know."""
    keyspaces = list_keyspaces(hook)
    if keyspace not in keyspaces:
        raise UnknownKeyspaceError(
            f"keyspace {keyspace!r} does not exist in vtgate {hook.config.mysql_target} "
            f"(keyspaces: {', '.join(keyspaces) or 'none'}){_hint(keyspace, keyspaces)}"
        )
    known = list_tables(hook, keyspace)
    missing = [t for t in tables if t not in known]
    if missing:
        hints = "".join(_hint(t, known) for t in missing[:1])
        raise UnknownTableError(
            f"table(s) {', '.join(map(repr, missing))} do not exist in keyspace {keyspace!r}{hints}"
        )


def count_rows(hook: VitessClient, keyspace: str, table: str, shards: Sequence[str] = ()) -> int:
    """``count(*)`` on the connection's tablet type: a full scan, which a user who streams from
    replicas wants kept off the primary. vtgate honours a tablet type named in ``USE`` (outside
    a transaction) but silently reads the primary for one named in a ``FROM`` qualifier.
    ``shards``: the sum of those shards' counts only (a shard group's), each read through a
    shard target (``USE `keyspace:shard@type```)."""
    tablet_type = hook.config.tablet_type.lower()
    targets = [f"{keyspace}:{shard}@{tablet_type}" for shard in shards] or [f"{keyspace}@{tablet_type}"]
    with hook.connect_sql() as conn:
        try:
            session = conn.execution_options(isolation_level="AUTOCOMMIT")
            total = 0
            for target in targets:
                session.exec_driver_sql(f"USE {quote(hook, target)}")
                total += int(
                    session.exec_driver_sql(f"SELECT COUNT(*) FROM {quote(hook, table)}").scalar_one()
                )
            return total
        finally:
            conn.invalidate()  # the session is aimed at a tablet type now: never back into the pool
