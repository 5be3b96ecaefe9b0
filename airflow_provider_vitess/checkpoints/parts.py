"""Staged parts of a window in the checkpoint store: the files a window has written, each with
its checksum, and the VGTID a killed window resumes from (docs/design.md, "Snapshots resume").

Written under the sync's lock, in the store's transaction: a part is recorded once (a retried
batch re-records it as a no-op) and never replaced by a different file under the same path.
A snapshot copied by shard groups records each group's parts (``group_no``) and resume position
(its ``vitess_sync_window_group`` row) under the group's lock: groups record at once, so two of
them may race for the next part numbers (:class:`PartNumbersTaken`, retried by the store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints import progress
from airflow_provider_vitess.checkpoints.groups import planned_group
from airflow_provider_vitess.checkpoints.models import WindowGroupRow, WindowPartRow, WindowRow
from airflow_provider_vitess.checkpoints.states import Part, Phase, WindowState
from airflow_provider_vitess.exceptions import CheckpointError

_PART = cast(Table, WindowPartRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)
_GROUP = cast(Table, WindowGroupRow.__table__)


class PartNumbersTaken(CheckpointError):
    """Another writer took the same part numbers in the window meanwhile (a group, or a writer
    that lost the lock: the fence tells them apart on the retry)."""


def checkpoint(
    begin: Callable[[], AbstractContextManager[Connection]],
    clock: Callable[[], datetime],
    sync_id: str,
    seq: int,
    parts: Sequence[Part],
    resume: str,
    group: int | None,
    copied: Mapping[str, tuple[int, Phase]],
) -> int:
    """``CheckpointStore.record_parts``: in one transaction (``begin``: the store's, fenced),
    the parts, the resume position and each table's phase, into a PLANNED window; retried when
    another group took the same part numbers meanwhile. Returns how many parts were new."""
    for attempt in range(5):
        try:
            with begin() as conn:
                state = conn.execute(
                    select(_WINDOW.c.state).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
                ).scalar()
                if state is None:
                    raise CheckpointError(f"sync {sync_id!r} has no window {seq}")
                if WindowState(state) is not WindowState.PLANNED:
                    raise CheckpointError(
                        f"sync {sync_id!r} window {seq} is {state}: parts can only be recorded while "
                        "PLANNED (a window's files are immutable once its manifest exists)"
                    )
                now = clock()
                new = record(conn, now, sync_id, seq, parts, resume, group)
                progress.save_in(conn, now, sync_id, seq, copied, group)
                return new
        except PartNumbersTaken:
            if group is None or attempt == 4:  # one writer per window: a real conflict
                raise
    raise AssertionError("unreachable")


def load(conn: Connection, sync_id: str, seq: int, group: int | None = None) -> list[Part]:
    """The window's parts, or (``group``) the parts that shard group recorded."""
    query = select(_PART).where(_PART.c.sync_id == sync_id, _PART.c.seq == seq)
    if group is not None:
        query = query.where(_PART.c.group_no == group)
    rows = conn.execute(query.order_by(_PART.c.part_no))
    return [Part(r.path, r.table_name, r.row_count, r.byte_count, r.sha256, r.detail or {}) for r in rows]


def record(
    conn: Connection,
    now: datetime,
    sync_id: str,
    seq: int,
    parts: Sequence[Part],
    resume: str,
    group: int | None = None,
) -> int:
    """Records the parts not yet known and moves the PLANNED window's resume position (or
    ``group``'s) to ``resume``; returns how many parts were new."""
    known = {p.path: p for p in load(conn, sync_id, seq)}
    last = conn.execute(
        select(func.max(_PART.c.part_no)).where(_PART.c.sync_id == sync_id, _PART.c.seq == seq)
    ).scalar()
    rows: list[dict[str, Any]] = []
    for part in parts:
        if part.path in known:
            if known[part.path] != part:
                raise CheckpointError(
                    f"sync {sync_id!r} window {seq}: part {part.path!r} is already recorded as "
                    f"{known[part.path]}, refusing {part}"
                )
            continue
        known[part.path] = part
        rows.append(
            {
                "sync_id": sync_id,
                "seq": seq,
                "part_no": (last or 0) + len(rows) + 1,
                "path": part.path,
                "table_name": part.table,
                "row_count": part.rows,
                "byte_count": part.bytes,
                "sha256": part.sha256,
                "resume_vgtid": resume,
                "detail": part.detail,
                "created_at": now,
                "group_no": group,
            }
        )
    try:
        if rows:
            conn.execute(insert(_PART), rows)
    except IntegrityError as exc:
        # Same part numbers taken by another writer: only one may hold the sync's lock (or, for a
        # group, the group's: another group's parts are retried with new numbers by the store).
        raise PartNumbersTaken(f"sync {sync_id!r} window {seq}: parts recorded concurrently") from exc
    if group is None:
        set_resume(conn, now, sync_id, seq, resume)
    else:
        set_group_resume(conn, now, sync_id, seq, group, resume)
    return len(rows)


def set_group_resume(
    conn: Connection, now: datetime, sync_id: str, seq: int, group: int, resume: str
) -> None:
    """A group's resume position, while the window and the group are PLANNED (a group staged,
    or a window discarded meanwhile, records nothing more)."""
    window = conn.execute(
        select(_WINDOW.c.state).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
    ).scalar()
    changed = 0
    if window == WindowState.PLANNED.value:
        changed = conn.execute(
            update(_GROUP)
            .where(*planned_group(sync_id, seq, group))
            .values(resume_vgtid=resume, updated_at=now)
        ).rowcount
    if changed != 1:
        raise CheckpointError(
            f"sync {sync_id!r} window {seq} group {group} is not PLANNED (window {window}): its parts "
            "cannot be recorded; nothing was recorded, the next run plans anew"
        )


def set_resume(conn: Connection, now: datetime, sync_id: str, seq: int, resume: str) -> None:
    """The PLANNED window's resume position (in the parts' transaction: both or neither)."""
    changed = conn.execute(
        update(_WINDOW)
        .where(
            _WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq, _WINDOW.c.state == WindowState.PLANNED.value
        )
        .values(resume_vgtid=resume, updated_at=now)
    ).rowcount
    if changed != 1:
        raise CheckpointError(f"sync {sync_id!r} window {seq} left PLANNED while its parts were recorded")
