"""Syncs of keyspace `customer` across MoveTables and Reshard, on a cluster assembled from parts.

One scenario, in order (the workflows only go one way, so the tests share one cluster and run in
file order): rows are seeded in the unsharded `commerce`; MoveTables copies `customer`/`corder`
into keyspace `customer`; three syncs snapshot it; a seeded workload writes through vtgate while
MoveTables switches traffic, `customer` is resharded 0 -> -80,80- and Reshard switches traffic.

* sync `live` reads catch-up windows all along, across both switches;
* sync `offline` reads one window before the reshard and its next one after SwitchTraffic (its
  position still names shard 0, which still exists);
* sync `gone` reads nothing until shard 0 is deleted: a clear error naming it and the remedy;
* sync `src`, of the MoveTables *source* keyspace `commerce`, is refused once SwitchTraffic
  moved its tables (vtgate does not follow a MoveTables for a VStream client), naming them,
  their new keyspace and the remedy. Reverse replication is off, so `commerce` gets no more
  changes of them: without the check its runs would "succeed" with nothing to do;
* the window across the reshard's journal is SIGKILLed once the journal and a row of a new
  shard are staged, and read again whole by the rerun; a changes sensor (and its trigger)
  watching from just before the journal wakes on it.

Windows are applied by the reference applier (``replay.py``, the merge's per-shard rule) and
merged window by window into Delta by the merge job (PySpark); both are compared with
``SELECT *`` through vtgate, and each window is in each table's Delta log once (for `live`,
also after a second merge of every window, which commits nothing). `live`'s windows of `corder`
(the table whose rows move between shards) are also merged into a `soft_delete`, a `history`
and a `changelog` table, checked after the snapshot, each window across a switch and the last
window against the reference applier's state after that window: the soft-delete table's live
rows are its rows and its flagged ones keys it no longer has (every key it had is there); the
current versions are its rows (versions contiguous, one current per live key), and the
changelog's rows, replayed by the same applier in their order, are its rows too, with one row per
staged change.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import ShardsGoneError, TablesMovedError, VStreamError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.sensors import VitessChangesSensor
from airflow_provider_vitess.staging import Manifest, read_table, verify
from airflow_provider_vitess.triggers import VitessChangesTrigger
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream.changes import JOURNAL
from airflow_provider_vitess.vstream.moves import parse_journal
from tests.support import capture_child
from tests.support import merge_workload as wl
from tests.support.capture_child import ChildSpec
from tests.support.delta_check import delta_txns, spark_session
from tests.support.local import connection_uri_env
from tests.support.replay import Key, Replay, Row, StagedChange
from tests.support.topology import Topology, start_topology, stop_topology

pytestmark = pytest.mark.integration

TABLES = ("customer", "corder")
KEYS = {"customer": [0], "corder": [0]}
KEYS_NAMES = {"customer": ["customer_id"], "corder": ["order_id"]}


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    stop_topology()  # the workflows go one way only: always a fresh cluster
    topology = start_topology()
    try:
        yield topology
    finally:
        print("\ntopology timings (s):", json.dumps(topology.timings))
        stop_topology()


@pytest.fixture(scope="module")
def hook(topology: Topology) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_topology", topology.vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_topology")


class Sync:
    """One sync's runner, store and replayed target."""

    def __init__(self, hook: VitessHook, root: Path, sync_id: str, keyspace: str = "customer") -> None:
        self.id = sync_id
        self.store_url = f"sqlite:///{root}/{sync_id}.db"
        self.store = CheckpointStore(self.store_url)
        self.spec = SyncSpec(sync_id, keyspace, TABLES, str(root / "stage"))
        # A killed run's lock goes stale in seconds: its rerun takes it over.
        self.runner = CaptureRunner(
            hook, self.store, self.spec, holder="test", lock_stale_after=timedelta(seconds=3)
        )
        self.state = {t: Replay(key_index=KEYS[t]) for t in TABLES}
        self.windows: list[Manifest] = []
        self.orders_after: list[dict[Key, Row]] = []  # `corder` after each window (the oracle of the modes)

    def apply(self, manifest: Manifest) -> None:
        live = [sg.shard for sg in manifest.end_vgtid.shard_gtids]
        for table in TABLES:
            self.state[table].apply(_changes(manifest, table), live)
        self.orders_after.append(self.state["corder"].rows())
        self.store.mark_merged(self.id, manifest.window_seq)
        self.store.commit(self.id, manifest.window_seq)
        self.windows.append(manifest)

    def snapshot(self) -> None:
        self.apply(self.runner.snapshot().manifest)

    def catch_up(self) -> Manifest:
        manifest = self.runner.catch_up().manifest
        self.apply(manifest)
        return manifest

    def catch_up_killed_after_journal(self, env: tuple[str, str]) -> Manifest:
        """The window run in a child SIGKILLed after the journal and a new shard's row are staged
        (see ``capture_child``), then rerun here: the same window, read again whole."""
        spec = ChildSpec(
            sync_id=self.id,
            keyspace=self.spec.keyspace,
            tables=tuple(TABLES),
            staging=self.spec.staging_location,
            store_url=self.store_url,
            conn_id="vitess_topology",
            env={env[0]: env[1]},
            kill_after_journal=True,
        )
        child = capture_child.run("catchup", spec, timeout=300)
        assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr[-3000:])
        assert "KILLED-AFTER-JOURNAL" in child.stdout, child.stdout
        killed = self.store.open_window(self.id)
        assert killed is not None and killed.state is WindowState.PLANNED, killed
        time.sleep(3.5)  # the killed child's lock goes stale
        outcome = self.runner.catch_up()
        assert outcome.resumed and outcome.seq == killed.seq, (outcome.seq, killed.seq)
        self.apply(outcome.manifest)
        return outcome.manifest

    def rows(self) -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
        return {t: self.state[t].rows() for t in TABLES}

    def merge_to_delta(
        self,
        hook: VitessHook,
        root: Path,
        *,
        merge_again: bool = False,
        modes: bool = False,
        min_written: int = 3,
    ) -> None:
        """Each window merged once, in order, as the DAG does; then Delta == SELECT *, and each
        window that changed a table is one commit of its Delta log, once. ``merge_again``: also
        after a second merge of every window (a rerun of all merges commits nothing). ``modes``:
        `corder` also in `history` and `changelog`, checked after the snapshot, each window across
        a switch and the last one. ``min_written``: the fewest windows that must have changed each table
        (the check is not vacuous)."""
        keys = self.windows[0].tables
        targets = {t: TableTarget(t, str(root / t), keys[t].key_columns, keys[t].key_columns) for t in TABLES}
        spark = spark_session()
        windows = [
            WindowToMerge(m.window_seq, m.path, TABLES if i == 0 else ()) for i, m in enumerate(self.windows)
        ]
        written: dict[str, list[int]] = {t: [] for t in TABLES}
        for window in windows:
            report = merge(spark, MergePlan(self.id, (window,), targets))
            for (seq, table), status in report.statuses().items():
                if status is TableStatus.WRITTEN:
                    written[table].append(seq)
        if modes:
            started = time.monotonic()
            # One merge per mode for each run of windows up to a check: the snapshot, each
            # window across a switch (its shards are not the window before's), the last one (a
            # Spark job per window per mode cost ~160 s).
            ends = [
                i
                for i, m in enumerate(self.windows)
                if i in (0, len(self.windows) - 1) or _shards(m) != _shards(self.windows[i - 1])
            ]
            for lo, hi in zip([0, *[e + 1 for e in ends]], ends, strict=False):
                self._merge_modes(spark, root, lo, hi, targets["corder"])
            in_modes = time.monotonic() - started
            print(
                f"\n{self.id}: corder in soft_delete, history, changelog: merged, checked in {in_modes:.1f}s"
            )
        if merge_again:
            again = merge(spark, MergePlan(self.id, tuple(windows), targets)).statuses()
            assert set(again.values()) <= {TableStatus.ALREADY_APPLIED, TableStatus.NO_CHANGES}, again
        for table in TABLES:
            wl.assert_equal_to_source(spark, hook, "customer", table, targets[table].path, KEYS_NAMES[table])
            txns = delta_txns(targets[table].path)
            seqs = Counter(
                version for app, version, _ in txns if app == f"airflow-provider-vitess:{self.id}:{table}"
            )
            assert len(txns) == len(seqs) and set(seqs.values()) == {1}, (table, txns)
            assert sorted(seqs) == written[table], (table, seqs, written)
            assert len(written[table]) >= min_written, (table, written)

    def _merge_modes(self, spark: Any, root: Path, lo: int, i: int, mirror: TableTarget) -> None:
        """Windows ``lo``..``i`` of `corder` merged into a `soft_delete`, a `history` and a
        `changelog` table (one job each, a commit per window), each then checked against the
        reference applier's rows after window ``i``."""
        manifest = self.windows[i]
        batch = tuple(
            WindowToMerge(m.window_seq, m.path, ("corder",) if n == 0 else ())
            for n, m in enumerate(self.windows[lo : i + 1], start=lo)
        )
        paths = {}
        for mode in (TargetMode.SOFT_DELETE, TargetMode.HISTORY, TargetMode.CHANGELOG):
            paths[mode] = str(root / f"corder_{mode.value}")
            target = replace(mirror, path=paths[mode], shape=TargetShape(mode))
            merge(spark, MergePlan(self.id, batch, {"corder": target}))
        want = self.orders_after[i]
        columns = _columns(self.windows[0], "corder")
        kept = [r.asDict() for r in spark.read.format("delta").load(paths[TargetMode.SOFT_DELETE]).collect()]
        live = {(r[columns[0]],): tuple(r[c] for c in columns) for r in kept if not r["_vitess_deleted"]}
        flagged = {(r[columns[0]],) for r in kept if r["_vitess_deleted"]}
        assert live == want, (manifest.window_seq, _diff(live, want))
        gone = {k for rows in self.orders_after[: i + 1] for k in rows} - set(want)
        assert not flagged & set(want) and gone <= flagged, (manifest.window_seq, gone - flagged)
        versions = [r.asDict() for r in spark.read.format("delta").load(paths[TargetMode.HISTORY]).collect()]
        _assert_history(versions, columns, want, manifest.window_seq)
        log = [r.asDict() for r in spark.read.format("delta").load(paths[TargetMode.CHANGELOG]).collect()]
        staged = [len(_changes(m, "corder")) for m in self.windows[: i + 1]]
        assert len(log) == sum(staged), (manifest.window_seq, len(log), staged)
        replayed = Replay(key_index=KEYS["corder"])
        for m in self.windows[: i + 1]:
            rows = sorted(
                (r for r in log if r["_vitess_window_seq"] == m.window_seq), key=lambda r: r["_vitess_order"]
            )
            changes = []
            for r in rows:
                values = tuple(r[c] for c in columns)
                op = Operation.INSERT if r["_vitess_op"] == "snapshot" else Operation(r["_vitess_op"])
                before = None if op is Operation.INSERT else values
                after = None if op is Operation.DELETE else values
                changes.append(
                    StagedChange(
                        "customer", "corder", r["_vitess_shard"], op, 0, r["_vitess_order"], before, after
                    )
                )
            replayed.apply(changes, [sg.shard for sg in m.end_vgtid.shard_gtids])
        assert replayed.rows() == want, (manifest.window_seq, _diff(replayed.rows(), want))


