"""Consistent reads across tables: the cut at every committed window holds every transaction whole.

Each transaction of the workload writes both tables of a ledger (an entry, and its account's
balance; a move changes an entry and two balances) and the test records the source's state after
each one, in commit order (one client, one unsharded keyspace: binlog order is commit order). The
sync stages small windows (a few transactions each); the merge gives every window one Delta
commit per table. Oracles:

* the cut at every committed window (each table read at the version the store recorded for it)
  equals the state after one recorded transaction, and later windows give later states;
* the cut at the committed position equals ``SELECT *`` through vtgate;
* the tear the cut prevents is real: a table's version of window W read with the other table's
  version of window W-1 is the state after no transaction (a balance that is not its entries' sum);
* a cut of a window not committed, or older than the store keeps versions for, is refused by name,
  and the cut at the oldest window kept is still whole.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.consistent_reads import consistent_cut, consistent_tables, cut_sql
from airflow_provider_vitess.exceptions import CutUnavailableError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.vstream.window import ReadBounds
from tests.support.delta_check import assert_delta_equals_source, spark_session
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

ACCOUNT, ENTRY = "cr_account", "cr_entry"
ACCOUNTS = range(1, 6)
State = tuple[frozenset[tuple[int, int]], frozenset[tuple[int, int, int]]]


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_cuts", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_cuts")
        yield hook
        hook.close()


class Ledger:
    """The workload, and the source's state after each of its transactions."""

    def __init__(self, hook: VitessHook, seed: str) -> None:
        self.hook, self.rng = hook, random.Random(seed)
        self.balance = dict.fromkeys(ACCOUNTS, 0)
        self.entries: dict[int, tuple[int, int]] = {}  # id -> (account, amount)
        self.next_id = 1
        self.states: list[State] = []

    def state(self) -> State:
        return (
            frozenset(self.balance.items()),
            frozenset((e, a, amt) for e, (a, amt) in self.entries.items()),
        )

    def _transaction(self, *statements: tuple[str, dict[str, Any]]) -> None:
        with self.hook.connect_sql() as conn:
            for sql, params in statements:
                conn.execute(sqlalchemy.text(sql), params)
            conn.commit()
        self.states.append(self.state())

    def create(self) -> None:
        execute(
            self.hook,
            f"DROP TABLE IF EXISTS commerce.{ACCOUNT}",
            f"DROP TABLE IF EXISTS commerce.{ENTRY}",
            f"CREATE TABLE commerce.{ACCOUNT} (id BIGINT NOT NULL PRIMARY KEY, balance BIGINT NOT NULL)",
            f"CREATE TABLE commerce.{ENTRY} (id BIGINT NOT NULL PRIMARY KEY, account_id BIGINT NOT NULL, "
            "amount BIGINT NOT NULL)",
        )
        rows = ", ".join(f"({a}, 0)" for a in ACCOUNTS)
        self._transaction((f"INSERT INTO commerce.{ACCOUNT} (id, balance) VALUES {rows}", {}))
        self.step()  # both tables hold rows at the snapshot (an empty one gets no Delta table)

    def _move_money(self, account: int, amount: int) -> tuple[str, dict[str, Any]]:
        self.balance[account] += amount
        return (
            f"UPDATE commerce.{ACCOUNT} SET balance = balance + :amount WHERE id = :id",
            {"amount": amount, "id": account},
        )

    def step(self) -> None:
        """One transaction writing both tables: add an entry, move one, or delete one."""
        kind = self.rng.choice(["add", "add", "move", "delete"] if self.entries else ["add"])
        if kind == "add":
            entry, account, amount = self.next_id, self.rng.choice(ACCOUNTS), self.rng.randint(1, 100)
            self.next_id += 1
            self.entries[entry] = (account, amount)
            self._transaction(
                (
                    f"INSERT INTO commerce.{ENTRY} (id, account_id, amount) VALUES (:e, :a, :amt)",
                    {"e": entry, "a": account, "amt": amount},
                ),
                self._move_money(account, amount),
            )
            return
        entry = self.rng.choice(sorted(self.entries))
        account, amount = self.entries[entry]
        if kind == "move":
            other = self.rng.choice([a for a in ACCOUNTS if a != account])
            self.entries[entry] = (other, amount)
            self._transaction(
                (f"UPDATE commerce.{ENTRY} SET account_id = :a WHERE id = :e", {"a": other, "e": entry}),
                self._move_money(account, -amount),
                self._move_money(other, amount),
            )
            return
        del self.entries[entry]
        self._transaction(
            (f"DELETE FROM commerce.{ENTRY} WHERE id = :e", {"e": entry}),
            self._move_money(account, -amount),
        )


