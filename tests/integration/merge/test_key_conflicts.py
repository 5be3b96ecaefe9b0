"""A key unique per shard only, on the real sharded ``customer`` keyspace.

MySQL enforces a PRIMARY KEY per shard: a table sharded by ``customer_id`` whose primary key is
``order_id`` alone (the demo's ``corder``) can hold one ``order_id`` on two shards. Before, the
merge kept one of the two rows and the run was green. Now the merge refuses, naming table, key
value and both shards, in a snapshot and in a catch-up window; and the remedy the error names (a
key override that adds the vindex column) gives a Delta table equal to ``SELECT *``.

Through the DAG factory, as a user runs it: the first run's ``merge_snapshot`` fails with the
conflict; the user edits the DAG as the error says and triggers it with
``{"resnapshot_tables": [t]}``; that run replaces the staged snapshot window (before, it handed the
same window, with the key it was staged with, back to the merge, which failed the same way run
after run), and Delta equals ``SELECT *``. With one process and with shard groups.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.group_snapshot import GroupedSnapshot
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import KeyChangedError, KeyConflictError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.staging import read_table
from tests.support import merge_workload as wl
from tests.support.airflow_env import (
    CONNECT_MERGE,
    AirflowEnv,
    assert_succeeded,
    make_airflow_env,
)
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

TABLE = "dupkey_orders"
# hash(1) and hash(4) fall on different shards; the test checks it from the staged rows.
CUSTOMER_A, CUSTOMER_B = 1, 4


def _create(hook: Any, table: str) -> None:
    """``table`` sharded by hash(customer_id), its primary key ``order_id`` alone, 20 rows."""
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS customer.{table}",
        f"CREATE TABLE customer.{table} (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
        "note VARCHAR(32), PRIMARY KEY (order_id))",
    )
    try:  # the vschema outlives a dropped table
        wl.execute(hook, f"ALTER VSCHEMA ON customer.{table} ADD VINDEX hash(customer_id) USING hash")
    except sqlalchemy.exc.DBAPIError as exc:
        if "already" not in str(exc):
            raise
    values = ", ".join(
        f"({oid}, {CUSTOMER_A if oid % 2 else CUSTOMER_B}, 'row {oid}')" for oid in range(1, 21)
    )
    wl.execute(hook, f"INSERT INTO customer.{table} (order_id, customer_id, note) VALUES {values}")


@pytest.fixture
def hook(vitess: LocalVitess) -> Any:
    hook = wl.hook_for(vitess, "vitess_dupkey")
    _create(hook, TABLE)
    return hook


def _insert(hook: Any, order_id: int, customer_id: int, table: str = TABLE) -> None:
    wl.execute(
        hook,
        f"INSERT INTO customer.{table} (order_id, customer_id, note) "
        f"VALUES ({order_id}, {customer_id}, 'dup {order_id}/{customer_id}')",
    )


def _sync(hook: Any, tmp_path: Path, overrides: dict[str, KeyOverrides] | None = None) -> wl.Sync:
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync_id = f"dupkey-{uuid.uuid4().hex[:8]}"
    spec = SyncSpec(sync_id, "customer", (TABLE,), str(tmp_path / "stage"), key_overrides=overrides or {})
    return wl.Sync(
        sync_id, "customer", (TABLE,), CaptureRunner(hook, store, spec, holder="test-dupkey"), store
    )


def _shards(sync: wl.Sync) -> tuple[str, str]:
    shard_of = {r["customer_id"]: r["_shard"] for r in read_table(sync.manifests[0], TABLE).to_pylist()}
    assert shard_of[CUSTOMER_A] != shard_of[CUSTOMER_B]
    return shard_of[CUSTOMER_A], shard_of[CUSTOMER_B]


def _assert_conflict(
    exc: pytest.ExceptionInfo[KeyConflictError], order_id: int, shards: tuple[str, str]
) -> None:
    text = str(exc.value)
    assert f"table {TABLE!r}: key (order_id) = ({order_id}) is held by shards " in text, text
    assert ", ".join(sorted(shards)) in text, text
    assert "source_unique_key_columns" in text and "resnapshot_tables" in text, text


def test_snapshot_with_one_key_on_two_shards_is_refused(hook: Any, tmp_path: Path) -> None:
    _insert(hook, 7, CUSTOMER_B)  # order 7 is on CUSTOMER_A's shard already
    sync = _sync(hook, tmp_path)
    sync.capture(snapshot=True)
    staged = [r for r in read_table(sync.manifests[0], TABLE).to_pylist() if r["order_id"] == 7]
    assert len(staged) == 2  # both rows were read: the merge is where they would collapse
    root = tmp_path / "delta"
    with pytest.raises(KeyConflictError) as exc:
        merge(spark_session(), sync.plan(root))
    _assert_conflict(exc, 7, _shards(sync))
    assert not list((root / TABLE).glob("_delta_log/*.json"))  # nothing committed


def test_catch_up_with_one_key_on_two_shards_is_refused(hook: Any, tmp_path: Path) -> None:
    sync = _sync(hook, tmp_path)
    sync.capture(snapshot=True)
    root = tmp_path / "delta"
    spark = spark_session()
    merge(spark, sync.plan(root))
    wl.execute(hook, f"UPDATE customer.{TABLE} SET note = 'first' WHERE order_id = 3")
    _insert(hook, 100, CUSTOMER_A)
    _insert(hook, 100, CUSTOMER_B)
    # The window reads past the second row by more than a move's two commits can be apart, so
    # the second row cannot be the INSERT half of a move whose DELETE half is still to come.
    time.sleep(7)
    wl.execute(hook, f"UPDATE customer.{TABLE} SET note = 'later' WHERE order_id = 5")
    sync.capture()
    with pytest.raises(KeyConflictError) as exc:
        merge(spark, sync.plan(root, first=1))
    _assert_conflict(exc, 100, _shards(sync))
    # The window was not applied: the row it updated is as the snapshot left it.
    notes = {r["order_id"]: r["note"] for r in spark.read.format("delta").load(str(root / TABLE)).collect()}
    assert notes[3] == "row 3" and 100 not in notes


def _history(plan: MergePlan) -> MergePlan:
    """The plan with its table in mode ``history``."""
    targets = {t: replace(v, shape=TargetShape(TargetMode.HISTORY)) for t, v in plan.targets.items()}
    return replace(plan, targets=targets)


def test_catch_up_with_one_key_on_two_shards_is_refused_in_history(hook: Any, tmp_path: Path) -> None:
    """In ``history`` two shards holding one key would be two live rows of the source folded into
    one current version that flips between them: the merge refuses as a mirror's does."""
    sync = _sync(hook, tmp_path)
    sync.capture(snapshot=True)
    root = tmp_path / "delta"
    spark = spark_session()
    merge(spark, _history(sync.plan(root)))
    wl.execute(hook, f"UPDATE customer.{TABLE} SET note = 'first' WHERE order_id = 3")
    _insert(hook, 100, CUSTOMER_A)
    _insert(hook, 100, CUSTOMER_B)
    time.sleep(7)  # past a move's two commits, as in the mirror's test above
    wl.execute(hook, f"UPDATE customer.{TABLE} SET note = 'later' WHERE order_id = 5")
    sync.capture()
    with pytest.raises(KeyConflictError) as exc:
        merge(spark, _history(sync.plan(root, first=1)))
    _assert_conflict(exc, 100, _shards(sync))
    # Nothing of the window was written: order 3 has the snapshot's version only, no order 100.
    rows = spark.read.format("delta").load(str(root / TABLE)).collect()
    assert sorted(r["note"] for r in rows if r["order_id"] == 3) == ["row 3"]
    assert not [r for r in rows if r["order_id"] == 100]