def _shards(manifest: Manifest) -> set[str]:
    return {sg.shard for sg in manifest.end_vgtid.shard_gtids}


def _columns(manifest: Manifest, table: str) -> list[str]:
    return [c for c in read_table(manifest, table).column_names if not c.startswith("_")]


def _diff(got: dict[Key, Row], want: dict[Key, Row]) -> list[tuple[Key, Row | None, Row | None]]:
    return [(k, got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)][
        :5
    ]


def _assert_history(
    versions: list[dict[str, Any]], columns: list[str], want: dict[Key, Row], seq: int
) -> None:
    """The current versions are ``want``; per key the versions are contiguous (each ends where the
    next starts, unless a delete ended it), only the last may be current, and a deleted key has
    none."""
    by_key: dict[Key, list[dict[str, Any]]] = {}
    for v in versions:
        by_key.setdefault((v[columns[0]],), []).append(v)
    current: dict[Key, Row] = {}
    wrong = []
    for key, vs in by_key.items():
        vs.sort(
            key=lambda v: (
                v["_vitess_valid_from"] is not None,
                v["_vitess_valid_from"] or 0,
                v["_vitess_valid_to"] is None,
                v["_vitess_valid_to"] or 0,  # a version of no length (two groups in one second) first
            )
        )
        for a, b in itertools.pairwise(vs):
            ends = a["_vitess_valid_to"]
            if (
                a["_vitess_current"]
                or ends is None
                or (not a["_vitess_deleted"] and ends != b["_vitess_valid_from"])
            ):
                wrong.append((key, a, b))
        last = vs[-1]
        if last["_vitess_current"]:
            assert last["_vitess_valid_to"] is None and not last["_vitess_deleted"], (seq, key, last)
            current[key] = tuple(last[c] for c in columns)
        else:
            assert last["_vitess_valid_to"] is not None and last["_vitess_deleted"], (seq, key, last)
    assert not wrong, (seq, len(wrong), wrong[:3])
    assert current == want, (seq, _diff(current, want))


