"""The "as of" rule of a window (``checkpoints/freshness.py``), case by case."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_provider_vitess.checkpoints import WindowKind
from airflow_provider_vitess.checkpoints.freshness import (
    STOP_TAKEN_AT,
    breached,
    seconds_behind,
    window_as_of,
)

PLANNED = datetime(2026, 11, 28, 10, 0, 5, tzinfo=timezone.utc)
TAKEN = datetime(2026, 11, 28, 10, 0, 4, 250000, tzinfo=timezone.utc)


def test_a_catch_up_that_reached_its_stop_is_as_of_the_stop_s_time() -> None:
    stats = {STOP_TAKEN_AT: TAKEN.isoformat(), "shard_lag_transactions": {"ks/-80": 0, "ks/80-": 0}}
    assert window_as_of(WindowKind.CATCHUP, stats, PLANNED) == TAKEN
    # A bound met on the very last transaction: stopped early, but no shard behind.
    assert window_as_of(WindowKind.CATCHUP, {**stats, "stopped_early": "max_events"}, PLANNED) == TAKEN


def test_a_catch_up_cut_short_or_without_a_stop_time_moves_nothing() -> None:
    behind = {
        STOP_TAKEN_AT: TAKEN.isoformat(),
        "stopped_early": "max_seconds",
        "shard_lag_transactions": {"ks/-80": 0, "ks/80-": 3},
    }
    assert window_as_of(WindowKind.CATCHUP, behind, PLANNED) is None
    assert window_as_of(WindowKind.CATCHUP, {}, PLANNED) is None


def test_a_snapshot_is_as_of_its_plan_and_seconds_behind_is_never_negative() -> None:
    assert window_as_of(WindowKind.SNAPSHOT, {}, PLANNED) == PLANNED
    assert seconds_behind(PLANNED, PLANNED + timedelta(seconds=2.5)) == 2.5
    assert seconds_behind(PLANNED, PLANNED - timedelta(seconds=1)) == 0.0
    assert seconds_behind(None, PLANNED) is None


def test_an_objective_is_breached_only_when_the_data_is_older() -> None:
    assert breached(PLANNED, 60, PLANNED + timedelta(seconds=61))
    assert not breached(PLANNED, 60, PLANNED + timedelta(seconds=60))
    assert not breached(PLANNED, None, PLANNED + timedelta(days=1)), "no objective"
    assert not breached(None, 60, PLANNED), "no data yet"
