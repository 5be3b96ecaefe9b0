"""The seeded kill soak: a sync's life under faults, through the operators' code paths.

One seed is one sync of ``customer.soak_orders`` (sharded by hash(customer_id)) from a fresh
table: a snapshot, then ``windows`` rounds of (random workload, catch-up window, merge). The
workload inserts, updates, deletes, moves rows between shards (DELETE + INSERT under another
customer_id in one transaction) and changes primary keys; one round of a big seed also
inserts 100,000 rows in one transaction over both shards.

Faults, at points drawn from the seed:

* capture (snapshot or catch-up): a ``capture_child`` process running ``CaptureRunner`` (the
  capture operators' code) is SIGKILLed a random delay after its window is PLANNED in the
  store; or the fault proxy in front of vtgate cuts every connection after a random number of
  bytes while the runner reads. Reads of faulted windows go over a slowed link, so a random
  point falls inside the read rather than after it.
* merge: a ``merge_child`` process (``MergeRunner`` + spark-submit of the job, as
  ``VitessMergeOperator`` does) has its whole process group SIGKILLed, at a random delay after
  start or after a random progress line of the job (before a write, during it, right after
  the Delta commit).

After each fault the task is simply run again (in this process, by the same runner code),
until it finishes. The oracle at the end: the Delta table == ``SELECT *`` through vtgate, value
for value, and the table's ``_delta_log`` holds each committed window's transaction version
exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import SyncLockedError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.report import PROGRESS_PREFIX, MergeReport
from airflow_provider_vitess.merge.runner import MergeRunner
from tests.support import capture_child
from tests.support import merge_workload as wl
from tests.support.capture_child import ChildSpec
from tests.support.delta_check import delta_txns, spark_session
from tests.support.faultproxy import FaultProxy
from tests.support.local import REPO, LocalVitess, connection_uri_env

PHASES = ("snapshot", "catchup", "merge")
KEYSPACE, KEY = "customer", ("order_id",)
BIG_ROWS = 100_000
BIG_BASE = 10_000_000
STALE = timedelta(seconds=2)  # a killed holder's lock is taken over this long after its last beat
T = TypeVar("T")


@dataclass(frozen=True)
class SeedPlan:
    """What one seed does; ``for_seed`` draws it."""

    seed: int
    windows: int  # catch-up windows after the snapshot
    faulted: tuple[str, ...]  # phases that get faults
    big_transaction_round: int | None  # the round with the 100,000-row transaction
    initial_rows: int
    every_occurrence: bool  # fault every capture/merge of a faulted phase (else one of them)

    @property
    def table(self) -> str:
        """The seed's own table: runs of other seeds (or modes) on the same cluster never meet."""
        return f"soak_{'full' if self.every_occurrence else 'small'}_{self.seed}"

    @classmethod
    def for_seed(cls, seed: int, *, full: bool) -> SeedPlan:
        """``full`` (``make soak``): every phase faulted, wherever the dice say, and the big
        transaction in every seed. Else (``make test``): the one phase ``seed % 3``, faulted
        once, and the big transaction in seed 1 only (a catch-up faulted seed: the cut or kill
        falls inside it)."""
        rng = random.Random(f"plan {seed}")
        windows = rng.randint(3, 4) if full else 2
        big = rng.randint(1, windows) if full else (1 if seed == 1 else None)
        return cls(
            seed=seed,
            windows=windows,
            faulted=PHASES if full else (PHASES[seed % 3],),
            big_transaction_round=big,
            initial_rows=rng.randint(2_000, 6_000) if full else rng.randint(1_500, 3_000),
            every_occurrence=full,
        )


@dataclass
class SeedResult:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)  # "phase kind" -> landed faults
    missed: Counter[str] = field(default_factory=Counter)  # faults drawn that came too late
    reruns: int = 0
    windows: int = 0  # windows committed (the snapshot included)
    changes: int = 0  # row changes made by the workload (initial rows included)
    rows: int = 0  # rows in the target at the end
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reconnects: Counter[str] = field(default_factory=Counter)  # "STATUS details" -> reconnects

    def to_json(self) -> str:
        counters = {name: dict(getattr(self, name)) for name in ("faults", "missed", "reconnects")}
        return json.dumps({**vars(self), **counters})


