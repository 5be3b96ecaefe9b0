"""Per-table progress rows of a window (DESIGN.md, "Progress and metrics").

``rows_known`` comes from a ``count(*)`` that runs concurrently with the copy and may arrive
after it started, so every field is optional on update: a writer sets only what it knows and
never overwrites the other writer's field. Written often, so the common path is one UPDATE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints.models import TableProgressRow, WindowRow
from airflow_provider_vitess.checkpoints.states import Phase, TableProgress
from airflow_provider_vitess.exceptions import CheckpointError

_PROGRESS = cast(Table, TableProgressRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)


def changes(
    rows_known: int | None,
    rows_copied: int | None,
    phase: Phase | str | None,
    key_columns: Sequence[str] | None,
    key_source: str | None,
) -> dict[str, Any]:
    """The columns to write: the given fields only, validated (None means "leave as it is")."""
    for name, count in (("rows_known", rows_known), ("rows_copied", rows_copied)):
        if count is not None and count < 0:
            raise ValueError(f"{name} must be >= 0, got {count}")
    given = {
        "rows_known": rows_known,
        "rows_copied": rows_copied,
        "phase": None if phase is None else Phase(phase).value,
        "key_columns": None if key_columns is None else list(key_columns),
        "key_source": key_source,
    }
    return {k: v for k, v in given.items() if v is not None}


def save(
    begin: Callable[[], AbstractContextManager[Connection]],
    now: datetime,
    sync_id: str,
    seq: int,
    table: str,
    values: dict[str, Any],
) -> None:
    """UPDATE the table's row, or INSERT it the first time (portable: no dialect upsert);
    ``begin`` opens the store's (fenced) write transaction."""
    values = {**values, "updated_at": now}
    where = (_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq == seq, _PROGRESS.c.table_name == table)
    for _ in range(2):
        with begin() as conn:
            if conn.execute(update(_PROGRESS).where(*where).values(**values)).rowcount == 1:
                return
            window = select(_WINDOW.c.seq).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
            if conn.execute(window).first() is None:
                # A clear error instead of the database's foreign key violation.
                raise CheckpointError(f"sync {sync_id!r} has no window {seq}")
        try:
            with begin() as conn:
                first = {"rows_copied": 0, "phase": Phase.COPYING.value, **values}
                conn.execute(insert(_PROGRESS).values(sync_id=sync_id, seq=seq, table_name=table, **first))
            return
        except IntegrityError:
            continue  # inserted concurrently: update it on the next round
    raise CheckpointError(f"sync {sync_id!r} window {seq}: progress of table {table!r} could not be saved")


def load(engine: Engine, sync_id: str, seq: int) -> list[TableProgress]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(_PROGRESS)
            .where(_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq == seq)
            .order_by(_PROGRESS.c.table_name)
        )
        return [
            TableProgress(
                sync_id=r.sync_id,
                seq=r.seq,
                table=r.table_name,
                rows_known=r.rows_known,
                rows_copied=r.rows_copied,
                phase=Phase(r.phase),
                key_columns=r.key_columns,
                key_source=r.key_source,
                updated_at=r.updated_at,
            )
            for r in rows
        ]
