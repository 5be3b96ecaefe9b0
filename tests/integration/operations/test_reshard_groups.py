"""A grouped sync (``capture_parallelism=2``) through a reshard of one group's shard, a workload
running: on the four-shard cluster, a keyspace of its own (``regroup``: -80 and 80-, one group
each), 80- split into 80-c0 and c0- by a real ``Reshard`` while the sync reads.

* A grouped window planned before the switch (its stop on the old shards) and read by its
  groups after it: each group reads its old shard up to the stop, before the journal.
* The next window (start on the old shards, stop on the new) is planned without groups and read
  by one process, following the journal.
* The window after that gets its groups from the new shards.
After each quiet run Delta == ``SELECT *`` through vtgate and every window is in the Delta log
once; the status document shows which shards each group read.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.groups import GroupedCatchUp
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.plugins import documents
from tests.support.delta_check import assert_delta_equals_source, delta_txns, spark_session
from tests.support.local import connection_uri_env
from tests.support.topology import SCRIPT, FourShardCluster, four_shard_env

pytestmark = pytest.mark.integration

KEYSPACE = "regroup"
TABLE = "item"
CONN = "vitess_regroup"
OLD_SHARDS, NEW_SHARDS = ("-80", "80-"), ("80-c0", "c0-")
WORKFLOW = "regroup_split"
VSCHEMA = {
    "sharded": True,
    "vindexes": {"hash": {"type": "hash"}},
    "tables": {TABLE: {"column_vindexes": [{"column": "id", "name": "hash"}]}},
}
OLD: dict[str, str] = {}  # shard -> tablet uid, chosen by the fixture
NEW: dict[str, str] = {}


def _topo(*args: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        [str(SCRIPT), *args], env=four_shard_env(), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _free_uids(state_dir: Path, n: int) -> list[str]:
    """Tablet uids no tablet used in this cluster's state dir (the four-shard keyspace has
    100-400; a torn-down tablet's data directory stays, owned by the cluster's user)."""
    free = [str(u) for u in range(500, 3100, 100) if not (state_dir / f"vt_{u:010d}").exists()]
    assert len(free) >= n, f"no free tablet uids left in {state_dir}: stop the four-shard cluster"
    return free[:n]


def _side_by_side(*commands: tuple[str, ...]) -> list[str]:
    """The script's ``commands`` run at once (a tablet's start or stop is mostly waiting:
    mysqld's start and shutdown, vttablet's drain); the stderr of each that failed."""
    env = four_shard_env()
    procs = [
        subprocess.Popen(
            [str(SCRIPT), *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    outputs = [proc.communicate(timeout=300)[1] for proc in procs]
    return [err for proc, err in zip(procs, outputs, strict=True) if proc.returncode != 0]


def _tablets(shards: dict[str, str]) -> None:
    """The shards' tablets, started side by side."""
    if "regroup" not in _topo("vtctldclient", "GetKeyspaces"):
        _topo("vtctldclient", "CreateKeyspace", "--durability-policy=none", KEYSPACE)
    errors = _side_by_side(*[("tablet", KEYSPACE, shard, uid) for shard, uid in shards.items()])
    assert not errors, errors


def _teardown(uids: list[str]) -> None:
    """Best effort: the tablets stopped side by side, then the keyspace deleted."""
    _side_by_side(*[("tablet-down", uid) for uid in uids])
    subprocess.run(
        [str(SCRIPT), "vtctldclient", "DeleteKeyspace", "--recursive", "--force", KEYSPACE],
        env=four_shard_env(),
        capture_output=True,
    )