def _state(frames: dict[str, Any]) -> State:
    accounts = frozenset((int(r[0]), int(r[1])) for r in frames[ACCOUNT].select("id", "balance").collect())
    entries = frozenset(
        (int(r[0]), int(r[1]), int(r[2]))
        for r in frames[ENTRY].select("id", "account_id", "amount").collect()
    )
    return accounts, entries


def _whole(state: State) -> bool:
    """Every balance is the sum of its account's entries (what every transaction keeps)."""
    accounts, entries = state
    sums = dict.fromkeys(ACCOUNTS, 0)
    for _, account, amount in entries:
        sums[account] += amount
    return dict(accounts) == sums


def _at(spark: Any, path: str, version: int) -> Any:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def test_every_committed_window_is_a_cut_through_whole_transactions(hook: VitessHook, tmp_path: Path) -> None:
    spark = spark_session()
    ledger = Ledger(hook, "cuts")
    ledger.create()
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"cuts-{uuid.uuid4().hex[:8]}", "commerce", (ACCOUNT, ENTRY), str(tmp_path / "stage"))
    capture = CaptureRunner(hook, store, spec, holder="test-cuts")

    def merge_all(keep_window_records: int = 500) -> int:
        merger = MergeRunner(
            store,
            spec.sync_id,
            str(tmp_path / "delta"),
            holder="test-cuts-merge",
            keep_window_records=keep_window_records,
        )
        return merger.run(lambda plan: merge(spark, plan)).committed_seq

    capture.snapshot()
    first = merge_all()
    assert _state(consistent_tables(spark, store, spec.sync_id)) == ledger.states[-1]

    rounds: list[tuple[int, int]] = []  # (first window, last window) of each round
    before_round_2 = None
    for round_ in range(2):
        for _ in range(9):
            ledger.step()
        # 2-3 row changes a transaction: windows of a few transactions each.
        staged = capture.backlog(ReadBounds(max_events=8))
        assert len(staged.windows) >= 2, staged
        last = merge_all()
        rounds.append((staged.windows[0].seq, last))
        if round_ == 0:
            before_round_2 = datetime.datetime.now(datetime.timezone.utc)

    committed = store.committed(spec.sync_id)[1]
    assert committed == rounds[-1][1]
    assert_delta_equals_source(hook, "commerce", [ACCOUNT, ENTRY], tmp_path / "delta")
    latest = consistent_cut(store, spec.sync_id)
    assert latest.seq == committed and set(latest.tables) == {ACCOUNT, ENTRY}
    assert _state(consistent_tables(spark, store, spec.sync_id)) == ledger.states[-1]

    with pytest.raises(CutUnavailableError, match=rf"window {committed + 1} is not committed"):
        consistent_cut(store, spec.sync_id, window=committed + 1)

    # Every window's cut is the state after one transaction, in commit order.
    found, torn = [], 0
    previous = None
    for seq in range(first, committed + 1):
        taken = consistent_cut(store, spec.sync_id, window=seq)
        state = _state(consistent_tables(spark, store, spec.sync_id, window=seq))
        assert state in ledger.states, f"window {seq}'s cut is the state after no transaction"
        assert _whole(state)
        found.append(ledger.states.index(state))
        # Both tables at the newer window but one at the older: the reader between two commits.
        if previous is not None and all(
            taken.tables[t].version != previous.tables[t].version for t in (ACCOUNT, ENTRY)
        ):
            halves = {
                ACCOUNT: _at(spark, taken.tables[ACCOUNT].path, taken.tables[ACCOUNT].version),
                ENTRY: _at(spark, previous.tables[ENTRY].path, previous.tables[ENTRY].version),
            }
            mixed = _state(halves)
            assert mixed not in ledger.states and not _whole(mixed)
            torn += 1
        previous = taken
    assert found == sorted(found) and len(set(found)) == len(found), found
    assert torn >= 2, "no two windows in a row changed both tables: the tear was never shown"

    # By time: the newest window merged before round 2 began is round 1's last.
    assert before_round_2 is not None
    assert consistent_cut(store, spec.sync_id, as_of=before_round_2).seq == rounds[0][1]
    assert first < rounds[0][0]

    sql = cut_sql(latest)
    assert sql[ENTRY] == (
        f"SELECT * FROM delta.`{latest.tables[ENTRY].path}` VERSION AS OF {latest.tables[ENTRY].version}"
    )
    via_sql = {t: spark.sql(q) for t, q in sql.items()}
    assert _state(via_sql) == ledger.states[-1]

    # Pruning keeps the 2 newest windows' records: older cuts are refused by name, and the cut at
    # the oldest window kept is still whole (each table keeps its newest version before it).
    for _ in range(4):
        ledger.step()
    capture.backlog(ReadBounds(max_events=4))
    committed = merge_all(keep_window_records=2)
    oldest = committed - 1
    with pytest.raises(CutUnavailableError, match=rf"window {oldest - 1} is older than the oldest window"):
        consistent_cut(store, spec.sync_id, window=oldest - 1)
    kept = _state(consistent_tables(spark, store, spec.sync_id, window=oldest))
    assert kept in ledger.states and _whole(kept)
    assert _state(consistent_tables(spark, store, spec.sync_id)) == ledger.states[-1]
    store.close()