def test_key_with_the_vindex_column_keeps_both_rows(hook: Any, tmp_path: Path) -> None:
    """The remedy the error names: the vindex column in the key; both phases, Delta == source."""
    _insert(hook, 7, CUSTOMER_B)
    overrides = {TABLE: KeyOverrides(source_unique_key_columns=("order_id", "customer_id"))}
    sync = _sync(hook, tmp_path, overrides)
    sync.capture(snapshot=True)
    root = tmp_path / "delta"
    spark = spark_session()
    merge(spark, sync.plan(root))
    _insert(hook, 100, CUSTOMER_A)
    _insert(hook, 100, CUSTOMER_B)
    wl.execute(
        hook, f"UPDATE customer.{TABLE} SET note = 'b7' WHERE order_id = 7 AND customer_id = {CUSTOMER_B}"
    )
    wl.execute(hook, f"DELETE FROM customer.{TABLE} WHERE order_id = 100 AND customer_id = {CUSTOMER_A}")
    _insert(hook, 100, CUSTOMER_A)
    sync.capture()
    merge(spark, sync.plan(root, first=1))
    keys = ["order_id", "customer_id"]
    rows = wl.assert_equal_to_source(spark, hook, "customer", TABLE, str(root / TABLE), keys)
    assert rows == 23


