"""Staged parts of a window in the checkpoint store: the files a window has written, each with
its checksum, and the VGTID a killed window resumes from (docs/design.md, "Snapshots resume").

Written under the sync's lock, in the store's transaction: a part is recorded once (a retried
batch re-records it as a no-op) and never replaced by a different file under the same path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints.models import WindowPartRow, WindowRow
from airflow_provider_vitess.checkpoints.states import Part, WindowState
from airflow_provider_vitess.exceptions import CheckpointError

_PART = cast(Table, WindowPartRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)


def load(conn: Connection, sync_id: str, seq: int) -> list[Part]:
    rows = conn.execute(
        select(_PART).where(_PART.c.sync_id == sync_id, _PART.c.seq == seq).order_by(_PART.c.part_no)
    )
    return [Part(r.path, r.table_name, r.row_count, r.byte_count, r.sha256, r.detail or {}) for r in rows]


def record(
    conn: Connection, now: datetime, sync_id: str, seq: int, parts: Sequence[Part], resume: str
) -> int:
    """Records the parts not yet known and moves the PLANNED window's resume position to
    ``resume``; returns how many parts were new."""
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
            }
        )
    try:
        if rows:
            conn.execute(insert(_PART), rows)
    except IntegrityError as exc:
        # Same part numbers taken by another writer: only one may hold the sync's lock.
        raise CheckpointError(f"sync {sync_id!r} window {seq}: parts recorded concurrently") from exc
    set_resume(conn, now, sync_id, seq, resume)
    return len(rows)


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