@pytest.fixture(scope="module")
def hook(four_shard_cluster: FourShardCluster) -> Iterator[VitessHook]:
    _teardown([])  # a previous run's keyspace, if it was kept
    uids = _free_uids(four_shard_cluster.state_dir, 4)
    OLD.update(zip(OLD_SHARDS, uids[:2], strict=True))
    NEW.update(zip(NEW_SHARDS, uids[2:], strict=True))
    _tablets(OLD)
    _topo("vtctldclient", "ApplyVSchema", "--vschema", json.dumps(VSCHEMA), KEYSPACE)
    # The keyspace's serving graph (SrvKeyspace), which vtgate routes by: a new primary's tablet
    # builds it in the background, so a query right after could find none (CI, session 18).
    _topo("vtctldclient", "RebuildKeyspaceGraph", KEYSPACE)
    name, value = connection_uri_env(CONN, four_shard_cluster.vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        try:
            hook = VitessHook(CONN)
            _until_served(hook)
            yield hook
        finally:
            _teardown(uids)


# What vtgate answers until it has seen the new keyspace's serving graph and primaries.
NOT_YET_SERVED = ("no healthy tablet", "SrvKeyspace")


def _until_served(hook: VitessHook, timeout: float = 60) -> None:
    """Until vtgate routes a query to every shard of the new keyspace (it watches the topology
    and its tablets' health on its own schedule)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _execute(hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{TABLE}")
            return
        # Either from a statement or from the connect itself (the hook's VitessConnectionError:
        # CI, session 19), whichever of the pool's steps met the keyspace first.
        except (sqlalchemy.exc.DBAPIError, VitessConnectionError) as exc:
            if not any(s in str(exc) for s in NOT_YET_SERVED) or time.monotonic() > deadline:
                raise
            time.sleep(1)


def _execute(hook: VitessHook, *statements: str) -> None:
    with hook.connect_sql() as conn:
        for sql in statements:
            conn.execute(sqlalchemy.text(sql))
        conn.commit()


class Workload:
    """Seeded inserts, updates and deletes through vtgate until stopped; ``paused()`` holds it
    between two statements (a window's stop taken then holds every write so far)."""

    def __init__(self, hook: VitessHook) -> None:
        self.hook, self.rng = hook, random.Random(318)
        self.gate = threading.Lock()
        self.stopped = threading.Event()
        self.writes = self.refused = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.hook.connect_sql() as conn:
            while not self.stopped.is_set():
                key = self.rng.randrange(1, 200)
                op = self.rng.random()
                if op < 0.5:
                    sql = (f"INSERT INTO {KEYSPACE}.{TABLE} (id, v) VALUES ({key}, {self.writes}) "
                           f"ON DUPLICATE KEY UPDATE v = {self.writes}")  # fmt: skip
                elif op < 0.8:
                    sql = f"UPDATE {KEYSPACE}.{TABLE} SET v = v + 1 WHERE id = {key}"
                else:
                    sql = f"DELETE FROM {KEYSPACE}.{TABLE} WHERE id = {key}"
                with self.gate:
                    try:
                        conn.execute(sqlalchemy.text(sql))
                        conn.commit()
                        self.writes += 1
                    except sqlalchemy.exc.DBAPIError:  # a write refused during the switch
                        conn.rollback()
                        self.refused += 1
                time.sleep(0.01)

    def paused(self) -> threading.Lock:
        return self.gate


class Sync:
    def __init__(self, hook: VitessHook, root: Path) -> None:
        self.hook = hook
        self.sync_id = f"regroup-{uuid.uuid4().hex[:8]}"
        self.store = CheckpointStore(f"sqlite:///{root}/store.db")
        self.store.migrate()
        self.spec = SyncSpec(self.sync_id, KEYSPACE, (TABLE,), str(root / "stage"))
        self.delta = root / "delta"
        self.spark = spark_session()

    def grouped(self, who: str) -> GroupedCatchUp:
        return GroupedCatchUp(self.hook, self.store, self.spec, holder=who)

    def plan(self) -> tuple[int, list[tuple[str, ...]]]:
        """Plans a window: its seq and its group layout (empty: one process)."""
        self.grouped("plan").plan(2)
        window = self.store.open_window(self.sync_id)
        assert window is not None
        return window.seq, [g.shards for g in self.store.window_groups(self.sync_id, window.seq)]

    def read_and_merge(self, seq: int, groups: int) -> None:
        for g in reversed(range(max(groups, 1))):
            assert self.grouped(f"group {g}").read_group(g)["status"] == "staged", g
        self.merge()
        assert self.store.committed(self.sync_id)[1] == seq

    def merge(self) -> None:
        MergeRunner(self.store, self.sync_id, str(self.delta), holder="merge").run(
            lambda plan: merge(self.spark, plan)
        )

    def check(self) -> None:
        assert_delta_equals_source(self.hook, KEYSPACE, [TABLE], self.delta, self.spark)
        _, committed = self.store.committed(self.sync_id)
        versions = [
            v for app, v, _ in delta_txns(self.delta / TABLE) if app.endswith(f":{self.sync_id}:{TABLE}")
        ]
        # Every window once at most (a window without changes writes no Delta commit).
        assert len(versions) == len(set(versions)) and set(versions) <= set(range(1, committed + 1)), versions
        assert 1 in versions and committed in versions, (versions, committed)  # the quiet runs have changes
        assert self.store.open_window(self.sync_id) is None


def test_a_reshard_of_one_groups_shard_is_followed_exactly(hook: VitessHook, tmp_path: Path) -> None:
    _execute(hook, f"CREATE TABLE {KEYSPACE}.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL)")
    _execute(
        hook, f"INSERT INTO {KEYSPACE}.{TABLE} (id, v) VALUES " + ", ".join(f"({i}, 0)" for i in range(1, 60))
    )
    sync = Sync(hook, tmp_path)
    CaptureRunner(hook, sync.store, sync.spec, holder="snapshot").snapshot()
    sync.merge()
    sync.check()

    work = Workload(hook)
    work.thread.start()
    try:
        # A grouped run, quiet at its stop.
        with work.paused():
            seq, layout = sync.plan()
        assert layout == [("-80",), ("80-",)]
        sync.read_and_merge(seq, 2)
        with work.paused():
            seq, layout = sync.plan()
            sync.read_and_merge(seq, len(layout))
            sync.check()

        # 80- split into 80-c0 and c0-, the workload writing meanwhile.
        _tablets(NEW)
        _topo("vtctldclient", "Reshard", "--workflow", WORKFLOW, "--target-keyspace", KEYSPACE, "create",
              "--source-shards", "80-", "--target-shards", "80-c0,c0-")  # fmt: skip
        deadline = time.monotonic() + 180
        while "Copy phase completed" not in (
            shown := _topo("vtctldclient", "Workflow", "--keyspace", KEYSPACE, "show", "--workflow", WORKFLOW)
        ):
            assert time.monotonic() < deadline and '"state": "Error"' not in shown, shown
            time.sleep(1)

        # A grouped window planned on the old shards, its groups read after the switch.
        before_switch, layout = sync.plan()
        assert layout == [("-80",), ("80-",)]
        _topo(
            "vtctldclient", "Reshard", "--workflow", WORKFLOW, "--target-keyspace", KEYSPACE, "switchtraffic"
        )
        sync.read_and_merge(before_switch, 2)

        # Across the switch (start on the old shards, stop on the new): one process, journal and all.
        with work.paused():
            across, layout = sync.plan()
            assert layout == [], "a window across a switch is read by one process"
            sync.read_and_merge(across, 0)
            sync.check()
        committed = sync.store.window(sync.sync_id, across)
        assert committed.end_vgtid is not None
        assert sorted(sg.shard for sg in committed.end_vgtid.shard_gtids) == ["-80", "80-c0", "c0-"]

        # After it: groups cut from the new shards.
        time.sleep(1)
        with work.paused():
            after, layout = sync.plan()
            assert layout == [("-80", "80-c0"), ("c0-",)]
            sync.read_and_merge(after, 2)
            sync.check()
        status = documents.sync_status(sync.store, "default", sync.sync_id, datetime.now(timezone.utc))
        assert status is not None
        groups_of = {w.seq: [(g.shards, g.state) for g in w.groups] for w in status.windows}
        assert groups_of[after] == [(["-80", "80-c0"], "STAGED"), (["c0-"], "STAGED")]
        assert groups_of[before_switch] == [(["-80"], "STAGED"), (["80-"], "STAGED")]
        assert groups_of[across] == []
    finally:
        work.stopped.set()
        work.thread.join(timeout=30)
    assert work.writes > 50, (work.writes, work.refused)
    print(f"\nworkload: {work.writes} writes, {work.refused} refused during the switch")
