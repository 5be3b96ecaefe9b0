"""Issue 31's acceptance of shard groups on four shards: the ``sharded`` keyspace
(-40,40-80,80-c0,c0-; ``four_shard_cluster``) synced in two groups given by their key ranges
(``capture_parallelism=["-80", "80-"]``) through the DAG factory and Airflow (``dag.test()``,
merges on Spark Connect): two shards per group, so some moves stay inside a group and others
cross between groups.

The first DAG run snapshots (one process: the snapshot is not split over groups yet) and reads a
first grouped window; then seeded workload rounds (``group_workload.Workload``: moves between
shards in one transaction, either half first; moves split by a window stop in both orders;
same-second delete and re-insert; key changes; updates; deletes), one DAG run each. After every
run Delta equals ``SELECT *`` through vtgate, every window is in the Delta log exactly once, and
the grouped windows were read by the two groups of two shards.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.conftest import connection_uri_env
from tests.integration.airflow_env import CONNECT_MERGE, AirflowEnv, assert_succeeded, make_airflow_env
from tests.integration.delta_check import assert_delta_equals_source, delta_txns
from tests.integration.group_workload import Workload, create_orders
from tests.integration.topology import FourShardCluster

pytestmark = pytest.mark.integration

TABLE = "group4_orders"  # this module's own table
SYNC = "groups4_dag"
CUSTOMERS = range(1, 25)
CONN = "vitess_groups4"

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{sync}",
    keyspace="{keyspace}",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,
    capture_parallelism=["-80", "80-"],  # the groups' key ranges: two shards each
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


@pytest.fixture(scope="module")
def hook(four_shard_cluster: FourShardCluster) -> Iterator[VitessHook]:
    name, value = connection_uri_env(CONN, four_shard_cluster.vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook(CONN)


def _setup(hook: VitessHook, keyspace: str) -> None:
    create_orders(hook, f"{keyspace}.{TABLE}", CUSTOMERS)


def _shards(hook: VitessHook, cluster: FourShardCluster) -> dict[int, str]:
    """Each customer's shard, asked of each shard through vtgate (a session aimed at it)."""
    out: dict[int, str] = {}
    for shard in cluster.shards:
        with hook.connect_sql() as conn:
            conn.execute(sqlalchemy.text(f"USE `{cluster.keyspace}:{shard}`"))
            for (customer,) in conn.execute(sqlalchemy.text(f"SELECT DISTINCT customer_id FROM {TABLE}")):
                out[int(customer)] = shard
            conn.execute(sqlalchemy.text(f"USE `{cluster.keyspace}`"))
    assert sorted(out) == list(CUSTOMERS), out
    # Every shard holds customers: moves within a group and across groups both happen.
    assert set(out.values()) == set(cluster.shards), out
    return out


@pytest.fixture
def airflow(four_shard_cluster: FourShardCluster, spark_connect: str, tmp_path: Path) -> AirflowEnv:
    env = make_airflow_env(tmp_path / "af", four_shard_cluster.vitess, spark_connect=spark_connect)
    source = DAG_FILE.format(
        sync=SYNC,
        keyspace=four_shard_cluster.keyspace,
        table=TABLE,
        lake=tmp_path / "lake",
        merge_kwargs=CONNECT_MERGE,
    )
    env.write_dag(SYNC, source)
    return env


def _moving(
    wl: Workload, store: CheckpointStore, run: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], int]:
    """``run()`` while a thread moves keys between shards INSERT first, DELETE half a second later
    (as vtgate's two shard commits of a move, slowly), until the plan task has planned the window:
    its stop, taken meanwhile, falls between the halves of a move or just after one. The move in
    flight then completes (its DELETE in the next window): the source is whole when Delta is
    compared. (DELETE-first moves across a stop: ``Workload.split_moves``.) Returns the run's
    result and how many moves were made; a move that failed fails the test with its own error."""
    done, moved, committed = threading.Event(), [0], store.committed(SYNC)[1]
    failed: list[BaseException] = []

    def planned() -> bool:
        try:
            return store.open_window(SYNC) is not None or store.committed(SYNC)[1] != committed
        except sqlalchemy.exc.OperationalError:  # the run's writer holds the SQLite file a moment
            return False

    def mover() -> None:
        try:
            while not done.is_set() and not planned():
                # Never a key a DELETE-first split move took out (``Workload.movable``): its
                # pending INSERT would put it on a second shard, a true duplicate at the source.
                wl.move_apart(wl.rng.choice(wl.movable()), insert_first=True, gap=0.5)
                moved[0] += 1
                done.wait(0.1)
        except BaseException as exc:  # raised in the test's thread below, not lost in this one
            failed.append(exc)

    thread = threading.Thread(target=mover, daemon=True)
    thread.start()
    try:
        result = run()
    finally:
        done.set()
        thread.join(timeout=30)
    if failed:
        raise AssertionError(f"a move failed after {moved[0]} moves") from failed[0]
    return result, moved[0]