def test_a_group_copies_with_its_plans_key_and_a_new_plan_replaces_the_window(
    hook: Any, tmp_path: Path
) -> None:
    """Shard groups: a group task whose key is not the one its window was planned with refuses
    to copy (its part would be merged by the siblings' key), naming the way out; the next
    ``plan_snapshot`` with the new key replaces the unmerged window, and every group copies with
    the new key."""
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync_id = f"dupkey-groups-{uuid.uuid4().hex[:8]}"
    fixed = {TABLE: KeyOverrides(source_unique_key_columns=("order_id", "customer_id"))}

    def copier(overrides: dict[str, KeyOverrides]) -> GroupedSnapshot:
        spec = SyncSpec(sync_id, "customer", (TABLE,), str(tmp_path / "stage"), key_overrides=overrides)
        return GroupedSnapshot(hook, store, spec, holder="test-dupkey-groups")

    assert copier({}).plan_snapshot(2) == [0, 1]
    copier({}).copy_group(0)
    with pytest.raises(KeyChangedError) as refused:
        copier(fixed).copy_group(1)
    message = str(refused.value)
    assert "snapshot window 1 was planned with another choice than group 1's task has now" in message
    assert "key is now ['order_id', 'customer_id'], not ['order_id']" in message, message
    assert "plan_snapshot replaces the unmerged window" in message
    assert store.window_groups(sync_id, 1)[1].state is WindowState.PLANNED  # nothing copied

    assert copier(fixed).plan_snapshot(2) == [0, 1]
    replaced = store.window(sync_id, 1)
    assert replaced.state is WindowState.FAILED and "key is now" in str(replaced.error)
    assert not (tmp_path / "stage" / sync_id / "window=0000000001").exists()
    for group in (0, 1):
        copier(fixed).copy_group(group)
    parts = store.window_groups(sync_id, 2)
    assert [p.state for p in parts] == [WindowState.STAGED, WindowState.STAGED]
    assert {tuple(p.stats["keys"][TABLE]["source_columns"]) for p in parts} == {("order_id", "customer_id")}
    assert sum(p.stats["rows"] for p in parts) == 20
    # merge_snapshot then merges the new window (the duplicate order_id included), exact.
    root = tmp_path / "delta"
    outcome = MergeRunner(store, sync_id, str(root), holder="test-dupkey-groups-merge").run(
        lambda plan: merge(spark_session(), plan)
    )
    assert outcome.seq == 2
    keys = ["order_id", "customer_id"]
    assert wl.assert_equal_to_source(spark_session(), hook, "customer", TABLE, str(root / TABLE), keys) == 20


SIDE = "remedy_side"  # a second table of the sync: it keeps the sync's committed position


def test_a_refused_resnapshot_of_a_streaming_sync_is_replaced_and_the_committed_position_stays(
    hook: Any, tmp_path: Path
) -> None:
    """A re-snapshot of one table of a streaming sync whose merge is refused (a duplicate key
    came in since the first copy): the remedy (the vindex column in the key, ``resnapshot_tables``
    again, as the snapshot task asks it) replaces the staged re-snapshot; the committed position
    is the one before (the other table is only there), and the next catch-up brings both tables
    to ``SELECT *``."""
    wl.create_sharded_table(hook, SIDE, "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(32))", "id")
    wl.execute(hook, f"INSERT INTO customer.{SIDE} (id, note) VALUES (1, 'one'), (2, 'two')")
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    store.migrate()
    sync_id = f"dupkey-streaming-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "delta"
    fixed = {TABLE: KeyOverrides(source_unique_key_columns=("order_id", "customer_id"))}

    def runner(overrides: dict[str, KeyOverrides] | None = None) -> CaptureRunner:
        spec = SyncSpec(
            sync_id, "customer", (TABLE, SIDE), str(tmp_path / "stage"), key_overrides=overrides or {}
        )
        return CaptureRunner(hook, store, spec, holder="test-dupkey-streaming")

    def resnapshot(overrides: dict[str, KeyOverrides] | None = None) -> int:
        """What the snapshot task does with ``{"resnapshot_tables": [TABLE]}``."""
        run = runner(overrides)
        need = run.snapshot_need([TABLE])
        return run.snapshot(tables=need.tables, need=need).seq

    def merged() -> MergeOutcome:
        merger = MergeRunner(store, sync_id, str(root), holder="test-dupkey-streaming-merge")
        return merger.run(lambda plan: merge(spark_session(), plan))

    # A first run asked to re-snapshot one table still copies both: the stream starts past it.
    assert runner().snapshot_need([TABLE]).tables == (TABLE, SIDE)
    runner().snapshot()
    merged()
    position, seq = store.committed(sync_id)
    _insert(hook, 7, CUSTOMER_B)  # order 7 is on CUSTOMER_A's shard already
    wl.execute(hook, f"UPDATE customer.{SIDE} SET note = 'changed' WHERE id = 2")
    refused_seq = resnapshot()
    for _ in range(2):  # run after run, until the remedy
        with pytest.raises(KeyConflictError, match=r"key \(order_id\) = \(7\) is held by shards"):
            merged()
    assert store.committed(sync_id) == (position, seq)

    healed_seq = resnapshot(fixed)
    assert healed_seq == refused_seq + 1
    assert store.window(sync_id, refused_seq).state is WindowState.FAILED
    assert merged().seq == healed_seq
    assert store.committed(sync_id) == (position, healed_seq)  # the position stays: SIDE is there
    runner(fixed).catch_up()  # SIDE's change; TABLE's changes behind its copy are left out
    merged()
    wl.assert_equal_to_source(
        spark_session(), hook, "customer", TABLE, str(root / TABLE), ["order_id", "customer_id"]
    )
    wl.assert_equal_to_source(spark_session(), hook, "customer", SIDE, str(root / SIDE), ["id"])
    wl.execute(hook, f"DROP TABLE IF EXISTS customer.{SIDE}")


