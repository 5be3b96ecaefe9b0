"""Catch-up windows through the store and the stager: exact, deterministic, killable, bounded."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import (
    CorruptStagedDataError,
    InvalidVgtidError,
    SyncLockedError,
    UnknownKeyspaceError,
    UnknownTableError,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import Manifest, load_manifest, read_table, verify
from airflow_provider_vitess.vstream.window import WindowReader
from tests.support import capture_child
from tests.support.capture_child import ChildSpec
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.replay import ListStager, Replay, StagedChange

pytestmark = pytest.mark.integration

INSERT = sqlalchemy.text(
    "INSERT INTO customer.corder (order_id, customer_id, sku, price) VALUES (:o, :c, :s, :p)"
)
DELETE = sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o")


def _source(hook: VitessHook) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET workload = 'olap'")  # OLTP results stop at 10,000 rows
        cur.execute("SELECT * FROM customer.corder")
        return {(r[0],): tuple(r) for r in cur.fetchall()}
    finally:
        raw.close()


def _delete_range(hook: VitessHook, low: int, high: int) -> None:
    """Deletes a previous run's rows in chunks: vttablet refuses DML touching over 10,000 rows."""
    ids = [k[0] for k in _source(hook) if low <= k[0] <= high]
    for i in range(0, len(ids), 5000):
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(
                sqlalchemy.text("DELETE FROM customer.corder WHERE order_id IN :ids").bindparams(
                    sqlalchemy.bindparam("ids", expanding=True)
                ),
                {"ids": ids[i : i + 5000]},
            )


def _changes(manifest: Manifest, table: str) -> list[StagedChange]:
    verify(manifest)
    data = read_table(manifest, table).to_pylist()
    if not data:
        return []
    columns = [c for c in data[0] if not c.startswith("_")]
    out = []
    for r in data:
        op = Operation(r["_op"])
        after = None if op is Operation.DELETE else tuple(r[c] for c in columns)
        before = None
        if op is not Operation.INSERT:
            before = tuple(r.get(f"_before_{c}") for c in columns)
        out.append(
            StagedChange(r["_keyspace"], table, r["_shard"], op, r["_commit_ts"], r["_seq"], before, after)
        )
    return out


def _apply(store: CheckpointStore, manifest: Manifest, state: Replay) -> Replay:
    """What the merge job will do, in small: apply the staged window, then MERGED, COMMITTED."""
    state.apply(_changes(manifest, "corder"))
    store.mark_merged(manifest.sync_id, manifest.window_seq)
    store.commit(manifest.sync_id, manifest.window_seq)
    return state


class Workload(threading.Thread):
    """Seeded random DML on customer.corder until stopped, with moves between shards and one
    100,000-row transaction spanning both shards."""

    def __init__(self, hook: VitessHook, seed: int, id_base: int) -> None:
        super().__init__(daemon=True)
        self.hook, self.rng, self.base = hook, random.Random(seed), id_base
        self.stop_event, self.rounds = threading.Event(), 0
        self.error: BaseException | None = None
        self.big_done = False

    def run(self) -> None:
        try:
            live: set[int] = set()
            while not self.stop_event.is_set():
                if self.rounds == 40 and not self.big_done:
                    self._big_transaction()
                with self.hook.connect_sql() as conn, conn.begin():
                    for _ in range(self.rng.randint(1, 4)):
                        self._one(conn, live)
                self.rounds += 1
                time.sleep(0.02)
        except BaseException as exc:
            self.error = exc

    def _one(self, conn: sqlalchemy.Connection, live: set[int]) -> None:
        oid = self.base + self.rng.randint(0, 199)
        if oid not in live:
            conn.execute(
                INSERT, {"o": oid, "c": self.rng.randint(1, 1000), "s": b"w", "p": self.rng.randint(0, 99)}
            )
            live.add(oid)
        elif self.rng.random() < 0.25:
            conn.execute(DELETE, {"o": oid})
            live.discard(oid)
        elif self.rng.random() < 0.4:  # move: new sharding key, same order id, one transaction
            conn.execute(DELETE, {"o": oid})
            conn.execute(INSERT, {"o": oid, "c": self.rng.randint(1001, 9999), "s": b"m", "p": 1})
        else:
            conn.execute(
                sqlalchemy.text("UPDATE customer.corder SET price = price + 1 WHERE order_id = :o"),
                {"o": oid},
            )

    def _big_transaction(self) -> None:
        start = self.base + 1_000_000
        with self.hook.connect_sql() as conn, conn.begin():
            for chunk in range(100):
                conn.execute(
                    INSERT,
                    [{"o": start + chunk * 1000 + i, "c": i, "s": b"big", "p": chunk} for i in range(1000)],
                )
        self.big_done = True