def _check(hook: VitessHook, keyspace: str, store: CheckpointStore, delta: Path) -> int:
    """Delta == SELECT *; every committed window with changes once in the Delta log (an empty
    one makes no Delta commit), none twice; nothing left open. Returns the committed seq."""
    assert_delta_equals_source(hook, keyspace, [TABLE], delta)
    _, committed = store.committed(SYNC)
    assert committed is not None
    versions = [v for app, v, _ in delta_txns(delta / TABLE) if app.endswith(f":{SYNC}:{TABLE}")]
    with_rows = [s for s in range(1, committed + 1) if int(store.window(SYNC, s).stats.get("rows") or 0)]
    assert sorted(versions) == with_rows, (versions, with_rows)
    assert store.open_window(SYNC) is None
    return committed


def test_four_shards_in_two_groups_through_the_dag_factory(
    airflow: AirflowEnv, hook: VitessHook, four_shard_cluster: FourShardCluster, tmp_path: Path
) -> None:
    _acceptance(airflow, hook, four_shard_cluster, tmp_path, straddle=False)


@pytest.mark.skipif(
    os.environ.get("VITESS_TEST_STRADDLE") != "1",
    reason="150-220 s, over make test's budget; run with VITESS_TEST_STRADDLE=1 (passes since the "
    "mover no longer moves keys whose split-move INSERT is pending: Workload.movable)",
)
def test_moves_straddle_the_stop_of_a_grouped_window(
    airflow: AirflowEnv, hook: VitessHook, four_shard_cluster: FourShardCluster, tmp_path: Path
) -> None:
    """As above, with INSERT-first moves (DELETE 0.5 s later) going on until the plan task
    planned each window: a stop falls between the halves of a move (``_moving``).

    It once failed with KeyConflictError (key 2 held by 80-c0 and c0-): not a false conflict
    but a true duplicate the mover made at the source. It moved a key whose DELETE-first split
    move was waiting for its INSERT (the row in no shard): its INSERT put the key on one shard,
    its DELETE (aimed at the pending shard) deleted nothing, and the next round's pending INSERT
    put the key on a second shard. Reproduced (keys 6 and 13, with one process as with groups):
    no DELETE half of that move in any window's staged rows, and the keys listed by
    ``GROUP BY order_id HAVING COUNT(*) > 1`` through vtgate. The merge refuses such a key once
    its window runs CONTEXT_SECONDS past the second INSERT. The mover now takes only
    ``Workload.movable`` keys."""
    _acceptance(airflow, hook, four_shard_cluster, tmp_path, straddle=True)


def _acceptance(
    airflow: AirflowEnv, hook: VitessHook, cluster: FourShardCluster, tmp_path: Path, *, straddle: bool
) -> None:
    delta = tmp_path / "lake" / "delta"
    _setup(hook, cluster.keyspace)
    shard_of = _shards(hook, cluster)
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    wl = Workload(hook, 4, shard_of, f"{cluster.keyspace}.{TABLE}", CUSTOMERS)

    first = airflow.run_dag(SYNC)
    assert_succeeded(first, "snapshot", "merge_snapshot", "plan_catch_up", "catch_up", "merge")
    _check(hook, cluster.keyspace, store, delta)

    groups = [("-40", "40-80"), ("80-c0", "c0-")]
    crossing = 0
    for n in range(2):
        before = dict(wl.orders)
        wl.round(30, f"r{n}")
        # DELETE-first moves whose INSERT waits for the next round (the row gone meanwhile, in
        # the source as in Delta); INSERT-first ones whose DELETE follows at once (the DELETE
        # seconds later, after a stop taken in a DAG run: ``_moving``).
        wl.split_moves(f"r{n}")()
        crossing += sum(
            1
            for k, c in wl.orders.items()
            if k in before and (shard_of[before[k]] in groups[0]) != (shard_of[c] in groups[0])
        )
        if straddle:
            run, moved = _moving(wl, store, lambda: airflow.run_dag(SYNC))  # moves across the stop
            assert moved > 2, moved
        else:
            run = airflow.run_dag(SYNC)
        assert_succeeded(run, "plan_catch_up", "catch_up", "merge")
        assert run["mapped"]["catch_up"] == {"0": "success", "1": "success"}, run["mapped"]
        committed = _check(hook, cluster.keyspace, store, delta)
        assert [g.shards for g in store.window_groups(SYNC, committed)] == groups
    assert crossing > 0  # rows did move between the groups

    # The last split moves' INSERTs, read by one more run: the source whole again.
    wl.round(0, "last")
    final = airflow.run_dag(SYNC)
    assert_succeeded(final, "plan_catch_up", "catch_up", "merge")
    _check(hook, cluster.keyspace, store, delta)
