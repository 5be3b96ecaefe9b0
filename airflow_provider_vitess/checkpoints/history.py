"""Read-only queries over a checkpoint store for dashboards: which syncs exist, their recent
windows, and each table's latest progress row.

Kept apart from :mod:`.store` (which owns every write and its invariants): nothing here changes
a row, so the status page can read a store that running tasks are writing without taking a lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, func, select

from airflow_provider_vitess.checkpoints import models, progress
from airflow_provider_vitess.checkpoints.states import TableProgress, Window, WindowKind, window_from_row

_SYNC = cast(Table, models.SyncRow.__table__)
_WINDOW = cast(Table, models.WindowRow.__table__)
_PROGRESS = cast(Table, models.TableProgressRow.__table__)
_CHECKPOINT = cast(Table, models.CheckpointRow.__table__)


@dataclass(frozen=True)
class SyncInfo:
    """A sync as ``ensure_sync`` recorded it: keyspace, tables and config (keys, staging)."""

    sync_id: str
    keyspace: str
    tables: list[str]
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime


def _sync(row: Any) -> SyncInfo:
    return SyncInfo(
        row.sync_id,
        row.keyspace,
        list(row.tables or []),
        dict(row.config or {}),
        row.created_at,
        row.updated_at,
    )


def syncs(engine: Engine) -> list[SyncInfo]:
    """Every sync of the store, by id."""
    with engine.connect() as conn:
        return [_sync(r) for r in conn.execute(select(_SYNC).order_by(_SYNC.c.sync_id))]


def sync(engine: Engine, sync_id: str) -> SyncInfo | None:
    with engine.connect() as conn:
        row = conn.execute(select(_SYNC).where(_SYNC.c.sync_id == sync_id)).first()
    return None if row is None else _sync(row)


def recent_windows(engine: Engine, sync_id: str, limit: int) -> list[Window]:
    """The sync's last ``limit`` windows, newest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(_WINDOW).where(_WINDOW.c.sync_id == sync_id).order_by(_WINDOW.c.seq.desc()).limit(limit)
        )
        return [window_from_row(r) for r in rows]


def last_failed_window(engine: Engine, sync_id: str) -> Window | None:
    """The newest FAILED window (its ``error`` says why), however far back."""
    with engine.connect() as conn:
        row = conn.execute(
            select(_WINDOW)
            .where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.state == "FAILED")
            .order_by(_WINDOW.c.seq.desc())
            .limit(1)
        ).first()
    return None if row is None else window_from_row(row)


def latest_progress(engine: Engine, sync_id: str) -> dict[str, TableProgress]:
    """Each table's progress row of its latest snapshot window (its last copy).

    Catch-up windows have progress rows too (the key they staged with, no copy counts), so the
    newest row of a table is not its copy's: only snapshot windows count here.
    """
    snapshots = select(_WINDOW.c.seq).where(
        _WINDOW.c.sync_id == sync_id, _WINDOW.c.kind == WindowKind.SNAPSHOT.value
    )
    newest = (
        select(_PROGRESS.c.table_name, func.max(_PROGRESS.c.seq).label("seq"))
        .where(_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq.in_(snapshots))
        .group_by(_PROGRESS.c.table_name)
        .subquery()
    )
    query = select(_PROGRESS).join(
        newest,
        (_PROGRESS.c.table_name == newest.c.table_name) & (_PROGRESS.c.seq == newest.c.seq),
    )
    with engine.connect() as conn:
        rows = conn.execute(query.where(_PROGRESS.c.sync_id == sync_id).order_by(_PROGRESS.c.table_name))
        found = progress.with_groups(conn, [progress.from_row(r) for r in rows])
        return {p.table: p for p in found}


@dataclass(frozen=True)
class Checkpoint:
    """The committed position's row: where the sync stands and when it got there."""

    sync_id: str
    committed_vgtid: str
    committed_seq: int
    updated_at: datetime
    as_of: datetime | None = None  # every source transaction before it is in the targets
    freshness_sla: float | None = None  # seconds (the merge task's objective)


def checkpoint(engine: Engine, sync_id: str) -> Checkpoint | None:
    with engine.connect() as conn:
        row = conn.execute(select(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id)).first()
    if row is None:
        return None
    return Checkpoint(
        row.sync_id, row.committed_vgtid, row.committed_seq, row.updated_at, row.as_of, row.freshness_sla
    )