def _child_spec(vitess: LocalVitess, sync_id: str, tmp_path: Path) -> ChildSpec:
    connection = connection_uri_env("vitess_child", vitess)
    return ChildSpec.in_dir(tmp_path, sync_id, "customer", ("corder",), connection, lock_stale_seconds=1)


def _run_child(spec: ChildSpec, kill_delay: float | None, store: CheckpointStore | None = None) -> bool:
    """Runs one catch-up in a subprocess. With ``kill_delay``, SIGKILLs it that many seconds after
    its window is PLANNED in the store (mid-window); True if the kill landed there."""
    child = capture_child.start("catchup", spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill_delay is not None and store is not None:
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            window = store.open_window(spec.sync_id)
            if window is not None and window.state is WindowState.PLANNED:
                time.sleep(kill_delay)
                window = store.open_window(spec.sync_id)
                if child.poll() is None and window is not None and window.state is WindowState.PLANNED:
                    child.send_signal(signal.SIGKILL)
                    child.communicate()
                    return True
                break
            time.sleep(0.01)
    _, err = child.communicate(timeout=600)
    assert child.returncode == 0, err[-3000:]
    return False


def test_windows_with_kills_replay_to_the_source(
    vitess: LocalVitess, vitess_conn_id: str, tmp_path: Path
) -> None:
    hook = VitessHook(vitess_conn_id)
    spec_json = _child_spec(vitess, "catchup-kill", tmp_path)
    store = CheckpointStore(spec_json.store_url)
    spec = SyncSpec("catchup-kill", "customer", ("corder",), spec_json.staging)
    runner = CaptureRunner(hook, store, spec, holder="test")
    id_base = 50_000_000
    _delete_range(hook, id_base, id_base + 2_000_000)
    snapshot = runner.snapshot()
    state = _apply(store, snapshot.manifest, Replay(key_index=[0]))

    workload = Workload(hook, seed=5, id_base=id_base)
    workload.start()
    try:
        state = _windows_with_kills(vitess, hook, store, runner, spec, spec_json, workload, state)
    finally:
        workload.stop_event.set()  # a failing test must not leave writers behind for the next
        workload.join()
    assert workload.error is None, workload.error
    final = runner.catch_up()
    rows = _apply(store, final.manifest, state).rows()
    assert rows == _source(hook)
    assert sum(1 for k in rows if id_base + 1_000_000 <= k[0] < id_base + 1_100_000) == 100_000


def _windows_with_kills(
    vitess: LocalVitess,
    hook: VitessHook,
    store: CheckpointStore,
    runner: CaptureRunner,
    spec: SyncSpec,
    spec_json: ChildSpec,
    workload: Workload,
    state: Replay,
) -> Replay:
    rng = random.Random(1122)
    kills_mid_window, windows = 0, 0
    while kills_mid_window < 5 or windows < 6 or not workload.big_done:
        assert workload.error is None, workload.error
        assert windows < 30, f"only {kills_mid_window} kills landed mid-window in {windows} windows"
        time.sleep(0.5)
        if kills_mid_window < 5 and _run_child(spec_json, rng.uniform(0.0, 0.6), store):
            kills_mid_window += 1
        _run_child(spec_json, kill_delay=None)  # the rerun (or a plain window) runs to the end
        (window,) = [w for w in [store.open_window("catchup-kill")] if w is not None]
        manifest = load_manifest(spec.staging_location, "catchup-kill", window.seq)
        assert manifest is not None
        # Determinism: the same window read again from its start stages the same changes.
        again = ListStager()
        assert window.stop_vgtid is not None
        WindowReader(
            runner._open,
            again,
            keyspace="customer",
            tables=["corder"],
            start=window.start_vgtid,
            stop=window.stop_vgtid,
        ).run()
        staged = _changes(manifest, "corder")
        assert [(c.seq, c.op, c.shard, c.after) for c in staged] == [
            (c.seq, c.op, c.shard, c.after) for c in again.changes
        ]
        state = _apply(store, manifest, state)
        windows += 1
    return state


def test_idle_shard_does_not_hold_the_window(vitess_conn_id: str, tmp_path: Path) -> None:
    hook = VitessHook(vitess_conn_id)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec("idle", "customer", ("corder",), str(tmp_path / "stage"), heartbeat_interval=1)
    runner = CaptureRunner(hook, store, spec, holder="test")
    snapshot = runner.snapshot()
    store.mark_merged("idle", snapshot.seq)
    store.commit("idle", snapshot.seq)
    # customer_id 1 hashes to one shard: every write below lands there, the other stays idle.
    for i in range(50):
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(INSERT, {"o": 60_000_000 + i, "c": 1, "s": b"i", "p": i})
            conn.execute(DELETE, {"o": 60_000_000 + i})
    started = time.monotonic()
    outcome = runner.catch_up()
    elapsed = time.monotonic() - started
    assert outcome.manifest.stats["shard_lag_transactions"] == {"customer/-80": 0, "customer/80-": 0}
    # A second run of the same sync while this one holds the lock is refused, naming the holder.
    holder = "dag sync_orders / run manual__1 / try 1"
    with store.lock("idle", holder), pytest.raises(SyncLockedError, match=rf"sync 'idle'.*{holder}"):
        runner.catch_up()
    assert outcome.result is not None and outcome.result.rows == 100
    assert {c.shard for c in _changes(outcome.manifest, "corder")} == {"-80"}
    assert elapsed < 1 + 5, f"window took {elapsed:.1f}s"


def test_bad_input_names_the_object_and_keeps_the_checkpoint(vitess_conn_id: str, tmp_path: Path) -> None:
    hook = VitessHook(vitess_conn_id)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    stage = str(tmp_path / "stage")
    with pytest.raises(
        UnknownTableError, match=r"'ordr' do not exist in keyspace 'customer'; did you mean 'corder'"
    ):
        CaptureRunner(hook, store, SyncSpec("bad", "customer", ("ordr",), stage), holder="t").snapshot()
    with pytest.raises(
        UnknownKeyspaceError, match=r"keyspace 'custmer' does not exist.*did you mean 'customer'"
    ):
        CaptureRunner(hook, store, SyncSpec("bad2", "custmer", ("corder",), stage), holder="t").snapshot()

    runner = CaptureRunner(hook, store, SyncSpec("good", "customer", ("corder",), stage), holder="t")
    snap = runner.snapshot()
    store.mark_merged("good", snap.seq)
    committed = store.commit("good", snap.seq)

    # A VGTID of another keyspace where this sync's checkpoint should be.
    with store.engine.begin() as conn:
        conn.execute(
            sqlalchemy.text("UPDATE vitess_sync_checkpoint SET committed_vgtid = :v WHERE sync_id = 'good'"),
            {"v": committed.to_json().replace('"customer"', '"commerce"')},
        )
    with pytest.raises(InvalidVgtidError, match=r"VGTID of keyspace\(s\) commerce, not of 'customer'"):
        runner.catch_up()
    with store.engine.begin() as conn:
        conn.execute(
            sqlalchemy.text("UPDATE vitess_sync_checkpoint SET committed_vgtid = :v WHERE sync_id = 'good'"),
            {"v": committed.to_json()},
        )

    with hook.connect_sql() as conn, conn.begin():
        conn.execute(DELETE, {"o": 70_000_001})  # left by an earlier run on a reused cluster
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(INSERT, {"o": 70_000_001, "c": 7, "s": b"c", "p": 1})
    window = runner.catch_up()
    part = next(iter(window.manifest.tables["corder"].parts))
    path = tmp_path / "stage" / "good" / f"window={window.seq:010d}" / part.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStagedDataError, match=rf"corder.*{part.path}"):
        verify(window.manifest)
    manifest_file = path.parent.parent / "_manifest.json"
    manifest_file.write_text(manifest_file.read_text()[:-20])
    with pytest.raises(CorruptStagedDataError, match=r"_manifest\.json"):
        load_manifest(stage, "good", window.seq)
    assert store.committed("good")[0] == committed