# -- through Airflow: the DAG factory, dag.test(), the remedy as the error words it -------------

DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

{dag_id} = vitess_sync_dag(
    "{dag_id}",
    keyspace="customer",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    key_overrides={overrides!r},
    capture_parallelism={parallelism},
    schedule=None,
    wait_for_changes=False,
    default_args={{"retries": 0}},
    merge_kwargs={merge},
)
"""


@pytest.fixture(scope="module")
def airflow(vitess: LocalVitess, spark_connect: str, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    # Merges on Spark Connect: no JVM per merge task.
    return make_airflow_env(tmp_path_factory.mktemp("af"), vitess, spark_connect=spark_connect)


@pytest.fixture(scope="module")
def dag_hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    yield wl.hook_for(vitess, "vitess_remedy")


@pytest.mark.parametrize("parallelism", [1, 2], ids=["one_process", "shard_groups"])
def test_the_remedy_the_conflict_names_heals_the_sync_through_the_dag(
    airflow: AirflowEnv, dag_hook: VitessHook, parallelism: int, tmp_path: Path
) -> None:
    table = f"remedy_orders_{parallelism}"
    dag_id = f"remedy_dupkey_{parallelism}"
    _create(dag_hook, table)
    _insert(dag_hook, 7, CUSTOMER_B, table)  # order 7 is on CUSTOMER_A's shard already
    lake = tmp_path / "lake"

    def write(overrides: dict[str, Any]) -> None:
        airflow.write_dag(
            dag_id,
            DAG_FILE.format(
                dag_id=dag_id,
                table=table,
                lake=lake,
                overrides=overrides,
                parallelism=parallelism,
                merge=CONNECT_MERGE,
            ),
        )

    write({})
    first = airflow.run_dag(dag_id)
    assert_succeeded(first, "snapshot", *(["plan_snapshot"] if parallelism > 1 else []))
    assert first["tasks"]["merge_snapshot"] == "failed", first["tasks"]
    log = str(first["log"])
    assert "KeyConflictError" in log and f"table {table!r}: key (order_id) = (7) is held by shards" in log
    assert "source_unique_key_columns" in log and "resnapshot_tables" in log

    # What the error says: the vindex column in the key, and a re-snapshot of the table.
    write({table: {"source_unique_key_columns": ["order_id", "customer_id"]}})
    second = airflow.run_dag(dag_id, conf={"resnapshot_tables": [table]})
    assert_succeeded(second, "snapshot", "merge_snapshot", "catch_up", "merge")
    rows = wl.assert_equal_to_source(
        spark_session(), dag_hook, "customer", table, str(lake / "delta" / table), ["order_id", "customer_id"]
    )
    assert rows == 21
    # The refused window was replaced, not merged: FAILED, its files gone; the new one committed.
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    refused = store.window(dag_id, 1)
    assert refused.state is WindowState.FAILED and "key is now ['order_id', 'customer_id']" in str(
        refused.error
    ), refused
    assert not (lake / "staging" / dag_id / "window=0000000001").exists()
    committed = store.window(dag_id, 2)
    assert committed.kind.value == "snapshot" and committed.state is WindowState.COMMITTED
    assert committed.stats["keys"][table]["source_columns"] == ["order_id", "customer_id"]
    if parallelism > 1:  # the new window was copied by the two groups, each once
        assert len(store.window_groups(dag_id, 2)) == 2
        assert second["mapped"]["snapshot"] == {"0": "success", "1": "success"}, second["mapped"]
    wl.execute(dag_hook, f"DROP TABLE IF EXISTS customer.{table}")
