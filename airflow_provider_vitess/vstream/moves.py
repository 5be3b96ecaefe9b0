"""Tables a MoveTables took away from a sync's keyspace, found before a run reads anything.

vtgate sends no journal for a MoveTables (it follows a Reshard), so a sync would go on reading
the source keyspace silently. Each run reads ``_vt.resharding_journal`` of the keyspace's shards
through vtgate and refuses (:class:`TablesMovedError`) when a journal names one of its tables
and vtgate routes that table to the target keyspace (``docs/design.md``, Event order).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy
from google.protobuf import text_format

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.exceptions import TablesMovedError
from airflow_provider_vitess.hooks.protocol import VitessClient, quote

log = logging.getLogger(__name__)

_NO_SUCH_TABLE = 1146  # a tablet without the sidecar table has never been a workflow's source
# vtgate's answers to a plan of a table it cannot route: unknown database, unknown table, and its
# generic code ("table t not found"). A lost connection (2006, 2013) is not among them.
_CANNOT_ROUTE = (1049, 1105, _NO_SUCH_TABLE)


@dataclass(frozen=True)
class TableMove:
    """A table of the keyspace whose writes a MoveTables switched to ``to_keyspace``."""

    table: str
    to_keyspace: str
    shard: str  # a source shard holding the journal
    position: str  # that shard's position at the switch (the journal's local_position)


def shards_of(hook: VitessClient, keyspace: str) -> list[str]:
    with hook.connect_sql() as conn:
        names = [row[0] for row in conn.execute(sqlalchemy.text("SHOW VITESS_SHARDS"))]
    return [name.split("/", 1)[1] for name in names if name.startswith(f"{keyspace}/")]


def _journals(hook: VitessClient, keyspace: str, shards: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(shard, journal text) of every journal on the shards' primaries."""
    with hook.connect_sql() as conn:
        try:
            for shard in shards:
                conn.exec_driver_sql(f"USE {quote(hook, f'{keyspace}:{shard}@primary')}")
                try:
                    rows = conn.exec_driver_sql("SELECT val FROM _vt.resharding_journal").all()
                except sqlalchemy.exc.DBAPIError as exc:
                    if exc.orig is None or exc.orig.args[:1] != (_NO_SUCH_TABLE,):
                        raise
                    rows = []
                conn.rollback()
                for (val,) in rows:
                    yield shard, val.decode() if isinstance(val, bytes) else str(val)
        finally:
            conn.invalidate()  # the session is aimed at one shard now: never back into the pool


def _served_by(hook: VitessClient, keyspace: str, table: str) -> bool:
    """Whether vtgate sends ``keyspace.table`` to ``keyspace`` itself (routing rules applied).
    A plan naming no keyspace counts as yes; a table vtgate cannot route (moved on again and
    dropped there) as no."""
    sql = f"VEXPLAIN PLAN SELECT 1 FROM {quote(hook, keyspace)}.{quote(hook, table)}"
    with hook.connect_sql() as conn:
        try:
            plan = json.loads(conn.exec_driver_sql(sql).scalar_one())
        except sqlalchemy.exc.DBAPIError as exc:
            if exc.orig is not None and exc.orig.args[:1] and exc.orig.args[0] in _CANNOT_ROUTE:
                return False
            raise
    return _first_keyspace(plan) in (keyspace, None)


def _first_keyspace(plan: Any) -> str | None:
    if isinstance(plan, dict):
        named = plan.get("Keyspace")
        if isinstance(named, dict) and named.get("Name"):
            return str(named["Name"])
        plan = list(plan.values())
    if isinstance(plan, list):
        return next((k for k in map(_first_keyspace, plan) if k), None)
    return None


def parse_journal(text: str) -> binlogdata_pb2.Journal:
    return text_format.Parse(text, binlogdata_pb2.Journal(), allow_unknown_field=True)


def moves_in(
    keyspace: str, tables: Sequence[str], shard: str, journal: binlogdata_pb2.Journal
) -> list[TableMove]:
    """The moves one source shard's journal records for ``tables`` (none for a reshard's)."""
    if journal.migration_type != binlogdata_pb2.MigrationType.TABLES:
        return []
    if not any(p.keyspace == keyspace and p.shard == shard for p in journal.participants):
        return []
    targets = sorted({sg.keyspace for sg in journal.shard_gtids if sg.keyspace != keyspace})
    return [
        TableMove(t, target, shard, journal.local_position)
        for t in tables
        if t in journal.tables
        for target in targets
    ]


def find_moves(hook: VitessClient, keyspace: str, tables: Sequence[str]) -> list[TableMove]:
    """The sync's tables a MoveTables moved out of ``keyspace`` and that were not moved back."""
    found: dict[str, TableMove] = {}
    for shard, text in _journals(hook, keyspace, shards_of(hook, keyspace)):
        for move in moves_in(keyspace, tables, shard, parse_journal(text)):
            found.setdefault(move.table, move)
    return [m for m in found.values() if _served_by(hook, m.to_keyspace, m.table)]


def refuse_moved(hook: VitessClient, sync_id: str, keyspace: str, tables: Sequence[str]) -> None:
    """Raises :class:`TablesMovedError` when a MoveTables switched some of ``tables`` away."""
    moves = find_moves(hook, keyspace, tables)
    if not moves:
        return
    names = ", ".join(repr(m.table) for m in moves)
    targets = sorted({m.to_keyspace for m in moves})
    where = "; ".join(f"{m.table!r} -> keyspace {m.to_keyspace!r}" for m in moves)
    raise TablesMovedError(
        f"sync {sync_id!r}: table(s) {names} moved out of keyspace {keyspace!r} ({where}; MoveTables "
        f"SwitchTraffic at {keyspace}/{moves[0].shard} position {moves[0].position}). A sync reads one "
        f"keyspace and vtgate does not follow a MoveTables, so this sync would no longer see their "
        f"changes; it stopped before reading (its committed windows stay as they are). Remedy: sync "
        f"them from keyspace {' or '.join(map(repr, targets))} — a new sync (a sync's keyspace never "
        f"changes) snapshotted there — and remove them from this sync's tables"
    )