def _changes(manifest: Manifest, table: str) -> list[StagedChange]:
    verify(manifest)
    if table not in manifest.tables:
        return []
    data = read_table(manifest, table).to_pylist()
    out = []
    for r in data:
        columns = [c for c in r if not c.startswith("_")]
        op = Operation(r["_op"])
        after = None if op is Operation.DELETE else tuple(r[c] for c in columns)
        before = None if op is Operation.INSERT else tuple(r.get(f"_before_{c}") for c in columns)
        out.append(
            StagedChange(r["_keyspace"], table, r["_shard"], op, r["_commit_ts"], r["_seq"], before, after)
        )
    return out


def _source(hook: VitessHook) -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        out = {}
        for table in TABLES:
            cur.execute(f"SELECT * FROM customer.{table}")
            out[table] = {(r[0],): tuple(r) for r in cur.fetchall()}
        return out
    finally:
        raw.close()


class Workload(threading.Thread):
    """Seeded DML through vtgate until stopped. Statements are idempotent (a write refused while
    traffic switches is simply tried again later), and some orders change customer, which after
    the reshard moves them between shards."""

    def __init__(self, hook: VitessHook, seed: int) -> None:
        super().__init__(daemon=True)
        self.hook, self.rng = hook, random.Random(seed)
        self.stop_event = threading.Event()
        self.done = self.refused = 0
        self.last_error = ""

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                with self.hook.connect_sql() as conn, conn.begin():
                    for _ in range(self.rng.randint(1, 3)):
                        self._one(conn)
                self.done += 1
            except sqlalchemy.exc.SQLAlchemyError as exc:
                self.refused += 1
                self.last_error = str(exc)[:300]
                time.sleep(0.2)
            time.sleep(0.01)

    def _one(self, conn: sqlalchemy.Connection) -> None:
        oid, cid = self.rng.randint(1, 400), self.rng.randint(1, 200)
        r = self.rng.random()
        if r < 0.3:
            conn.execute(sqlalchemy.text("DELETE FROM corder WHERE order_id = :o"), {"o": oid})
            conn.execute(
                sqlalchemy.text(
                    "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (:o, :c, 'w', :p)"
                ),
                {"o": oid, "c": cid, "p": self.rng.randint(0, 99)},
            )
        elif r < 0.5:
            conn.execute(sqlalchemy.text("DELETE FROM corder WHERE order_id = :o"), {"o": oid})
        elif r < 0.8:
            conn.execute(
                sqlalchemy.text("UPDATE corder SET price = price + 1 WHERE order_id = :o"), {"o": oid}
            )
        else:
            conn.execute(sqlalchemy.text("DELETE FROM customer WHERE customer_id = :c"), {"c": cid})
            conn.execute(
                sqlalchemy.text("INSERT INTO customer (customer_id, email) VALUES (:c, :e)"),
                {"c": cid, "e": f"w{self.rng.randint(0, 9999)}@x"},
            )


