"""The version every table of a sync had after a committed window: a consistent cut.

Each table of a window gets a commit of its own (neither Delta nor Iceberg has a multi-table
transaction), so a reader that opens ``customer`` and ``corder`` between the two commits of one
window sees half a transaction. The store records, in the window's MERGED transaction, the version
each commit produced (``record``), with the table's format and, for Iceberg, the snapshot id of
the commit (:class:`TableCommit`: Iceberg's time travel names a snapshot, not our version); the
cut at window W takes, per table, the version of its latest row at or before W: a table a window
did not change keeps the version an earlier window left. Reading every table at its cut version
(the format's time travel) gives all of them at one source position.

A re-snapshot of some of the tables (``resnapshot_tables``, or tables that joined the sync) is the
exception: its window leaves the copied tables at their copy's position and the others at the
previous window's, so a transaction between the two shows in one table only. No cut is taken at
such a window (:func:`torn_by`): the committed position's cut, and one by time, are the newest
window's before it; asked for by number, it is refused, naming the windows around it. The
catch-up window after it brings every table to one position again.

How far back: the rows of windows the store prunes go too, but the cut at the oldest window
kept stays complete (each table keeps its newest row before it); the committed position's row
records that oldest window (``versions_from``), and older cuts are refused by name. Delta's own retention
(``delta.logRetentionDuration``, ``VACUUM``) bounds the time travel itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints.models import CheckpointRow, WindowRow, WindowVersionRow
from airflow_provider_vitess.checkpoints.states import WindowKind
from airflow_provider_vitess.exceptions import CutUnavailableError

_VERSION = cast(Table, WindowVersionRow.__table__)
_CHECKPOINT = cast(Table, CheckpointRow.__table__)
_WINDOW = cast(Table, WindowRow.__table__)


# The format of a version recorded before the store kept formats (revision 0007): every table
# a released provider wrote was Delta.
UNRECORDED_FORMAT = "delta"


@dataclass(frozen=True)
class TableCommit:
    """How a window's commit of a table is read again: the table's format (``delta``,
    ``iceberg``) and, where the format's time travel names a commit by an id of its own
    (Iceberg's snapshot id), that id; ``catalog``: the JDBC catalog the table is named in (None:
    named by its location)."""

    table_format: str
    snapshot_id: int | None = None
    catalog: str | None = None


@dataclass(frozen=True)
class TableVersion:
    """One table of a cut: where its table is, and the version to read."""

    table: str
    path: str
    version: int
    seq: int  # the window that produced this version
    recorded_format: str | None = None  # None: recorded before revision 0007 (Delta)
    snapshot_id: int | None = None  # the Iceberg snapshot of the version (None: Delta, or not recorded)
    catalog: str | None = None  # the JDBC catalog an Iceberg table is named in (None: by its location)

    @property
    def table_format(self) -> str:
        """The table's format: the recorded one, else Delta (:data:`UNRECORDED_FORMAT`)."""
        return self.recorded_format or UNRECORDED_FORMAT


@dataclass(frozen=True)
class Cut:
    """Every table of a sync at one source position: the end of committed window ``seq``.
    A table the sync had no table for by then (added later) is not in it."""

    sync_id: str
    seq: int
    tables: dict[str, TableVersion]


def record(
    conn: Connection,
    now: datetime,
    sync_id: str,
    seq: int,
    targets: Mapping[str, int | None],
    paths: Mapping[str, str],
    commits: Mapping[str, TableCommit] | None = None,
) -> None:
    """Window ``seq`` produced version ``targets[t]`` of each table ``t`` at ``paths[t]``, the
    commit ``commits[t]`` (idempotent); a table without a version (no table made) or a path is
    left out, one without a commit is recorded without a format (read as Delta)."""
    for table, version in targets.items():
        path = paths.get(table)
        if version is None or path is None:
            continue
        where = (_VERSION.c.sync_id == sync_id, _VERSION.c.seq == seq, _VERSION.c.table_name == table)
        commit = (commits or {}).get(table)
        values = {
            "table_version": version,
            "path": path,
            "merged_at": now,
            "table_format": None if commit is None else commit.table_format,
            "snapshot_id": None if commit is None else commit.snapshot_id,
            "catalog": None if commit is None else commit.catalog,
        }
        if conn.execute(update(_VERSION).where(*where).values(**values)).rowcount == 0:
            conn.execute(insert(_VERSION).values(sync_id=sync_id, seq=seq, table_name=table, **values))