class _Reconnects(logging.Handler):
    """Counts the gRPC errors an in-process read reconnected after (the reader's warning), by
    status and text: which errors vtgate really sent through the proxy's cuts, and were retried."""

    def __init__(self, into: Counter[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("VStream (%s) cut with gRPC status") and len(args) >= 3:
            self.into[f"{args[1]} {str(args[2])[:80]}"] += 1


@dataclass
class Tally:
    """The sum over seeds, printed by the test module at its end."""

    results: list[SeedResult] = field(default_factory=list)

    def line(self) -> str:
        faults: Counter[str] = Counter()
        missed: Counter[str] = Counter()
        reconnects: Counter[str] = Counter()
        for r in self.results:
            faults.update(r.faults)
            missed.update(r.missed)
            reconnects.update(r.reconnects)
        per_phase = {p: sum(n for k, n in faults.items() if k.startswith(p + " ")) for p in PHASES}
        bad = [r.seed for r in self.results if r.mismatches]
        return (
            f"soak tally: {len(self.results)} seeds, faults injected {dict(sorted(faults.items()))} "
            f"(per phase {per_phase}; {sum(missed.values())} drawn too late to land), "
            f"reruns {sum(r.reruns for r in self.results)}, "
            f"reconnects after {dict(sorted(reconnects.items()))}, "
            f"windows {sum(r.windows for r in self.results)}, "
            f"changes {sum(r.changes for r in self.results)}, "
            f"target rows {sum(r.rows for r in self.results)}, "
            f"mismatches {sum(len(r.mismatches) for r in self.results)}"
            + (f" (seeds {bad})" if bad else "")
            + f", {sum(r.seconds for r in self.results):.0f} s"
        )


# -- the workload ----------------------------------------------------------------------------------


class Workload:
    """Seeded transactions on ``soak_orders``; tracks which keys exist and where."""

    def __init__(self, hook: VitessHook, rng: random.Random, table: str) -> None:
        self.hook, self.rng, self.table = hook, rng, table
        self.orders: dict[int, int] = {}  # order_id -> customer_id
        self.next_id = 1
        self.changes = 0

    def create(self) -> None:
        wl.execute(
            self.hook,
            f"DROP TABLE IF EXISTS {KEYSPACE}.{self.table}",
            f"CREATE TABLE {KEYSPACE}.{self.table} (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
            "note VARCHAR(64), qty INT, amount DECIMAL(12,2), PRIMARY KEY (order_id))",
        )
        try:  # the vschema outlives a dropped table
            wl.execute(
                self.hook, f"ALTER VSCHEMA ON {KEYSPACE}.{self.table} ADD VINDEX hash(customer_id) USING hash"
            )
        except sqlalchemy.exc.OperationalError as exc:
            if "already defined" not in str(exc):
                raise

    def _values(self, oid: int, cid: int) -> dict[str, Any]:
        r = self.rng
        return {
            "o": oid,
            "c": cid,
            "n": r.choice([None, "", "x", "ünï 😀", "n" * 64, f"n{r.randrange(10**6)}"]),
            "q": r.randint(-(2**31), 2**31 - 1),
            "a": Decimal(r.randint(-(10**11), 10**11)) / 100,
        }

    def _insert(self, conn: sqlalchemy.Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(
            sqlalchemy.text(
                f"INSERT INTO {KEYSPACE}.{self.table} (order_id, customer_id, note, qty, amount) "
                "VALUES (:o, :c, :n, :q, :a)"
            ),
            rows,
        )
        self.orders.update({row["o"]: row["c"] for row in rows})
        self.changes += len(rows)

    def _fresh(self, n: int) -> list[dict[str, Any]]:
        rows = [self._values(self.next_id + i, self.rng.randint(1, 10_000)) for i in range(n)]
        self.next_id += n
        return rows

    def initial(self, n: int) -> None:
        with self.hook.connect_sql() as conn, conn.begin():
            for first in range(0, n, 1000):
                self._insert(conn, self._fresh(min(1000, n - first)))

    def round(self, transactions: int) -> None:
        for _ in range(transactions):
            with self.hook.connect_sql() as conn, conn.begin():
                for _ in range(self.rng.randint(1, 5)):
                    self._op(conn)

    def _op(self, conn: sqlalchemy.Connection) -> None:
        r, p = self.rng, self.rng.random()
        if p < 0.25 or not self.orders:
            self._insert(conn, self._fresh(r.randint(1, 20)))
            return
        oid = r.choice(list(self.orders))
        where = {"o": oid}
        if p < 0.4:
            conn.execute(sqlalchemy.text(f"DELETE FROM {KEYSPACE}.{self.table} WHERE order_id = :o"), where)
            del self.orders[oid]
            self.changes += 1
        elif p < 0.55:  # a move to (most likely) another shard: vtgate refuses a vindex UPDATE
            conn.execute(sqlalchemy.text(f"DELETE FROM {KEYSPACE}.{self.table} WHERE order_id = :o"), where)
            self.changes += 1
            self._insert(conn, [self._values(oid, r.randint(10_001, 20_000))])
        elif p < 0.65:  # a primary key change
            new = self.next_id
            self.next_id += 1
            conn.execute(
                sqlalchemy.text(f"UPDATE {KEYSPACE}.{self.table} SET order_id = :n WHERE order_id = :o"),
                {"n": new, "o": oid},
            )
            self.orders[new] = self.orders.pop(oid)
            self.changes += 1
        else:
            conn.execute(
                sqlalchemy.text(
                    f"UPDATE {KEYSPACE}.{self.table} SET note = :n, qty = :q, amount = :a WHERE order_id = :o"
                ),
                self._values(oid, self.orders[oid]),
            )
            self.changes += 1

    def big_transaction(self) -> None:
        """100,000 rows in one transaction over both shards (1,000-row statements).

        vttablet kills a transaction older than 30 s (its transaction timeout): on a loaded
        machine this one can take longer, and is then rolled back whole. It is run again (its
        keys are free again); the soak needs it committed, not fast."""
        chunks = [
            [self._values(BIG_BASE + c * 1000 + i, i) for i in range(1000)] for c in range(BIG_ROWS // 1000)
        ]
        for attempt in range(3):
            orders, changes = dict(self.orders), self.changes
            try:
                with self.hook.connect_sql() as conn, conn.begin():
                    for rows in chunks:
                        self._insert(conn, rows)
                return
            except sqlalchemy.exc.DBAPIError as exc:
                self.orders, self.changes = orders, changes
                killed = any(m in str(exc) for m in ("exceeded timeout", "tx killer", "code = Aborted"))
                if not killed or attempt == 2:
                    raise


# -- one seed --------------------------------------------------------------------------------------


class Soak:
    """One seed's sync: its store, staging, Delta table, proxy, and the faults it injects."""

    def __init__(self, vitess: LocalVitess, proxy: FaultProxy, root: Path, plan: SeedPlan) -> None:
        self.plan, self.proxy, self.root = plan, proxy, root
        self.rng = random.Random(plan.seed)
        self.result = SeedResult(plan.seed)
        self.conn_id = "vitess_soak"
        name, value = connection_uri_env(
            self.conn_id, dataclasses.replace(vitess, grpc_port=proxy.port), keepalive_seconds=10
        )
        self.conn_env = {name: value}
        os.environ[name] = value
        self.hook = VitessHook(self.conn_id)
        self.store_url = f"sqlite:///{root}/store.db"
        self.store = CheckpointStore(self.store_url)
        self.store.migrate()
        self.sync_id = f"soak-{plan.seed}"
        self.table = plan.table
        self.spec = SyncSpec(self.sync_id, KEYSPACE, (self.table,), str(root / "stage"))
        self.delta = root / "delta"
        self.work = Workload(self.hook, self.rng, self.table)
        self._chosen: dict[str, int] = {}  # small seeds: the one occurrence of a phase faulted

    # -- the faults --

    def _faulted(self, phase: str, occurrence: int, occurrences: int) -> bool:
        if phase not in self.plan.faulted:
            return False
        if self.plan.every_occurrence:
            return self.rng.random() < 0.5
        if phase not in self._chosen:  # drawn once, at its first occurrence
            self._chosen[phase] = self.rng.randrange(occurrences)
        return self._chosen[phase] == occurrence

    def _rerun(self, what: Callable[[], T]) -> T:
        """Run ``what`` until it finishes; a holder killed a moment ago still holds the lock
        until it goes stale, and a cut may fail a run: both are simply run again."""
        for attempt in range(20):
            try:
                return what()
            except SyncLockedError:
                time.sleep(1)
            except Exception:
                if attempt >= 5:
                    raise
                self.result.reruns += 1
                time.sleep(0.5)
        raise AssertionError("the rerun never got the sync's lock")

    def _runner(self) -> CaptureRunner:
        return CaptureRunner(self.hook, self.store, self.spec, holder="soak", lock_stale_after=STALE)

    def capture(self, kind: str, occurrence: int, expected_bytes: int) -> None:
        phase = "snapshot" if kind == "snapshot" else "catchup"

        def in_process() -> int:
            runner = self._runner()
            reader_log = logging.getLogger("airflow_provider_vitess.vstream.reader")
            counting = _Reconnects(self.result.reconnects)
            reader_log.addHandler(counting)
            try:
                if kind == "snapshot":
                    return runner.snapshot(checkpoint_every_rows=500).seq
                return runner.catch_up().seq
            finally:
                reader_log.removeHandler(counting)

        # Full seeds: up to 3 faults in a row. Small seeds: draw again until one lands.
        faults, most = 0, 3 if self.plan.every_occurrence else 5
        while faults < most and self._faulted(
            phase, occurrence, 1 if kind == "snapshot" else self.plan.windows
        ):
            faults += 1
            # A slowed link makes the read last ~2 s, so a random point falls inside it.
            self.proxy.slow(max(expected_bytes / 2.0, 20_000.0))
            try:
                if self.rng.random() < 0.5:
                    landed = self._kill_capture(kind)
                    (self.result.faults if landed else self.result.missed)[f"{phase} kill"] += 1
                else:
                    cuts = self.proxy.stats.cuts
                    self.proxy.cut_after(self.rng.randint(1, max(expected_bytes, 2)))
                    try:
                        in_process()
                    except Exception:
                        self.result.reruns += 1  # the cut failed the run: the rerun below finishes it
                    landed = self.proxy.stats.cuts > cuts
                    (self.result.faults if landed else self.result.missed)[f"{phase} cut"] += 1
            finally:
                self.proxy.disarm()
                self.proxy.slow(None)
            if landed and not self.plan.every_occurrence:
                break
        self._rerun(in_process)

    def _await_stale_lock(self) -> None:
        """Before a child run: a holder killed a moment ago keeps the sync's lock until it goes
        stale, and a child started sooner is refused (``SyncLockedError``) and exits before any
        fault can land. Airflow's retry delay spaces reruns the same way."""
        deadline = time.monotonic() + 60
        while (holder := self.store.lock_holder(self.sync_id)) is not None:
            if datetime.now(UTC) - holder.heartbeat_at > STALE * 1.5:
                return
            assert time.monotonic() < deadline, f"the sync's lock never went stale: {holder.describe()}"
            time.sleep(0.2)

    def _kill_capture(self, kind: str) -> bool:
        """A capture_child SIGKILLed a random delay after its window is PLANNED; True if the
        kill landed while it was reading."""
        self._await_stale_lock()
        spec = ChildSpec(
            sync_id=self.sync_id,
            keyspace=KEYSPACE,
            tables=(self.table,),
            staging=self.spec.staging_location,
            store_url=self.store_url,
            conn_id=self.conn_id,
            env=self.conn_env,
            lock_stale_seconds=STALE.total_seconds(),
            checkpoint_every_rows=500,
        )
        delay = self.rng.uniform(0.0, 2.5)
        committed = self.store.committed(self.sync_id)[1]
        log = self.root / "capture-child.log"
        with open(log, "a") as err:  # a file: a pipe nobody reads while it runs would fill and block it
            child = capture_child.start(kind, spec, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 120
            while child.poll() is None and time.monotonic() < deadline:
                window = self.store.open_window(self.sync_id)
                if window is not None and window.seq > committed and window.state is WindowState.PLANNED:
                    time.sleep(delay)
                    if child.poll() is None:
                        child.send_signal(signal.SIGKILL)
                        child.wait()
                        window = self.store.open_window(self.sync_id)
                        return window is not None and window.state is WindowState.PLANNED
                    break
                time.sleep(0.02)
            assert child.wait(timeout=600) == 0, log.read_text()[-3000:]
            return False
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()

    def merge(self, occurrence: int) -> None:
        faults = 0
        while faults < 2 and self._faulted("merge", occurrence, self.plan.windows + 1):
            faults += 1
            landed, where = self._kill_merge()
            (self.result.faults if landed else self.result.missed)[f"merge kill {where}"] += 1
            if landed and not self.plan.every_occurrence:
                break

        def in_process() -> int | None:
            def submit(plan: Any) -> MergeReport:
                return merge(spark_session(), plan)

            runner = MergeRunner(
                self.store, self.sync_id, str(self.delta), holder="soak-merge", lock_stale_after=STALE
            )
            return runner.run(submit).seq

        self._rerun(in_process)

    def _kill_merge(self) -> tuple[bool, str]:
        """A merge_child's process group SIGKILLed at a drawn point; (landed, which point)."""
        self._await_stale_lock()
        where = self.rng.choice(["start", "writing", "committed"])
        delay = self.rng.uniform(0.5, 15.0) if where == "start" else self.rng.uniform(0.0, 2.0)
        spec = {
            "store_url": self.store_url,
            "sync_id": self.sync_id,
            "target": str(self.delta),
            "lock_stale_seconds": STALE.total_seconds(),
        }
        log = open(self.root / "merge-child.log", "a")  # noqa: SIM115 (closed below)
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.merge_child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
        killed: list[bool] = []

        def kill_after(seconds: float) -> None:
            time.sleep(seconds)
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                killed.append(True)

        try:
            assert child.stdout is not None
            if where == "start":
                threading.Thread(target=kill_after, args=(delay,), daemon=True).start()
            for line in child.stdout:
                progress = line.startswith(PROGRESS_PREFIX) and where != "start" and not where.endswith("!")
                if progress and json.loads(line[len(PROGRESS_PREFIX) :])["phase"] == where:
                    threading.Thread(target=kill_after, args=(delay,), daemon=True).start()
                    where += "!"  # once
            code = child.wait(timeout=600)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            log.close()
        where = where.rstrip("!")
        if not killed:
            assert code == 0, (self.root / "merge-child.log").read_text()[-3000:]
        return bool(killed), where

    # -- the seed --

    def run(self) -> SeedResult:
        started = time.monotonic()
        self.work.create()
        self.work.initial(self.plan.initial_rows)
        self.capture("snapshot", 0, self.plan.initial_rows * 110)
        self.merge(0)
        for w in range(1, self.plan.windows + 1):
            before = self.work.changes
            self.work.round(self.rng.randint(20, 80))
            if w == self.plan.big_transaction_round:
                self.work.big_transaction()
            self.capture("catchup", w - 1, (self.work.changes - before) * 150)
            self.merge(w)
        self.result.changes = self.work.changes
        self.check()
        self.result.seconds = time.monotonic() - started
        if not self.result.mismatches:  # a failed seed's table stays, to look at
            wl.execute(self.hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{self.table}")
        return self.result

    def check(self) -> None:
        """The oracle: target == source; each committed window once in the Delta log."""
        last = self.store.committed(self.sync_id)[1]
        every = [self.store.window(self.sync_id, seq) for seq in range(1, last + 1)]
        windows = [w for w in every if w.state is WindowState.COMMITTED]
        self.result.windows = len(windows)
        try:
            self.result.rows = wl.assert_equal_to_source(
                spark_session(), self.hook, KEYSPACE, self.table, str(self.delta / self.table), KEY
            )
        except AssertionError as exc:
            self.result.mismatches.append(f"target != source: {exc}")
        txns = Counter((app, version) for app, version, _ in delta_txns(self.delta / self.table))
        twice = {k: n for k, n in txns.items() if n != 1}
        if twice:
            self.result.mismatches.append(f"windows committed more than once in the Delta log: {twice}")
        logged = sorted(v for _, v in txns)
        if logged != sorted(w.seq for w in windows):
            self.result.mismatches.append(
                f"Delta log windows {logged} != committed windows {[w.seq for w in windows]}"
            )
        if len(windows) != self.plan.windows + 1:
            planned = self.plan.windows + 1
            self.result.mismatches.append(f"{len(windows)} windows committed, {planned} planned")
