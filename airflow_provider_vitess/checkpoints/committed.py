"""The committed position of a sync, and the window and Delta version each target table last
took: the rows ``CheckpointStore.commit`` and ``mark_merged`` write inside the window's own
state-change transaction (docs/design.md, "The window state machine").

The position only moves forward: advancing it to a window at or before the committed one raises,
which rolls back the window's state change with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints.models import CheckpointRow, SyncRow, TableProgressRow, TargetRow
from airflow_provider_vitess.checkpoints.states import TargetVersion
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


def advance(conn: Connection, now: datetime, sync_id: str, seq: int, end: str) -> None:
    """Moves the committed position to window ``seq`` ending at ``end``; never backwards."""
    moved = conn.execute(
        update(_CHECKPOINT)
        .where(_CHECKPOINT.c.sync_id == sync_id, _CHECKPOINT.c.committed_seq < seq)
        .values(committed_vgtid=end, committed_seq=seq, updated_at=now)
    ).rowcount
    if moved == 1:
        return
    current = conn.execute(select(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id)).first()
    if current is not None:
        raise CheckpointError(
            f"sync {sync_id!r}: cannot commit window {seq}, the checkpoint is already at window "
            f"{current.committed_seq}"
        )
    conn.execute(
        insert(_CHECKPOINT).values(sync_id=sync_id, committed_vgtid=end, committed_seq=seq, updated_at=now)
    )


def record_target(
    conn: Connection, now: datetime, sync_id: str, table: str, seq: int, delta_version: int | None
) -> None:
    """Table ``table``'s Delta table now holds window ``seq``, committed as ``delta_version``."""
    values = {"merged_seq": seq, "delta_version": delta_version, "updated_at": now}
    where = (_TARGET.c.sync_id == sync_id, _TARGET.c.table_name == table)
    if conn.execute(update(_TARGET).where(*where).values(**values)).rowcount == 0:
        conn.execute(insert(_TARGET).values(sync_id=sync_id, table_name=table, **values))


def target_versions(conn: Connection, sync_id: str) -> dict[str, TargetVersion]:
    """Per table, the last window merged into its Delta table and that commit's version."""
    rows = conn.execute(select(_TARGET).where(_TARGET.c.sync_id == sync_id))
    return {r.table_name: TargetVersion(r.table_name, r.merged_seq, r.delta_version) for r in rows}


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
