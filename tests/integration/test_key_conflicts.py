"""A key unique per shard only, on the real sharded ``customer`` keyspace.

MySQL enforces a PRIMARY KEY per shard: a table sharded by ``customer_id`` whose primary key is
``order_id`` alone (the demo's ``corder``) can hold one ``order_id`` on two shards. Before, the
merge kept one of the two rows and the run was green. Now the merge refuses, naming table, key
value and both shards, in a snapshot and in a catch-up window; and the remedy the error names (a
key override that adds the vindex column) gives a Delta table equal to ``SELECT *``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import KeyConflictError
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.staging import read_table
from tests.conftest import LocalVitess
from tests.integration import merge_workload as wl
from tests.integration.delta_check import spark_session

pytestmark = pytest.mark.integration

TABLE = "dupkey_orders"
# hash(1) and hash(4) fall on different shards; the test checks it from the staged rows.
CUSTOMER_A, CUSTOMER_B = 1, 4


@pytest.fixture
def hook(vitess: LocalVitess) -> Any:
    hook = wl.hook_for(vitess, "vitess_dupkey")
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS customer.{TABLE}",
        f"CREATE TABLE customer.{TABLE} (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
        "note VARCHAR(32), PRIMARY KEY (order_id))",
    )
    try:  # the vschema outlives a dropped table
        wl.execute(hook, f"ALTER VSCHEMA ON customer.{TABLE} ADD VINDEX hash(customer_id) USING hash")
    except sqlalchemy.exc.DBAPIError as exc:
        if "already" not in str(exc):
            raise
    values = ", ".join(
        f"({oid}, {CUSTOMER_A if oid % 2 else CUSTOMER_B}, 'row {oid}')" for oid in range(1, 21)
    )
    wl.execute(hook, f"INSERT INTO customer.{TABLE} (order_id, customer_id, note) VALUES {values}")
    return hook


def _insert(hook: Any, order_id: int, customer_id: int) -> None:
    wl.execute(
        hook,
        f"INSERT INTO customer.{TABLE} (order_id, customer_id, note) "
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