def test_a_re_snapshot_of_one_table_is_no_cut_until_the_next_catch_up(
    hook: VitessHook, tmp_path: Path
) -> None:
    """A transaction writes both tables right before a re-snapshot of one of them: the re-copied
    table shows it, the other one not yet (its changes are read by the next catch-up). The cut at
    the committed position is the window's before the re-copy, whole; the re-snapshot's window is
    refused by number; after the next catch-up the cut is at it and equals the source."""
    spark = spark_session()
    ledger = Ledger(hook, "resnapshot-cut")
    ledger.create()
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"cutsre-{uuid.uuid4().hex[:8]}", "commerce", (ACCOUNT, ENTRY), str(tmp_path / "stage"))
    capture = CaptureRunner(hook, store, spec, holder="test-cuts")
    merger = MergeRunner(store, spec.sync_id, str(tmp_path / "delta"), holder="test-cuts-merge")

    def merge_all() -> int:
        return merger.run(lambda plan: merge(spark, plan)).committed_seq

    capture.snapshot()
    merge_all()
    for _ in range(3):
        ledger.step()
    capture.catch_up()
    before = merge_all()
    assert _state(consistent_tables(spark, store, spec.sync_id)) == ledger.states[-1]
    ledger.step()  # both tables, then one of them re-copied
    ledger.step()
    capture.snapshot(tables=[ACCOUNT])
    resnapshot = merge_all()
    assert resnapshot == before + 1

    # The tear is real: the tables at their newest versions are the state after no transaction.
    newest = {t: spark.read.format("delta").load(str(tmp_path / "delta" / t)) for t in (ACCOUNT, ENTRY)}
    assert not _whole(_state(newest))
    latest = consistent_cut(store, spec.sync_id)
    assert latest.seq == before, latest
    state = _state(consistent_tables(spark, store, spec.sync_id))
    assert state == ledger.states[-3] and _whole(state)
    with pytest.raises(
        CutUnavailableError, match=rf"window {resnapshot} re-copied some tables while \['{ENTRY}'\]"
    ):
        consistent_cut(store, spec.sync_id, window=resnapshot)
    assert (
        consistent_cut(store, spec.sync_id, as_of=datetime.datetime.now(datetime.timezone.utc)).seq == before
    )

    capture.catch_up()
    after = merge_all()
    assert consistent_cut(store, spec.sync_id).seq == after
    assert _state(consistent_tables(spark, store, spec.sync_id)) == ledger.states[-1]
    assert_delta_equals_source(hook, "commerce", [ACCOUNT, ENTRY], tmp_path / "delta")
    store.close()
