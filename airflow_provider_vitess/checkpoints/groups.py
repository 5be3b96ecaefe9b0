"""Shard groups in the checkpoint store: a window read by several groups at once, each its part.

A window planned with a group layout (``CheckpointStore.plan_window(groups=...)``) gets one row
per group, in the window's own transaction: the shards the group reads, PLANNED. Each group's
reader records its part STAGED (its manifest written) under the group's own lock
(:func:`group_lock_id`), fenced by that lock's token, and only while the window itself is still
PLANNED: a group never records into a window that was discarded or staged meanwhile. The window
becomes STAGED, with one manifest over every group's part, once every group is STAGED
(``capture/groups.py``, under the sync's lock). See docs/design.md, "Shard groups".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Engine, Table, insert, select, update
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints.models import LockRow, WindowGroupRow, WindowRow
from airflow_provider_vitess.checkpoints.states import LockInfo, WindowState, vgtid_or_none
from airflow_provider_vitess.exceptions import CheckpointError
from airflow_provider_vitess.vgtid import Vgtid

_GROUP = cast(Table, WindowGroupRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)
_LOCK = cast(Table, LockRow.__table__)
# The window stats entry holding the group layout (each group's shards), for the status page.
WINDOW_GROUPS = "groups"


def group_lock_id(sync_id: str, group: int) -> str:
    """The lock scope of one group of a sync: groups read at once, each one writer at a time.
    (A sync id has no ``#``-free guarantee, but this name is only ever a lock row's key.)"""
    return f"{sync_id}#group-{group}"


@dataclass(frozen=True)
class WindowGroup:
    """One group's part of a window."""

    sync_id: str
    seq: int
    group: int
    shards: tuple[str, ...]
    state: WindowState
    end_vgtid: Vgtid | None
    manifest_path: str | None
    stats: dict[str, Any] = field(default_factory=dict)
    resume_vgtid: Vgtid | None = None  # a snapshot's group: where its copy resumes


def record_layout(
    conn: Connection, now: datetime, sync_id: str, seq: int, layout: Sequence[Sequence[str]]
) -> None:
    """In the window plan's transaction: one PLANNED row per group."""
    if len(layout) < 2 or any(not shards for shards in layout):
        raise CheckpointError(
            f"sync {sync_id!r} window {seq}: a group layout needs 2+ non-empty groups, got {layout}"
        )
    conn.execute(
        insert(_GROUP),
        [
            {
                "sync_id": sync_id,
                "seq": seq,
                "group_no": g,
                "shards": list(shards),
                "state": WindowState.PLANNED.value,
                "stats": {},
                "created_at": now,
                "updated_at": now,
            }
            for g, shards in enumerate(layout)
        ],
    )


def planned_group(sync_id: str, seq: int, group: int) -> tuple[ColumnElement[bool], ...]:
    """The conditions of an update of one group's row that only a PLANNED group takes (a group
    staged meanwhile, by a retry that took its lock over, is left as it is)."""
    return (
        _GROUP.c.sync_id == sync_id,
        _GROUP.c.seq == seq,
        _GROUP.c.group_no == group,
        _GROUP.c.state == WindowState.PLANNED.value,
    )


def load(conn: Connection, sync_id: str, seq: int) -> list[WindowGroup]:
    """The window's groups, in group order (none: a window read by one process)."""
    return load_many(conn, sync_id, [seq]).get(seq, [])


def load_many(conn: Connection, sync_id: str, seqs: Iterable[int]) -> dict[int, list[WindowGroup]]:
    """The groups of several windows of the sync, in one query (the status page shows a page of
    windows): ``{seq: groups in group order}``; a window read by one process has no entry."""
    wanted = sorted(set(seqs))
    if not wanted:
        return {}
    rows = conn.execute(
        select(_GROUP)
        .where(_GROUP.c.sync_id == sync_id, _GROUP.c.seq.in_(wanted))
        .order_by(_GROUP.c.seq, _GROUP.c.group_no)
    )
    found: dict[int, list[WindowGroup]] = {}
    for r in rows:
        found.setdefault(r.seq, []).append(
            WindowGroup(
                r.sync_id,
                r.seq,
                r.group_no,
                tuple(r.shards),
                WindowState(r.state),
                vgtid_or_none(r.end_vgtid),
                r.manifest_path,
                dict(r.stats or {}),
                vgtid_or_none(r.resume_vgtid),
            )
        )
    return found


def groups_of_windows(engine: Engine, sync_id: str, seqs: Iterable[int]) -> dict[int, list[WindowGroup]]:
    """:func:`load_many` on its own connection (what the status page reads)."""
    with engine.connect() as conn:
        return load_many(conn, sync_id, seqs)


def readers(engine: Engine, groups: Iterable[WindowGroup]) -> dict[tuple[int, int], LockInfo]:
    """Who holds the lock of each of ``groups`` now (a group being read), in one query:
    ``{(seq, group): holder}``. The sync's own lock is free while its groups read."""
    by_lock = {group_lock_id(g.sync_id, g.group): (g.seq, g.group) for g in groups}
    if not by_lock:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(_LOCK).where(_LOCK.c.sync_id.in_(sorted(by_lock)))).all()
    return {by_lock[r.sync_id]: LockInfo(r.sync_id, r.holder, r.acquired_at, r.heartbeat_at) for r in rows}


def mark_staged(
    conn: Connection,
    now: datetime,
    sync_id: str,
    seq: int,
    group: int,
    end_vgtid: Vgtid,
    manifest_path: str,
    stats: Mapping[str, Any],
) -> bool:
    """The group's part is staged: PLANNED -> STAGED, only while the window is PLANNED. Repeating
    it with the same values is a no-op (False); other values are refused (a part is immutable)."""
    where = f"sync {sync_id!r} window {seq} group {group}"
    window = conn.execute(
        select(_WINDOW.c.state).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
    ).first()
    row = conn.execute(
        select(_GROUP).where(_GROUP.c.sync_id == sync_id, _GROUP.c.seq == seq, _GROUP.c.group_no == group)
    ).first()
    if window is None or row is None:
        raise CheckpointError(f"{where} does not exist: plan the window with its groups first")
    end = end_vgtid.to_json()
    if WindowState(row.state) is WindowState.STAGED:
        if (row.end_vgtid, row.manifest_path) != (end, manifest_path):
            raise CheckpointError(
                f"{where} is already STAGED with manifest {row.manifest_path!r}; a staged part is immutable"
            )
        return False
    if WindowState(window.state) is not WindowState.PLANNED:
        raise CheckpointError(
            f"{where}: the window is {window.state}, not PLANNED, so its part cannot be recorded "
            "(the window was discarded or staged meanwhile); nothing was recorded, the next run plans anew"
        )
    changed = conn.execute(
        update(_GROUP)
        .where(*planned_group(sync_id, seq, group))
        .values(
            state=WindowState.STAGED.value,
            end_vgtid=end,
            manifest_path=manifest_path,
            stats=dict(stats),
            updated_at=now,
        )
    ).rowcount
    if changed != 1:
        raise CheckpointError(f"{where} was staged concurrently; re-read it")
    return True
