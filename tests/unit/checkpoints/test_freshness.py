"""The "as of" rule of a window (``checkpoints/freshness.py``), case by case, and a quiet
source's proof (``record_quiet``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import cast

from sqlalchemy import Table, insert

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind, history
from airflow_provider_vitess.checkpoints.freshness import (
    STOP_LAG_UNKNOWN,
    STOP_TAKEN_AT,
    breached,
    record_quiet,
    seconds_behind,
    window_as_of,
)
from airflow_provider_vitess.checkpoints.models import CheckpointRow
from airflow_provider_vitess.vgtid import Vgtid

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


def test_a_snapshot_copied_from_a_replica_is_as_of_its_source_time_or_claims_none() -> None:
    replica = {STOP_TAKEN_AT: TAKEN.isoformat(), "stop_tablet_type": "REPLICA", "stop_lag_seconds": 0.0}
    assert window_as_of(WindowKind.SNAPSHOT, replica, PLANNED) == TAKEN
    unknown = {STOP_LAG_UNKNOWN: "0: tablet zone1-200 reports lag 'NULL'", "stop_tablet_type": "REPLICA"}
    assert window_as_of(WindowKind.SNAPSHOT, unknown, PLANNED) is None


def test_an_objective_is_breached_only_when_the_data_is_older() -> None:
    assert breached(PLANNED, 60, PLANNED + timedelta(seconds=61))
    assert not breached(PLANNED, 60, PLANNED + timedelta(seconds=60))
    assert not breached(PLANNED, None, PLANNED + timedelta(days=1)), "no objective"
    assert not breached(None, 60, PLANNED), "no data yet"


def test_a_quiet_read_moves_as_of_forward_only_at_the_position_it_watched_from(tmp_path: Path) -> None:
    """Issue 38 item 4a: a sensor that read from the committed position to one taken later and
    found no change moves *as of* to that time; never backwards, never past a window committed
    since (its position is not the one watched from), and a sync never committed has none."""
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    at = '[{"keyspace":"ks","shard":"0","gtid":"MariaDB/0-1-7"}]'
    assert record_quiet(store.engine, "s", Vgtid.from_json(at), TAKEN) is None  # no sync yet
    store.ensure_sync("s", "ks", ["t"], {})
    with store.engine.begin() as conn:
        conn.execute(
            insert(cast(Table, CheckpointRow.__table__)).values(
                sync_id="s", committed_vgtid=at, committed_seq=3, updated_at=PLANNED, as_of=PLANNED
            )
        )

    def as_of() -> datetime | None:
        point = history.checkpoint(store.engine, "s")
        return None if point is None else point.as_of

    later = PLANNED + timedelta(seconds=90)
    elsewhere = Vgtid.from_json('[{"keyspace":"ks","shard":"0","gtid":"MariaDB/0-1-9"}]')
    assert record_quiet(store.engine, "s", elsewhere, later) is None, "a commit since: its own time"
    assert as_of() == PLANNED
    assert record_quiet(store.engine, "s", Vgtid.from_json(at), later) == PLANNED
    assert as_of() == later
    assert record_quiet(store.engine, "s", Vgtid.from_json(at), PLANNED + timedelta(seconds=30)) is None
    assert as_of() == later, "never backwards"
    store.close()
