"""Per-table progress rows of a window (docs/design.md, "Progress and metrics").

``rows_known`` comes from a ``count(*)`` that runs concurrently with the copy and may arrive
after it started, so every field is optional on update: a writer sets only what it knows and
never overwrites the other writer's field. Written often, so the common path is one UPDATE.

A snapshot copied by shard groups has a row per table and group too (``group_progress``: the
group's rows copied, ``count(*)`` of its shards, its phase); the window's figures for a table are
their sums, computed when read (:func:`summed`), so no two groups ever write the same row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints.models import (
    GroupProgressRow,
    TableProgressRow,
    WindowGroupRow,
    WindowRow,
)
from airflow_provider_vitess.checkpoints.states import Phase, TableProgress
from airflow_provider_vitess.exceptions import CheckpointError

_PROGRESS = cast(Table, TableProgressRow.__table__)
_GROUP_PROGRESS = cast(Table, GroupProgressRow.__table__)
_GROUP = cast(Table, WindowGroupRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)


@dataclass(frozen=True)
class GroupProgress:
    """One table's copy in one shard group of a snapshot copied by groups."""

    group: int
    table: str
    rows_known: int | None  # count(*) of the group's shards
    rows_copied: int
    phase: Phase


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
    group: int | None = None,
) -> None:
    """UPDATE the table's row (or, with ``group``, the group's), or INSERT it the first time
    (portable: no dialect upsert); ``begin`` opens the store's (fenced) write transaction."""
    values = {**values, "updated_at": now}
    rows, key = (_PROGRESS, {}) if group is None else (_GROUP_PROGRESS, {"group_no": group})
    where = [rows.c.sync_id == sync_id, rows.c.seq == seq, rows.c.table_name == table]
    where += [rows.c[k] == v for k, v in key.items()]
    for _ in range(2):
        with begin() as conn:
            if conn.execute(update(rows).where(*where).values(**values)).rowcount == 1:
                return
            window = select(_WINDOW.c.seq).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
            if conn.execute(window).first() is None:
                # A clear error instead of the database's foreign key violation.
                raise CheckpointError(f"sync {sync_id!r} has no window {seq}")
        try:
            with begin() as conn:
                first = {"rows_copied": 0, "phase": Phase.COPYING.value, **values}
                conn.execute(insert(rows).values(sync_id=sync_id, seq=seq, table_name=table, **key, **first))
            return
        except IntegrityError:
            continue  # inserted concurrently: update it on the next round
    raise CheckpointError(f"sync {sync_id!r} window {seq}: progress of table {table!r} could not be saved")


def save_in(
    conn: Connection,
    now: datetime,
    sync_id: str,
    seq: int,
    copied: Mapping[str, tuple[int, Phase]],
    group: int | None = None,
) -> None:
    """In a checkpoint's own transaction (``CheckpointStore.record_parts``): each table's rows
    copied and phase as of the position recorded with it, so that a resume never reads a phase
    older than its position (a table finished at that position but still COPYING would be
    copied again). The rows exist already (written when the copy starts); one UPDATE each."""
    rows, key = (_PROGRESS, {}) if group is None else (_GROUP_PROGRESS, {"group_no": group})
    for table, (count, phase) in copied.items():
        where = [rows.c.sync_id == sync_id, rows.c.seq == seq, rows.c.table_name == table]
        where += [rows.c[k] == v for k, v in key.items()]
        values = {"rows_copied": count, "phase": Phase(phase).value, "updated_at": now}
        if conn.execute(update(rows).where(*where).values(**values)).rowcount != 1:
            conn.execute(insert(rows).values(sync_id=sync_id, seq=seq, table_name=table, **key, **values))


def load(engine: Engine, sync_id: str, seq: int) -> list[TableProgress]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(_PROGRESS)
            .where(_PROGRESS.c.sync_id == sync_id, _PROGRESS.c.seq == seq)
            .order_by(_PROGRESS.c.table_name)
        )
        return with_groups(conn, [from_row(r) for r in rows])


def load_groups(conn: Connection, sync_id: str, seq: int) -> list[GroupProgress]:
    """Each group's rows of a snapshot copied by groups, by group and table (none otherwise)."""
    rows = conn.execute(
        select(_GROUP_PROGRESS)
        .where(_GROUP_PROGRESS.c.sync_id == sync_id, _GROUP_PROGRESS.c.seq == seq)
        .order_by(_GROUP_PROGRESS.c.group_no, _GROUP_PROGRESS.c.table_name)
    )
    return [
        GroupProgress(r.group_no, r.table_name, r.rows_known, r.rows_copied, Phase(r.phase)) for r in rows
    ]


def with_groups(conn: Connection, rows: Sequence[TableProgress]) -> list[TableProgress]:
    """``rows`` with the figures of a window copied by groups summed over its groups."""
    out: list[TableProgress] = []
    cache: dict[tuple[str, int], tuple[int, list[GroupProgress]]] = {}
    for row in rows:
        key = (row.sync_id, row.seq)
        if key not in cache:
            count = conn.execute(
                select(func.count()).where(_GROUP.c.sync_id == row.sync_id, _GROUP.c.seq == row.seq)
            ).scalar()
            cache[key] = (int(count or 0), load_groups(conn, *key) if count else [])
        groups, parts = cache[key]
        out.append(summed(row, groups, parts) if groups else row)
    return out


def summed(row: TableProgress, groups: int, parts: Iterable[GroupProgress]) -> TableProgress:
    """The window's progress of ``row``'s table from its ``groups`` groups' rows: rows copied
    and known summed (known only once every group counted its shards), COPIED once every group
    copied it. A table no group has a row for yet keeps ``row`` (planned, nothing copied)."""
    mine = [p for p in parts if p.table == row.table]
    if not mine:
        return row
    counted = len(mine) == groups and all(p.rows_known is not None for p in mine)
    done = len(mine) == groups and all(p.phase is Phase.COPIED for p in mine)
    return replace(
        row,
        rows_copied=sum(p.rows_copied for p in mine),
        rows_known=sum(p.rows_known or 0 for p in mine) if counted else None,
        phase=Phase.COPIED if done else Phase.COPYING,
    )


def by_table(parts: Iterable[GroupProgress], group: int) -> Mapping[str, GroupProgress]:
    """One group's rows by table."""
    return {p.table: p for p in parts if p.group == group}


def from_row(r: Any) -> TableProgress:
    """A :class:`TableProgress` from a ``vitess_sync_table_progress`` row."""
    return TableProgress(
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