def prune(conn: Connection, sync_id: str, before: int) -> None:
    """Forget the versions of windows before ``before`` but each table's newest one among them
    (the cut at ``before`` still needs it), and record ``before`` as the oldest cut."""
    newest = (
        select(_VERSION.c.table_name, func.max(_VERSION.c.seq).label("seq"))
        .where(_VERSION.c.sync_id == sync_id, _VERSION.c.seq < before)
        .group_by(_VERSION.c.table_name)
    )
    keep = {(r.table_name, int(r.seq)) for r in conn.execute(newest)}
    old = conn.execute(
        select(_VERSION.c.table_name, _VERSION.c.seq).where(
            _VERSION.c.sync_id == sync_id, _VERSION.c.seq < before
        )
    ).all()  # read whole before deleting on the same connection
    for row in old:
        if (row.table_name, int(row.seq)) not in keep:
            conn.execute(
                delete(_VERSION).where(
                    _VERSION.c.sync_id == sync_id,
                    _VERSION.c.seq == row.seq,
                    _VERSION.c.table_name == row.table_name,
                )
            )
    conn.execute(
        update(_CHECKPOINT)
        .where(
            _CHECKPOINT.c.sync_id == sync_id,
            (_CHECKPOINT.c.versions_from.is_(None)) | (_CHECKPOINT.c.versions_from < before),
        )
        .values(versions_from=before)
    )


def cut(conn: Connection, sync_id: str, seq: int | None = None, as_of: datetime | None = None) -> Cut:
    """The cut at committed window ``seq``, or at the newest window merged at or before
    ``as_of``, or (neither given) at the committed position."""
    if seq is not None and as_of is not None:
        raise ValueError("give a window or a time, not both")
    asked = seq  # a window asked for by number is refused rather than moved
    point = conn.execute(
        select(_CHECKPOINT.c.committed_seq, _CHECKPOINT.c.versions_from).where(
            _CHECKPOINT.c.sync_id == sync_id
        )
    ).first()
    if point is None:
        raise CutUnavailableError(f"sync {sync_id!r} has no committed window yet: nothing to read")
    committed, oldest = int(point.committed_seq), int(point.versions_from or 0)
    if as_of is not None:
        found = conn.execute(
            select(func.max(_VERSION.c.seq)).where(
                _VERSION.c.sync_id == sync_id, _VERSION.c.merged_at <= as_of, _VERSION.c.seq <= committed
            )
        ).scalar()
        if found is None:
            raise CutUnavailableError(
                f"sync {sync_id!r}: no window it keeps versions for was merged by {as_of.isoformat()}"
            )
        seq = int(found)
    seq = int(committed) if seq is None else seq
    if seq > committed:
        raise CutUnavailableError(
            f"sync {sync_id!r}: window {seq} is not committed (the sync is committed up to window "
            f"{committed}); take a cut at a committed window"
        )
    if seq < oldest:
        raise CutUnavailableError(
            f"sync {sync_id!r}: window {seq} is older than the oldest window the store keeps table "
            f"versions for ({oldest}); the merge operator's keep_records sets how many windows stay"
        )
    while (stale := torn_by(conn, sync_id, seq)) is not None:
        if asked is not None:
            raise CutUnavailableError(
                f"sync {sync_id!r}: window {seq} re-copied some tables while {stale} stayed at the "
                f"window before, so no cut at it holds every transaction whole; read the cut at "
                f"window {seq - 1} (before the copy) or at the catch-up window after it"
            )
        if seq - 1 < oldest or seq <= 1:
            raise CutUnavailableError(
                f"sync {sync_id!r}: window {seq} re-copied some tables while {stale} stayed at the "
                "window before, and the store keeps no earlier window's versions; read the cut "
                "once the next catch-up window is committed"
            )
        seq -= 1  # the newest whole cut before the re-copy
    latest = (
        select(_VERSION.c.table_name, func.max(_VERSION.c.seq).label("seq"))
        .where(_VERSION.c.sync_id == sync_id, _VERSION.c.seq <= seq)
        .group_by(_VERSION.c.table_name)
        .subquery()
    )
    rows = conn.execute(
        select(_VERSION)
        .join(
            latest,
            (_VERSION.c.table_name == latest.c.table_name) & (_VERSION.c.seq == latest.c.seq),
        )
        .where(_VERSION.c.sync_id == sync_id)
    )
    tables = {r.table_name: _table_version(r) for r in rows}
    return Cut(sync_id, seq, dict(sorted(tables.items())))


def _table_version(row: Row[Any]) -> TableVersion:
    snapshot = None if row.snapshot_id is None else int(row.snapshot_id)
    return TableVersion(
        row.table_name,
        row.path,
        int(row.table_version),
        int(row.seq),
        row.table_format,
        snapshot,
        row.catalog,
    )


def torn_by(conn: Connection, sync_id: str, seq: int) -> list[str] | None:
    """The tables a snapshot window ``seq`` left at an earlier window's position while it copied
    others (a partial re-snapshot: module docstring), or None when its cut is whole."""
    kind = conn.execute(
        select(_WINDOW.c.kind).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)
    ).scalar()
    if kind != WindowKind.SNAPSHOT.value:
        return None
    tables = select(_VERSION.c.table_name).where(_VERSION.c.sync_id == sync_id)
    before = set(conn.execute(tables.where(_VERSION.c.seq < seq)).scalars())
    copied = set(conn.execute(tables.where(_VERSION.c.seq == seq)).scalars())
    stale = sorted(before - copied)
    return stale if stale and copied else None
