"""The committed position of a sync, and the window and Delta version each target table last
took: the rows ``CheckpointStore.commit`` and ``mark_merged`` write inside the window's own
state-change transaction (docs/design.md, "The window state machine").

The position only moves forward: advancing it to a window at or before the committed one raises,
which rolls back the window's state change with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, insert, select, update
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints import freshness
from airflow_provider_vitess.checkpoints.models import CheckpointRow, SyncRow, TableProgressRow, TargetRow
from airflow_provider_vitess.checkpoints.states import TargetVersion, WindowKind
from airflow_provider_vitess.exceptions import CheckpointError

_CHECKPOINT = cast(Table, CheckpointRow.__table__)
_SYNC = cast(Table, SyncRow.__table__)
_TARGET = cast(Table, TargetRow.__table__)
_PROGRESS = cast(Table, TableProgressRow.__table__)


def position(conn: Connection, sync_id: str) -> tuple[str | None, int]:
    """The committed VGTID (JSON) and window seq; ``(None, 0)`` before the first commit."""
    row = conn.execute(select(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id)).first()
    return (None, 0) if row is None else (row.committed_vgtid, row.committed_seq)


def covers_every_table(conn: Connection, sync_id: str, seq: int) -> bool:
    """Did window ``seq`` copy every table of the sync (a full snapshot, not a re-snapshot of some)?"""
    tables = conn.execute(select(_SYNC.c.tables).where(_SYNC.c.sync_id == sync_id)).scalar()
    copied = conn.execute(
        select(_PROGRESS.c.table_name).where(_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq == seq)
    ).scalars()
    return set(tables or ()) <= set(copied)


def advance(
    conn: Connection, now: datetime, sync_id: str, seq: int, end: str, as_of: datetime | None = None
) -> None:
    """Moves the committed position to window ``seq`` ending at ``end``; never backwards. ``as_of``:
    the position's time (:mod:`.freshness`); None keeps the time the sync had."""
    values = {"committed_vgtid": end, "committed_seq": seq, "updated_at": now}
    if as_of is not None:
        values["as_of"] = as_of
    moved = conn.execute(
        update(_CHECKPOINT)
        .where(_CHECKPOINT.c.sync_id == sync_id, _CHECKPOINT.c.committed_seq < seq)
        .values(**values)
    ).rowcount
    if moved == 1:
        return
    current = conn.execute(select(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id)).first()
    if current is not None:
        raise CheckpointError(
            f"sync {sync_id!r}: cannot commit window {seq}, the checkpoint is already at window "
            f"{current.committed_seq}"
        )
    conn.execute(insert(_CHECKPOINT).values(sync_id=sync_id, **values))


def commit_position(conn: Connection, now: datetime, window: Row[Any], changed: bool) -> str:
    """The committed position after the commit of ``window`` (its row; ``changed``: False on an
    idempotent repeat, which writes nothing), moved there with its time (:mod:`.freshness`)."""
    sync_id, seq = window.sync_id, window.seq
    kind = WindowKind(window.kind)
    end = cast(str, window.end_vgtid)  # set by mark_staged, and a MERGED window was STAGED
    at, _ = position(conn, sync_id)
    as_of = freshness.window_as_of(kind, window.stats or {}, window.created_at)
    if at is not None and kind is WindowKind.SNAPSHOT and not covers_every_table(conn, sync_id, seq):
        # A re-snapshot of some tables while the sync already streams: the other tables are only
        # at the committed position, so the stream resumes there, and the re-copied tables skip
        # the changes their copy holds (capture/copy_positions). A re-snapshot of every table is
        # a new start: the stream resumes at its end.
        if changed:
            record_copy(conn, sync_id, seq, end)
        end, as_of = at, None  # the position, and so its time, stay
    if changed:
        advance(conn, now, sync_id, seq, end, as_of)
    return end


def record_target(
    conn: Connection, now: datetime, sync_id: str, table: str, seq: int, table_version: int | None
) -> None:
    """Table ``table``'s target now holds window ``seq``, committed as ``table_version``."""
    values = {"merged_seq": seq, "table_version": table_version, "updated_at": now}
    where = (_TARGET.c.sync_id == sync_id, _TARGET.c.table_name == table)
    if conn.execute(update(_TARGET).where(*where).values(**values)).rowcount == 0:
        conn.execute(insert(_TARGET).values(sync_id=sync_id, table_name=table, **values))


def target_versions(conn: Connection, sync_id: str) -> dict[str, TargetVersion]:
    """Per table, the last window merged into its Delta table and that commit's version."""
    rows = conn.execute(select(_TARGET).where(_TARGET.c.sync_id == sync_id))
    return {r.table_name: TargetVersion(r.table_name, r.merged_seq, r.table_version) for r in rows}


COPIED_AT = "copied_at"  # sync config: table -> the VGTID its latest re-snapshot copied it at


def record_copy(conn: Connection, sync_id: str, seq: int, end: str) -> None:
    """A re-snapshot of some tables commits without moving the position: each copied table
    notes where its copy was taken, so the catch-ups that read the stretch again skip its
    changes up to there (``capture/copy_positions``)."""
    tables = conn.execute(
        select(_PROGRESS.c.table_name).where(_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq == seq)
    ).scalars()
    config = dict(conn.execute(select(_SYNC.c.config).where(_SYNC.c.sync_id == sync_id)).scalar() or {})
    config[COPIED_AT] = {**dict(config.get(COPIED_AT) or {}), **{t: end for t in tables}}
    conn.execute(update(_SYNC).where(_SYNC.c.sync_id == sync_id).values(config=config))
