"""The status documents built from a real (SQLite) checkpoint store: a sync with a snapshot, a
committed catch-up window, a failed one and an open one; every value the page shows, checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import event

from airflow_provider_vitess.checkpoints import CheckpointStore, Phase, WindowKind, freshness, history
from airflow_provider_vitess.checkpoints.groups import group_lock_id
from airflow_provider_vitess.checkpoints.versions import TableCommit
from airflow_provider_vitess.plugins import documents
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
KEYS = {
    "corder": {"table": "corder", "source_columns": ["order_id"], "target_columns": ["order_id"],
               "source_index": "PRIMARY", "reason": "primary key"},
    "customer": {"table": "customer", "source_columns": ["customer_id"], "target_columns": ["customer_id"],
                 "source_index": "PRIMARY", "reason": "primary key"},
}  # fmt: skip
PATHS = {"customer": "/lake/customer", "corder": "/lake/c`order"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _vgtid(n: int) -> Vgtid:
    return Vgtid(tuple(ShardGtid("customer", s, f"MariaDB/0-1-{n}") for s in ("-80", "80-")))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> CheckpointStore:
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    store.migrate()
    store.ensure_sync("orders", "customer", ["customer", "corder"], {"keys": KEYS})
    # Window 1: the snapshot, 12.5 s from planned to committed.
    seq = store.plan_window("orders", WindowKind.SNAPSHOT, _vgtid(0))
    store.update_progress("orders", seq, "customer", rows_known=1000, rows_copied=1000, phase=Phase.COPIED,
                          key_columns=["customer_id"])  # fmt: skip
    store.update_progress("orders", seq, "corder", rows_known=4000, rows_copied=3000, phase=Phase.COPYING)
    clock.advance(10)
    store.mark_staged("orders", seq, _vgtid(10), "/stage/1/manifest.json", {"rows": 4000})
    clock.advance(2.5)
    store.mark_merged("orders", seq, {"customer": 0, "corder": 0}, paths=PATHS)
    store.commit("orders", seq)
    # Window 2: a catch-up with lag on one shard.
    clock.advance(60)
    seq = store.plan_window("orders", WindowKind.CATCHUP, _vgtid(10), _vgtid(20))
    for table in ("customer", "corder"):  # as the capture runner records every window's keys
        store.update_progress("orders", seq, table, key_columns=[f"{table}_key"], key_source="primary key")
    clock.advance(3)
    stats = {
        "rows": 42,
        "rows_per_table": {"customer": 40, "corder": 2},
        "shard_lag_transactions": {"customer/-80": 0, "customer/80-": 7},
        "stopped_early": "max_events",
    }
    store.mark_staged("orders", seq, _vgtid(13), "/stage/2/manifest.json", stats)
    store.mark_merged("orders", seq, {"customer": 1}, paths=PATHS)  # corder: no changes
    clock.advance(1)
    store.commit("orders", seq)
    # Window 3 failed before staging; window 4 is still being read.
    clock.advance(30)
    seq = store.plan_window("orders", WindowKind.CATCHUP, _vgtid(13), _vgtid(30))
    clock.advance(4)
    store.mark_failed("orders", seq, "vtgate unavailable: connection refused")
    clock.advance(6)
    store.plan_window("orders", WindowKind.CATCHUP, _vgtid(13), _vgtid(31))
    return store


def test_sync_status_holds_what_the_page_shows(store: CheckpointStore, clock: Clock) -> None:
    now = clock.now + timedelta(seconds=5)
    with store.lock("orders", "dag 'orders' run 'r1' task 'catch_up'"):
        status = documents.sync_status(store, "default", "orders", now)
    assert status is not None
    assert (status.sync_id, status.keyspace, status.store) == ("orders", "customer", "default")
    assert [(t.table, t.key_columns, t.rows_copied, t.rows_known, t.percent, t.phase, t.snapshot_seq)
            for t in status.table_status] == [
        ("customer", ["customer_id"], 1000, 1000, 100.0, "copied", 1),
        ("corder", ["order_id"], 3000, 4000, 75.0, "copying", 1),
    ]  # fmt: skip
    assert status.table_status[0].key_reason == "primary key"

    assert status.committed is not None
    assert status.committed.seq == 2
    assert status.committed.age_seconds == 4 + 6 + 30 + 5  # committed, then 30 + 4 + 6 + 5 s went by
    assert status.committed.committed_at == T0 + timedelta(seconds=12.5 + 60 + 3 + 1)
    assert [(s.shard, s.gtid, s.copying) for s in status.committed.shards] == [
        ("-80", "MariaDB/0-1-13", False),
        ("80-", "MariaDB/0-1-13", False),
    ]
    assert json.loads(status.committed.vgtid)[0]["gtid"] == "MariaDB/0-1-13"
    # Window 2 ended before its stop (a shard behind): the time stays the snapshot's, its plan.
    assert status.committed.as_of == T0
    assert status.committed.seconds_behind == (now - T0).total_seconds()
    assert (status.committed.freshness_sla, status.committed.freshness_breached) == (None, False)
    freshness.record_sla(store.engine, "orders", 60.0)  # a merge task's objective
    later = documents.sync_status(store, "default", "orders", now)
    assert later is not None and later.committed is not None
    assert (later.committed.freshness_sla, later.committed.freshness_breached) == (60.0, True)
    assert later.freshness_breached is True

    assert [(w.seq, w.kind, w.state) for w in status.windows] == [
        (4, "catchup", "PLANNED"),
        (3, "catchup", "FAILED"),
        (2, "catchup", "COMMITTED"),
        (1, "snapshot", "COMMITTED"),
    ]
    by_seq = {w.seq: w for w in status.windows}
    assert by_seq[1].duration_seconds == 12.5
    assert by_seq[2].duration_seconds == 4.0
    assert by_seq[3].duration_seconds == 4.0
    assert by_seq[4].duration_seconds == 5.0, "an open window lasts until now"
    assert (by_seq[2].rows, by_seq[2].rows_per_table) == (42, {"customer": 40, "corder": 2})
    assert by_seq[2].shard_lag == {"customer/-80": 0, "customer/80-": 7}
    assert by_seq[2].stopped_early == "max_events"
    assert by_seq[1].shard_lag == {}
    # The snapshot stands for its plan (T0) and committed 12.5 s later; window 2 ended before its
    # stop (no time of its own), window 4 is open.
    assert (by_seq[1].as_of, by_seq[1].seconds_behind_at_commit) == (T0, 12.5)
    assert (by_seq[2].as_of, by_seq[2].seconds_behind_at_commit) == (None, None)
    assert by_seq[4].seconds_behind_at_commit is None

    assert status.last_error is not None
    assert (status.last_error.seq, status.last_error.error) == (3, "vtgate unavailable: connection refused")
    assert status.lock is not None and status.lock.holder == "dag 'orders' run 'r1' task 'catch_up'"
    assert status.running is True
    assert status.latest_window is not None and status.latest_window.seq == 4

    assert status.cut is not None and status.cut.window == 2
    assert {t: (c.path, c.version, c.window, c.sql) for t, c in status.cut.tables.items()} == {
        "corder": ("/lake/c`order", 0, 1, "SELECT * FROM delta.`/lake/c``order` VERSION AS OF 0"),
        "customer": ("/lake/customer", 1, 2, "SELECT * FROM delta.`/lake/customer` VERSION AS OF 1"),
    }


def test_an_iceberg_syncs_cut_shows_each_tables_snapshot_and_the_sql_that_reads_it(
    store: CheckpointStore, clock: Clock
) -> None:
    """Iceberg's time travel names a snapshot id: the JSON API's SQL is the snapshot's, the table
    named as the merge names it (its warehouse's catalog, quoted); a version recorded without its
    snapshot gets no SQL, and says why."""
    store.ensure_sync("ice", "customer", ["customer", "corder"], {"keys": KEYS})
    seq = store.plan_window("ice", WindowKind.SNAPSHOT, _vgtid(0))
    store.mark_staged("ice", seq, _vgtid(10), "/stage/ice/1/manifest.json")
    paths = {"customer": "/wh/shop/customer", "corder": "/wh/shop/c`order"}
    commits = {"customer": TableCommit("iceberg", 4611686018427387904), "corder": TableCommit("iceberg")}
    store.mark_merged("ice", seq, {"customer": 0, "corder": 0}, paths=paths, commits=commits)
    store.commit("ice", seq)
    status = documents.sync_status(store, "default", "ice", clock.now)
    assert status is not None
    catalog = "vitess_c5fb2bb54259"  # "vitess_" and the first 12 hex digits of sha256("/wh")
    assert json.loads(status.model_dump_json())["cut"] == {
        "window": 1,
        "tables": {
            "customer": {
                "path": "/wh/shop/customer", "version": 0, "window": 1, "table_format": "iceberg",
                "snapshot_id": 4611686018427387904, "catalog": None,
                "sql": f"SELECT * FROM `{catalog}`.`shop`.`customer` VERSION AS OF 4611686018427387904",
            },
            "corder": {
                "path": "/wh/shop/c`order", "version": 0, "window": 1, "table_format": "iceberg",
                "snapshot_id": None, "catalog": None,
                "sql": "-- no SQL for table 'corder' at version 0: Iceberg table /wh/shop/c`order: version 0 "
                "was recorded without its snapshot id (by a provider before the store kept them), and "
                "Iceberg's time travel names a snapshot; consistent_tables finds it in the table's "
                "metadata log",
            },
        },
    }  # fmt: skip
    # A table of a JDBC catalog is named in that catalog.
    store.ensure_sync("ice_jdbc", "customer", ["customer"], {"keys": {"customer": KEYS["customer"]}})
    seq = store.plan_window("ice_jdbc", WindowKind.SNAPSHOT, _vgtid(0))
    store.mark_staged("ice_jdbc", seq, _vgtid(10), "/stage/ice_jdbc/1/manifest.json")
    in_lake = {"customer": TableCommit("iceberg", 7, "lake")}
    store.mark_merged(
        "ice_jdbc", seq, {"customer": 0}, paths={"customer": paths["customer"]}, commits=in_lake
    )
    store.commit("ice_jdbc", seq)
    jdbc = documents.sync_status(store, "default", "ice_jdbc", clock.now)
    assert jdbc is not None and jdbc.cut is not None
    customer = jdbc.cut.tables["customer"]
    assert (customer.catalog, customer.sql) == (
        "lake",
        "SELECT * FROM `lake`.`shop`.`customer` VERSION AS OF 7",
    )
    delta = documents.sync_status(store, "default", "orders", clock.now)  # the fixture's Delta sync
    assert delta is not None and delta.cut is not None
    assert {(c.table_format, c.snapshot_id) for c in delta.cut.tables.values()} == {("delta", None)}


def test_windows_are_limited_to_the_newest(store: CheckpointStore, clock: Clock) -> None:
    status = documents.sync_status(store, "default", "orders", clock.now, windows=2)
    assert status is not None
    assert [w.seq for w in status.windows] == [4, 3]
    assert status.running is False and status.lock is None


def test_overview_lists_syncs_and_names_a_store_it_cannot_read(
    store: CheckpointStore, clock: Clock, tmp_path: Path
) -> None:
    empty = CheckpointStore(f"sqlite:///{tmp_path / 'never-migrated.db'}")
    broken = CheckpointStore(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    result = documents.overview({"default": store, "empty": empty, "broken": broken}, clock.now)
    assert [(s.store, s.sync_id, s.committed_seq, s.tables) for s in result.syncs] == [
        ("default", "orders", 2, ["customer", "corder"])
    ]
    assert result.syncs[0].committed_age_seconds == 40.0
    assert list(result.errors) == ["broken"] and "unable to open database file" in result.errors["broken"]
    # The documents are JSON as the API serves them: aware UTC times, plain numbers.
    dumped = json.loads(result.model_dump_json())
    assert dumped["syncs"][0]["latest_window"]["created_at"] == "2026-05-01T12:01:56.500000Z"


def test_an_unknown_sync_has_no_status(store: CheckpointStore, clock: Clock) -> None:
    assert documents.sync_status(store, "default", "nope", clock.now) is None


def _grouped_and_single_windows(store: CheckpointStore, clock: Clock, n: int) -> None:
    """``n`` more failed catch-up windows after the fixture's, every other one read by groups
    (some groups staged), then an open grouped one."""
    store.mark_failed("orders", 4, "killed")
    for i in range(n + 1):
        clock.advance(1)
        groups = [["-80"], ["80-"]] if i % 2 == 0 else None
        seq = store.plan_window("orders", WindowKind.CATCHUP, _vgtid(13), _vgtid(40 + i), groups=groups)
        if groups and i % 4 == 0:
            part = Vgtid((ShardGtid("customer", "80-", f"MariaDB/0-1-{40 + i}"),))
            store.mark_group_staged("orders", seq, 1, part, f"/stage/{seq}/_group-001-w.json", {"rows": i})
        if i < n:
            store.mark_failed("orders", seq, "killed")


def _queries(store: CheckpointStore, read: Callable[[], object]) -> int:
    """How many SQL statements ``read`` sends to the store's database."""
    count = [0]

    def counted(*_: object) -> None:
        count[0] += 1

    event.listen(store.engine, "before_cursor_execute", counted)
    try:
        read()
    finally:
        event.remove(store.engine, "before_cursor_execute", counted)
    return count[0]


def test_the_windows_groups_are_read_in_one_query_whatever_their_number(
    store: CheckpointStore, clock: Clock
) -> None:
    _grouped_and_single_windows(store, clock, 12)
    status = documents.sync_status(store, "default", "orders", clock.now, windows=17)
    assert status is not None and len(status.windows) == 17
    # The same as reading each window's groups on its own.
    one_by_one = [
        documents.window_status(w, clock.now, store.window_groups("orders", w.seq))
        for w in history.recent_windows(store.engine, "orders", 17)
    ]
    assert status.windows == one_by_one
    grouped = [w.seq for w in status.windows if w.groups]
    assert len(grouped) == 7 and len(grouped) < len(status.windows)
    assert any(g.state == "STAGED" for w in status.windows for g in w.groups)
    info = history.sync(store.engine, "orders")
    assert info is not None
    assert documents.sync_summary(store, "default", info, clock.now).latest_window == one_by_one[0]

    def read(n: int) -> Callable[[], object]:
        return lambda: documents.sync_status(store, "default", "orders", clock.now, windows=n)

    assert _queries(store, read(2)) == _queries(store, read(17)), "a query per window shown"


def test_a_grouped_window_shows_each_groups_shards_and_state(store: CheckpointStore, clock: Clock) -> None:
    store.mark_failed("orders", 4, "killed")
    clock.advance(1)
    seq = store.plan_window("orders", WindowKind.CATCHUP, _vgtid(13), _vgtid(40), groups=[["-80"], ["80-"]])
    part = Vgtid((ShardGtid("customer", "-80", "MariaDB/0-1-40"),))
    store.mark_group_staged("orders", seq, 0, part, "/stage/5/_group-000-w.json", {"rows": 17})

    status = documents.sync_status(store, "default", "orders", clock.now)
    assert status is not None
    assert [(g.group, g.shards, g.state, g.rows) for g in status.windows[0].groups] == [
        (0, ["-80"], "STAGED", 17),
        (1, ["80-"], "PLANNED", None),
    ]
    assert status.latest_window is not None and status.latest_window.groups == status.windows[0].groups
    assert all(w.groups == [] for w in status.windows[1:]), "windows read by one process have no groups"
    # The overview's latest window carries them too, as JSON.
    dumped = json.loads(documents.overview({"default": store}, clock.now).model_dump_json())
    assert dumped["syncs"][0]["latest_window"]["groups"] == [
        {"group": 0, "shards": ["-80"], "state": "STAGED", "rows": 17, "reader": None},
        {"group": 1, "shards": ["80-"], "state": "PLANNED", "rows": None, "reader": None},
    ]


def test_a_sync_whose_groups_are_being_read_is_running(store: CheckpointStore, clock: Clock) -> None:
    """While its groups read, a grouped sync's own lock is free (the plan task released it):
    the page shows it running, and which group a task reads now, from the group locks."""
    store.mark_failed("orders", 4, "killed")
    clock.advance(1)
    seq = store.plan_window("orders", WindowKind.CATCHUP, _vgtid(13), _vgtid(40), groups=[["-80"], ["80-"]])
    reader = "dag 'orders' run 'r2' task 'catch_up' map index 1 try 1 on worker-2"
    with store.lock(group_lock_id("orders", 1), reader):
        status = documents.sync_status(store, "default", "orders", clock.now)
        overview = documents.overview({"default": store}, clock.now)
    assert status is not None and status.windows[0].seq == seq
    assert status.running and status.lock is None, "the sync's own lock is free"
    assert [(g.group, g.state, g.reader) for g in status.windows[0].groups] == [
        (0, "PLANNED", None),
        (1, "PLANNED", reader),
    ]
    assert overview.syncs[0].running and overview.syncs[0].latest_window == status.windows[0]
    # Done reading: idle again, no reader shown.
    status = documents.sync_status(store, "default", "orders", clock.now)
    assert status is not None and not status.running
    assert [g.reader for g in status.windows[0].groups] == [None, None]