def _seed(hook: VitessHook) -> None:
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text("INSERT INTO commerce.customer (customer_id, email) VALUES (:c, :e)"),
            [{"c": c, "e": f"c{c}@x"} for c in range(1, 201)],
        )
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO commerce.corder (order_id, customer_id, sku, price) VALUES (:o, :c, 's', :p)"
            ),
            [{"o": o, "c": 1 + o % 200, "p": o % 50} for o in range(1, 401)],
        )


STATE: dict[str, Any] = {}


def _assert_moved(src: Sync) -> None:
    """A run of the source keyspace's sync is refused before it reads, and nothing of it is lost."""
    committed_before = src.store.committed(src.id)
    with pytest.raises(
        TablesMovedError,
        match=r"table\(s\) 'customer', 'corder' moved out of keyspace 'commerce' .*'corder' -> keyspace "
        r"'customer'.*Remedy: sync them from keyspace 'customer' — a new sync",
    ):
        src.runner.catch_up()
    assert src.store.committed(src.id) == committed_before and src.store.open_window(src.id) is None


def _assert_a_waiting_sensor_wakes_on_the_journal(topology: Topology, hook: VitessHook) -> None:
    """Watching from shard 0's position at the switch (its journal's own local_position, read with
    vtctldclient: the old primary serves no queries any more), the next event is the journal; the
    workload's rows on the new shards come after it."""
    out = topology.vtctl(
        "ExecuteFetchAsDBA", "--json", "zone1-0000000200", "SELECT val FROM _vt.resharding_journal"
    )
    (row,) = json.loads(out)["rows"]
    before = Vgtid((ShardGtid("customer", "0", parse_journal(row[0]).local_position),))
    sensor = VitessChangesSensor(
        task_id="changes", keyspace="customer", tables=TABLES, start_vgtid=before.to_json(),
        vitess_conn_id="vitess_topology", poke_read_seconds=20,
    )  # fmt: skip
    change = sensor.read_once(hook, before)
    assert change is not None and (change.reason, change.shard) == (JOURNAL, "0"), change
    trigger = VitessChangesTrigger(
        vitess_conn_id="vitess_topology", keyspace="customer", tables=TABLES, start_vgtid=before.to_json()
    )
    change = asyncio.run(asyncio.wait_for(trigger.wait_for_change(), 60))
    assert (change.reason, change.shard) == (JOURNAL, "0"), change


