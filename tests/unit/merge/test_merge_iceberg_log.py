"""An Iceberg table's commits read from its metadata tables (``merge/job/iceberg_log.py``) and its
location read as a catalog's table (``merge/job/iceberg_sql.py``): pure, no Spark."""

from __future__ import annotations

import pytest

from airflow_provider_vitess.merge.job import iceberg_log, iceberg_sql
from airflow_provider_vitess.merge.job.iceberg_log import APP, MARK, WINDOW, LogEntry, Snapshot
from airflow_provider_vitess.merge.job.marks import parse_mark


def _window(snapshot: int, parent: int | None, seq: int, *, app: str = "sync", read: str = "r") -> Snapshot:
    mark = f'{{"vitess_window":{seq},"read":"{read}{seq}"}}'
    return Snapshot(snapshot, parent, {APP: app, WINDOW: str(seq), MARK: mark})


def test_the_version_is_the_current_snapshots_sequence_number_less_one_and_the_line_holds_the_windows() -> (
    None
):
    log = [LogEntry(None, None), LogEntry(11, 1), LogEntry(12, 2), LogEntry(12, 2), LogEntry(13, 3)]
    snaps = [_window(11, None, 1), _window(12, 11, 2), Snapshot(13, 12, {"added-records": "4"})]
    got = iceberg_log.read_commits(log, snaps, "sync", None)
    assert (got.version, got.snapshot_id, got.txn_version, got.restores, dict(got.marks)) == (
        2,
        13,
        2,
        (),
        {},
    )
    assert iceberg_log.read_commits(log, snaps, "another sync", None).txn_version is None


def test_a_table_without_a_snapshot_has_no_version() -> None:
    got = iceberg_log.read_commits([LogEntry(None, None)], [], "sync", 0)
    assert (got.version, got.txn_version) == (None, None)
    assert iceberg_log.read_commits([], [], "sync", None).version is None


def test_a_rollback_drops_the_version_and_the_windows_of_the_line_it_left() -> None:
    """Rolled back from version 2 (seq 3) to version 1: the line is 12 <- 11, window 3 is gone,
    and the rollback shows to a sync that recorded version 2, not to one that recorded 3."""
    log = [LogEntry(11, 1), LogEntry(12, 2), LogEntry(13, 3), LogEntry(12, 2)]
    snaps = [_window(11, None, 1), _window(12, 11, 2), _window(13, 12, 3)]
    got = iceberg_log.read_commits(log, snaps, "sync", 2)
    assert (got.version, got.txn_version, got.restores) == (1, 2, (1,))
    assert iceberg_log.read_commits(log, snaps, "sync", 3).restores == ()
    # A later commit takes the next sequence number, never a used one.
    later = iceberg_log.read_commits([*log, LogEntry(14, 4)], [*snaps, _window(14, 12, 3)], "sync", None)
    assert (later.version, later.txn_version) == (3, 3)


def test_the_marks_are_the_windows_committed_after_the_recorded_version() -> None:
    log = [LogEntry(11, 1), LogEntry(12, 2), LogEntry(13, 3)]
    snaps = [_window(11, None, 1), _window(12, 11, 2), _window(13, 12, 3), _window(99, None, 7, app="other")]
    assert dict(iceberg_log.read_commits(log, snaps, "sync", 0).marks) == {2: "r2", 3: "r3"}
    assert dict(iceberg_log.read_commits(log, snaps, "sync", 2).marks) == {}
    assert parse_mark(snaps[2].summary[MARK]) == (3, "r3")


def test_a_replace_starts_a_new_line_that_holds_the_window_that_replaced_the_table() -> None:
    log = [LogEntry(11, 1), LogEntry(12, 2), LogEntry(20, 3)]
    snaps = [_window(11, None, 1), _window(12, 11, 2), _window(20, None, 5)]
    got = iceberg_log.read_commits(log, snaps, "sync", None)
    assert (got.version, got.txn_version) == (2, 5)
    assert iceberg_log.snapshot_at(log, 1) == 12 and iceberg_log.snapshot_at(log, 2) == 20
    assert iceberg_log.snapshot_at(log, 7) is None


def test_a_location_is_a_hadoop_catalogs_table_two_levels_below_its_warehouse() -> None:
    t = iceberg_sql.at("s3a://lake/cdc/orders/")
    assert (t.warehouse, t.namespace, t.name, t.location) == (
        "s3a://lake",
        "cdc",
        "orders",
        "s3a://lake/cdc/orders",
    )
    local = iceberg_sql.at("/data/lake/cdc/we`ird")
    assert local.warehouse == "/data/lake" and local.sql.endswith(".`cdc`.`we``ird`")
    assert local.catalog != t.catalog and local.catalog == iceberg_sql.at("/data/lake/x/y").catalog
    with pytest.raises(ValueError, match=r"two levels below the warehouse.*Remedy"):
        iceberg_sql.at("s3a://lake/orders")
