"""The window state machine and the value types the checkpoint store hands out (pure, no I/O).

A window moves ``PLANNED -> STAGED -> MERGED -> COMMITTED`` (docs/design.md, "The window state
machine"). ``FAILED`` abandons a window that was never merged: its staged files are ignored and
the next window starts again from the committed position. A MERGED window can only be committed,
never failed: its rows are already in Delta, and forgetting that would let the checkpoint and
the lakehouse disagree.

Requesting the state a window is already in is an idempotent repeat, not an error: an Airflow
task that recorded its transition and then died before reporting success is retried, and the
retry must be able to call the same method again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from airflow_provider_vitess.exceptions import CheckpointError
from airflow_provider_vitess.vgtid import Vgtid


class WindowState(str, Enum):
    PLANNED = "PLANNED"
    STAGED = "STAGED"
    MERGED = "MERGED"
    COMMITTED = "COMMITTED"
    FAILED = "FAILED"


class WindowKind(str, Enum):
    SNAPSHOT = "snapshot"
    CATCHUP = "catchup"


class Phase(str, Enum):
    """Where one table of a window is: copying rows, copy finished, or streaming changes."""

    COPYING = "copying"
    COPIED = "copied"
    STREAMING = "streaming"


TRANSITIONS: Mapping[WindowState, frozenset[WindowState]] = {
    WindowState.PLANNED: frozenset({WindowState.STAGED, WindowState.FAILED}),
    WindowState.STAGED: frozenset({WindowState.MERGED, WindowState.FAILED}),
    WindowState.MERGED: frozenset({WindowState.COMMITTED}),
    WindowState.COMMITTED: frozenset(),
    WindowState.FAILED: frozenset(),
}

# A window in one of these states blocks planning the next one: it must be finished first.
OPEN_STATES: frozenset[WindowState] = frozenset({WindowState.PLANNED, WindowState.STAGED, WindowState.MERGED})


# The window stats entry holding each table's key choice as the window was staged: the key the
# window is merged with, whatever the sync's current key config says.
WINDOW_KEYS = "keys"
# The same for each table's column choice (capture/columns.py), in the window stats of a sync
# with column control and in the sync's config.
WINDOW_COLUMNS = "columns"


def is_open(state: WindowState) -> bool:
    return state in OPEN_STATES


def check_transition(sync_id: str, seq: int, current: WindowState, requested: WindowState) -> bool:
    """True if ``current -> requested`` changes the window, False if it is an idempotent repeat.

    Raises :class:`CheckpointError` naming the sync, the seq and both states otherwise.
    """
    if requested == current and requested != WindowState.PLANNED:
        return False
    if requested in TRANSITIONS[current]:
        return True
    allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none, it is final"
    raise CheckpointError(
        f"sync {sync_id!r} window {seq}: cannot go from {current.value} to {requested.value} "
        f"(allowed from {current.value}: {allowed})"
    )


def percent(rows_known: int | None, rows_copied: int) -> float | None:
    """Copy progress in percent, None while the row count is still unknown.

    ``count(*)`` runs concurrently with the copy, so the copy may pass the count (rows inserted
    meanwhile); the value is capped at 100 rather than show a confusing 103 %.
    """
    if rows_known is None:
        return None
    if rows_known <= 0:
        return 100.0
    return min(100.0, 100.0 * rows_copied / rows_known)


def lock_is_stale(heartbeat_at: datetime, now: datetime, stale_after: timedelta) -> bool:
    return heartbeat_at < now - stale_after


def vgtid_or_none(text: str | None) -> Vgtid | None:
    return None if text is None else Vgtid.from_json(text)


def window_from_row(row: Any) -> Window:
    """A :class:`Window` from a ``vitess_sync_window`` row (any object with its columns)."""
    return Window(
        sync_id=row.sync_id,
        seq=row.seq,
        kind=WindowKind(row.kind),
        state=WindowState(row.state),
        start_vgtid=Vgtid.from_json(row.start_vgtid),
        stop_vgtid=vgtid_or_none(row.stop_vgtid),
        end_vgtid=vgtid_or_none(row.end_vgtid),
        resume_vgtid=vgtid_or_none(row.resume_vgtid),
        manifest_path=row.manifest_path,
        error=row.error,
        stats=row.stats or {},
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


# ---------------------------------------------------------------------------------------------
# Value types returned by the store: plain frozen data, detached from any database session.


@dataclass(frozen=True)
class Part:
    """One staged file: written once, identified by its path, verified by its checksum.

    ``detail`` is the stager's own JSON-able description (schema, operation counts): what a
    resumed window needs to rebuild its part list without reopening the files.
    """

    path: str
    table: str
    rows: int
    bytes: int
    sha256: str
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("staged part has an empty path")
        if self.rows < 0 or self.bytes < 0:
            raise ValueError(f"staged part {self.path!r}: rows and bytes must be >= 0")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"staged part {self.path!r}: sha256 must be 64 lower-case hex digits")


@dataclass(frozen=True)
class Window:
    sync_id: str
    seq: int
    kind: WindowKind
    state: WindowState
    start_vgtid: Vgtid
    stop_vgtid: Vgtid | None
    end_vgtid: Vgtid | None
    resume_vgtid: Vgtid | None
    manifest_path: str | None
    error: str | None
    stats: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class TableProgress:
    """A table's snapshot copy as the store records it (phase, rows, the key it was copied by)."""

    sync_id: str
    seq: int
    table: str
    rows_known: int | None
    rows_copied: int
    phase: Phase
    key_columns: list[str] | None
    key_source: str | None
    updated_at: datetime

    @property
    def percent(self) -> float | None:
        return percent(self.rows_known, self.rows_copied)


@dataclass(frozen=True)
class TargetVersion:
    """What the sync last wrote to one table: the window seq (its exactly-once marker, Delta's
    transaction version) and the table's version after that commit in its format (None: no
    table was made)."""

    table: str
    merged_seq: int
    table_version: int | None

    @property
    def delta_version(self) -> int | None:
        """``table_version`` by its name before table formats (read by existing callers)."""
        return self.table_version


@dataclass(frozen=True)
class LockInfo:
    sync_id: str
    holder: str
    acquired_at: datetime
    heartbeat_at: datetime

    def describe(self) -> str:
        """How a refused holder learns who to wait for (or which stuck task to clear)."""
        return (
            f"sync {self.sync_id!r} is locked by {self.holder!r} since {self.acquired_at.isoformat()} "
            f"(last heartbeat {self.heartbeat_at.isoformat()})"
        )
