"""The window state machine and the checkpoint store's value types (pure, no database)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.dialects import sqlite

from airflow_provider_vitess.checkpoints import models
from airflow_provider_vitess.checkpoints.progress import changes
from airflow_provider_vitess.checkpoints.states import (
    OPEN_STATES,
    LockInfo,
    Part,
    Phase,
    TableProgress,
    WindowKind,
    WindowState,
    check_transition,
    is_open,
    lock_is_stale,
    percent,
)
from airflow_provider_vitess.exceptions import CheckpointError, SyncLockedError, VitessProviderError

P, S, M, C, F = (WindowState[n] for n in ("PLANNED", "STAGED", "MERGED", "COMMITTED", "FAILED"))

# The whole machine, written out: (current, requested) -> True (moves) / False (idempotent repeat).
LEGAL = {
    (P, S): True,
    (P, F): True,
    (S, M): True,
    (S, F): True,
    (M, C): True,
    (S, S): False,
    (M, M): False,
    (C, C): False,
    (F, F): False,
}


@pytest.mark.parametrize(("current", "requested"), list(itertools.product(WindowState, WindowState)))
def test_every_transition_is_allowed_or_refused_as_designed(
    current: WindowState, requested: WindowState
) -> None:
    if (current, requested) in LEGAL:
        assert check_transition("s", 3, current, requested) is LEGAL[(current, requested)]
    else:
        with pytest.raises(CheckpointError) as refused:
            check_transition("s", 3, current, requested)
        assert f"sync 's' window 3: cannot go from {current.value} to {requested.value}" in str(refused.value)


def test_refusals_say_what_is_allowed() -> None:
    with pytest.raises(CheckpointError) as refused:
        check_transition("commerce", 7, WindowState.STAGED, WindowState.COMMITTED)
    assert str(refused.value) == (
        "sync 'commerce' window 7: cannot go from STAGED to COMMITTED (allowed from STAGED: FAILED, MERGED)"
    )
    with pytest.raises(CheckpointError, match=r"allowed from COMMITTED: none, it is final\)$"):
        check_transition("commerce", 7, WindowState.COMMITTED, WindowState.PLANNED)


def test_a_merged_window_can_only_be_committed() -> None:
    # Its rows are in Delta: failing it would let the checkpoint and the lakehouse disagree.
    assert [s for s in WindowState if s is not M and _allowed(M, s)] == [C]


def _allowed(current: WindowState, requested: WindowState) -> bool:
    try:
        return check_transition("s", 1, current, requested)
    except CheckpointError:
        return False


def test_open_states_are_the_unfinished_ones() -> None:
    assert {P, S, M} == OPEN_STATES
    assert [s for s in WindowState if is_open(s)] == [P, S, M]


def test_the_database_check_constraints_list_the_same_values() -> None:
    assert tuple(s.value for s in WindowState) == models.STATES
    assert tuple(k.value for k in WindowKind) == models.KINDS
    assert tuple(p.value for p in Phase) == models.PHASES


@pytest.mark.parametrize(
    ("rows_known", "rows_copied", "expected"),
    [(None, 10, None), (0, 0, 100.0), (40, 10, 25.0), (3, 1, 100 / 3), (40, 44, 100.0), (10**12, 0, 0.0)],
)
def test_percent(rows_known: int | None, rows_copied: int, expected: float | None) -> None:
    assert percent(rows_known, rows_copied) == expected


def test_table_progress_derives_its_percent() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    progress = TableProgress("s", 1, "customer", 200, 50, Phase.COPYING, ["id"], "primary key", now)
    assert progress.percent == 25.0


def test_lock_is_stale_only_strictly_after_the_limit() -> None:
    beat = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    limit = timedelta(minutes=10)
    assert not lock_is_stale(beat, beat + limit, limit)
    assert lock_is_stale(beat, beat + limit + timedelta(microseconds=1), limit)


def test_lock_info_names_holder_and_times() -> None:
    at = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    info = LockInfo("commerce", "dag=sync run=manual__1 try=2", at, at + timedelta(seconds=30))
    assert info.describe() == (
        "sync 'commerce' is locked by 'dag=sync run=manual__1 try=2' since 2026-01-01T12:00:00+00:00 "
        "(last heartbeat 2026-01-01T12:00:30+00:00)"
    )


@pytest.mark.parametrize(
    ("path", "rows", "size", "sha", "why"),
    [
        ("", 1, 1, "a" * 64, "empty path"),
        ("p", -1, 1, "a" * 64, "rows and bytes must be >= 0"),
        ("p", 1, 1, "A" * 64, "64 lower-case hex digits"),
        ("p", 1, 1, "a" * 63, "64 lower-case hex digits"),
    ],
)
def test_part_validation(path: str, rows: int, size: int, sha: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Part(path, "customer", rows, size, sha)


def test_progress_changes_keep_only_given_fields() -> None:
    assert changes(None, 5, None, None, None) == {"rows_copied": 5}
    assert changes(7, None, "copied", ("id", "region"), "unique key uk_email") == {
        "rows_known": 7,
        "phase": "copied",
        "key_columns": ["id", "region"],
        "key_source": "unique key uk_email",
    }
    with pytest.raises(ValueError, match="rows_copied must be >= 0"):
        changes(None, -1, None, None, None)


def test_error_hierarchy() -> None:
    assert issubclass(SyncLockedError, CheckpointError)
    assert issubclass(CheckpointError, VitessProviderError)


def test_utc_datetime_stores_naive_utc_and_returns_aware_utc() -> None:
    column, dialect = models.UtcDateTime(), sqlite.dialect()
    paris = timezone(timedelta(hours=1))
    stored = column.process_bind_param(datetime(2026, 1, 1, 13, 0, 0, 5, tzinfo=paris), dialect)
    assert stored == datetime(2026, 1, 1, 12, 0, 0, 5)
    assert column.process_result_value(stored, dialect) == datetime(
        2026, 1, 1, 12, 0, 0, 5, tzinfo=timezone.utc
    )
    with pytest.raises(ValueError, match="naive datetime"):
        column.process_bind_param(datetime(2026, 1, 1), dialect)
