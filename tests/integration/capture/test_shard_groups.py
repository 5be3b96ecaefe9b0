"""A sync read by two shard groups (``capture_parallelism=2``) on the real 2-shard ``customer``
keyspace: one group per shard, so every move between shards is a move between groups.

* A seeded workload moves rows between the shards (in one transaction, DELETE first and INSERT
  first; and split by a window stop, in both orders and both directions), deletes and re-inserts
  a key in the same second (on its shard and onto the other), changes keys, updates and deletes.
  Every run plans a window, reads each group's part (in either order), merges: Delta equals
  ``SELECT *`` through vtgate after every run, and every window is in the Delta log once.
* A group's capture SIGKILLed at a seeded point of its read (or after writing its part, before
  recording it), in 3 seeds: only that group is read again; the other group's part is kept; the
  merge then gives Delta == ``SELECT *``.

The DAG factory with groups through Airflow: ``test_groups_four_shards.py``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.capture.groups import GroupedCatchUp
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import SyncLockedError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.staging import read_table
from tests.support import capture_child
from tests.support.delta_check import assert_delta_equals_source, delta_txns, spark_session
from tests.support.group_workload import Workload, create_orders
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

TABLE = "group_orders"
CUSTOMERS = range(1, 13)
CONN = "vitess_groups"
STALE = timedelta(seconds=3)  # the group lock of a killed capture is taken over after this


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env(CONN, vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook(CONN)


def _setup(hook: VitessHook) -> None:
    create_orders(hook, f"customer.{TABLE}", CUSTOMERS)


class GroupedSync:
    """A sync of TABLE read by two groups, merged with the real merge runner and Spark."""

    def __init__(self, hook: VitessHook, root: Path) -> None:
        self.hook, self.root = hook, root
        self.sync_id = f"groups-{uuid.uuid4().hex[:8]}"
        self.store = CheckpointStore(f"sqlite:///{root}/store.db")
        self.store.migrate()
        self.spec = SyncSpec(self.sync_id, "customer", (TABLE,), str(root / "stage"))
        self.delta = root / "delta"
        self.spark = spark_session()

    def grouped(self, who: str) -> GroupedCatchUp:
        return GroupedCatchUp(self.hook, self.store, self.spec, holder=who, lock_stale_after=STALE)

    def snapshot(self) -> dict[int, str]:
        """Snapshot and merge; each customer's shard, from the staged copy."""
        outcome = CaptureRunner(self.hook, self.store, self.spec, holder="snapshot").snapshot()
        self.merge()
        return {r["customer_id"]: r["_shard"] for r in read_table(outcome.manifest, TABLE).to_pylist()}

    def plan(self) -> list[int]:
        return self.grouped("plan").plan(2)

    def read(self, group: int) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:  # a killed try's group lock goes stale after STALE
            try:
                return self.grouped(f"group {group}").read_group(group)
            except SyncLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def merge(self) -> None:
        runner = MergeRunner(self.store, self.sync_id, str(self.delta), holder="merge")
        runner.run(lambda plan: merge(self.spark, plan))

    def check(self) -> None:
        assert_delta_equals_source(self.hook, "customer", [TABLE], self.delta, self.spark)
        _, committed = self.store.committed(self.sync_id)
        versions = [
            v for app, v, _ in delta_txns(self.delta / TABLE) if app.endswith(f":{self.sync_id}:{TABLE}")
        ]
        assert sorted(versions) == list(range(1, committed + 1)), versions  # every window, once
        assert self.store.open_window(self.sync_id) is None


def test_two_groups_stay_exact_through_moves_between_them(hook: VitessHook, tmp_path: Path) -> None:
    _setup(hook)
    sync = GroupedSync(hook, tmp_path)
    shard_of = sync.snapshot()
    assert sorted(set(shard_of.values())) == ["-80", "80-"]
    sync.check()
    wl = Workload(hook, 31, shard_of, f"customer.{TABLE}", CUSTOMERS)
    for run in range(4):
        wl.round(40, f"r{run}")
        finish = wl.split_moves(f"r{run}")
        groups = sync.plan()
        finish()  # after the stop: in the next window
        assert groups == [0, 1]
        seq = sync.store.open_window(sync.sync_id)
        assert seq is not None
        layout = [g.shards for g in sync.store.window_groups(sync.sync_id, seq.seq)]
        assert layout == [("-80",), ("80-",)]
        for g in groups if run % 2 == 0 else reversed(groups):
            assert sync.read(g)["status"] == "staged"
        assert sync.store.window(sync.sync_id, seq.seq).state is WindowState.PLANNED  # until the merge
        sync.merge()
        sync.check()
    # The last round's DELETE-first moves get their INSERT; one more run reads them.
    wl.round(5, "last")
    sync.plan()
    for g in (1, 0):
        sync.read(g)
    sync.merge()
    sync.check()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_killed_group_is_read_again_alone(
    hook: VitessHook, vitess: LocalVitess, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    _setup(hook)
    sync = GroupedSync(hook, tmp_path)
    wl = Workload(hook, 100 + seed, sync.snapshot(), f"customer.{TABLE}", CUSTOMERS)
    wl.round(160, f"k{seed}")
    finish = wl.split_moves(f"k{seed}")
    assert sync.plan() == [0, 1]
    finish()
    window = sync.store.open_window(sync.sync_id)
    assert window is not None
    victim, other = rng.sample([0, 1], 2)
    other_first = rng.random() < 0.5
    if other_first:
        sync.read(other)
    kill: dict[str, Any] = (
        {"kill_before_record": True} if seed == 3 else {"kill_after_rows": rng.randint(1, 40)}
    )
    spec = capture_child.ChildSpec.in_dir(
        tmp_path, sync.sync_id, "customer", (TABLE,), connection_uri_env(CONN, vitess),
        lock_stale_seconds=STALE.total_seconds(), group=victim, **kill,
    )  # fmt: skip
    child = capture_child.run("group", spec, timeout=300)
    assert child.returncode == -9 and "KILLED-" in child.stdout, (
        child.returncode,
        child.stdout,
        child.stderr[-3000:],
    )
    assert sync.store.window_groups(sync.sync_id, window.seq)[victim].state is WindowState.PLANNED
    if not other_first:
        sync.read(other)
    kept = sync.store.window_groups(sync.sync_id, window.seq)[other]
    assert kept.state is WindowState.STAGED and kept.manifest_path and Path(kept.manifest_path).exists()
    # Only the killed group is read again (the other's part is not touched: same record, same file).
    assert sync.read(victim)["status"] == "staged"
    assert sync.store.window_groups(sync.sync_id, window.seq)[other] == kept
    assert sync.read(other)["status"] == "already staged"
    sync.merge()
    sync.check()