def test_windows_follow_movetables_and_reshard_switches(
    topology: Topology, hook: VitessHook, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("reshard")
    _seed(hook)
    src = Sync(hook, root, "src", keyspace="commerce")
    src.snapshot()
    topology.move_tables_create()
    live, offline, gone = (Sync(hook, root, name) for name in ("live", "offline", "gone"))
    for sync in (live, offline, gone):
        sync.snapshot()
    STATE.update(offline=offline, gone=gone)

    workload = Workload(hook, seed=15)
    workload.start()
    try:
        live.catch_up()
        src.catch_up()  # before the switch, `commerce` still serves the tables' writes
        topology.move_tables_switch("--enable-reverse-replication=false")
        time.sleep(1)
        _assert_moved(src)
        live.catch_up()  # across the MoveTables switch: only the writer changed
        offline.catch_up()
        topology.move_tables_complete()
        _assert_moved(src)  # the tables are dropped from `commerce` now: still the move's error
        # The error's remedy, followed as written: a new sync of keyspace `customer`, snapshotted
        # there (the tables' writes go on meanwhile); it must end equal to the source too.
        moved = Sync(hook, root, "moved", keyspace="customer")
        moved.snapshot()
        topology.reshard_create()
        live.catch_up()
        moved.catch_up()
        time.sleep(1)
        topology.reshard_switch()
        _assert_a_waiting_sensor_wakes_on_the_journal(topology, hook)
        time.sleep(1)  # rows on the new shards, inside the next window
        crossing = live.catch_up_killed_after_journal(connection_uri_env("vitess_topology", topology.vitess))
        time.sleep(2)
    finally:
        workload.stop_event.set()
        workload.join()
    print(f"\nworkload: {workload.done} transactions, {workload.refused} refused ({workload.last_error})")
    assert workload.done > 50, (workload.done, workload.refused, workload.last_error)
    after = live.catch_up()  # wholly after the switch, to the end of the workload
    moved.catch_up()  # across the reshard's journal, like `live`

    journal_windows = [m for m in live.windows if m.stats.get("journals")]
    assert len(journal_windows) == 1, [m.stats for m in live.windows]
    assert journal_windows[0].stats["retired_shards"] == ["customer/0"]
    for manifest in (crossing, after):
        assert {sg.shard for sg in manifest.end_vgtid.shard_gtids} == {"-80", "80-"}, manifest.end_vgtid
    assert {c.shard for c in _changes(after, "corder")} <= {"-80", "80-"}
    assert live.rows() == _source(hook)
    assert moved.rows() == _source(hook), "TablesMovedError's remedy (a new sync of keyspace B) is not exact"
    STATE["source"] = _source(hook)
    moved.merge_to_delta(hook, root / "delta-moved", min_written=1)
    live.merge_to_delta(hook, root / "delta-live", merge_again=True, modes=True)
    STATE["root"] = root


def test_a_reshard_while_the_sync_was_not_running(topology: Topology, hook: VitessHook) -> None:
    offline: Sync = STATE["offline"]
    committed, _ = offline.store.committed("offline")
    assert committed is not None and [sg.shard for sg in committed.shard_gtids] == ["0"]
    manifest = offline.catch_up()  # from shard 0's position, through its journal, to -80/80-
    assert manifest.stats["journals"] == 1
    assert {sg.shard for sg in manifest.end_vgtid.shard_gtids} == {"-80", "80-"}
    assert offline.rows() == STATE["source"]
    offline.merge_to_delta(hook, STATE["root"] / "delta-offline")


def test_old_shards_gone_is_a_clear_error_and_its_remedy_heals(topology: Topology, hook: VitessHook) -> None:
    """The remedy the error names: a run with ``resnapshot_tables`` naming every table; then the
    sync streams on from the new shards, and its Delta tables are ``SELECT *``."""
    gone: Sync = STATE["gone"]
    topology.reshard_complete_and_delete_old_shard()
    with pytest.raises(ShardsGoneError, match=r"shard customer/0.*snapshot the sync again") as refused:
        gone.runner.catch_up()
    assert '{"resnapshot_tables": [...]} naming every table of the sync' in str(refused.value)
    manifest = _resnapshot_every_table_and_stream_on(gone, hook, new_customer=100001)
    assert {sg.shard for sg in manifest.end_vgtid.shard_gtids} == {"-80", "80-"}


def test_a_position_purged_from_the_binlogs_is_a_clear_error_and_its_remedy_heals(
    topology: Topology, hook: VitessHook
) -> None:
    """The source purged the binlogs past the committed position (shard -80's MariaDB): the
    catch-up fails saying so and naming the remedy, a run with ``resnapshot_tables`` naming every
    table; followed, the sync streams on and its Delta tables are ``SELECT *``."""
    gone: Sync = STATE["gone"]  # on shards -80 and 80- since the test before
    wl.execute(hook, "UPDATE customer.corder SET price = price + 1 WHERE order_id <= 20")
    _purge_binlogs(topology, uid=300)  # customer/-80's primary (Topology.reshard_create)
    with pytest.raises(VStreamError, match=r"may be gone from the source's binlogs") as refused:
        gone.runner.catch_up()
    assert '{"resnapshot_tables": [...]} naming every table of the sync' in str(refused.value)
    _resnapshot_every_table_and_stream_on(gone, hook, new_customer=100002)


def _purge_binlogs(topology: Topology, uid: int) -> None:
    """Tablet ``uid``'s MariaDB starts a new binlog and deletes every older one (a reader still
    in the old file keeps it a moment: retried until only the new one is left)."""
    status = topology.run("mysql", str(uid), "-N", "-B", "-e", "FLUSH BINARY LOGS; SHOW MASTER STATUS")
    newest = status.split()[0]
    deadline = time.monotonic() + 60
    while True:
        topology.run("mysql", str(uid), "-e", f"PURGE BINARY LOGS TO '{newest}'")
        left = topology.run("mysql", str(uid), "-N", "-B", "-e", "SHOW BINARY LOGS").split()[::2]
        if left == [newest] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == [newest], f"tablet {uid} keeps binlogs {left} after PURGE BINARY LOGS TO '{newest}'"


def _resnapshot_every_table_and_stream_on(sync: Sync, hook: VitessHook, new_customer: int) -> Manifest:
    """What a run triggered with ``{"resnapshot_tables": [every table]}`` does, then changes (a
    customer ``new_customer`` among them) and a catch-up: Delta == ``SELECT *`` for every table.
    The catch-up's manifest."""
    need = sync.runner.snapshot_need(TABLES)  # the snapshot task of that run
    sync.runner.snapshot(tables=need.tables, need=need)
    merger = MergeRunner(sync.store, sync.id, str(STATE["root"] / "delta-gone"), holder="test-gone-merge")
    merger.run(lambda plan: merge(spark_session(), plan))
    wl.execute(
        hook,
        "UPDATE customer.corder SET price = price + 1 WHERE order_id <= 20",
        f"INSERT INTO customer.customer (customer_id, email) VALUES ({new_customer}, 'after@x')",
    )
    manifest = sync.runner.catch_up().manifest
    merger.run(lambda plan: merge(spark_session(), plan))
    for table in TABLES:
        path = str(STATE["root"] / "delta-gone" / table)
        wl.assert_equal_to_source(spark_session(), hook, "customer", table, path, KEYS_NAMES[table])
    return manifest
