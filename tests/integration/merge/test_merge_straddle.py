"""Rows moved between shards whose two halves fall in different windows, on the real vtgate.

A move is a DELETE on the old shard and an INSERT on the new one: two shard commits. A window's
stop position is read per shard, so it can fall between them. The test makes that happen on
purpose: it plans a catch-up window whose stop is the position of the old shard before the move
and of the new shard after it, then lets the next window read the rest. Merged window by window
through the job, the Delta table must equal ``SELECT *`` through vtgate; merged in ``history``
mode, each move is one version contiguous with the one before.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.staging import Manifest, read_table, writer
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

TABLE = "straddle_orders"
# hash(1) and hash(4) are on different halves of the keyspace; the test checks it from the staged
# rows rather than trusting it.
CUSTOMER_A, CUSTOMER_B = 1, 4


def _setup(hook: Any) -> None:
    wl.create_sharded_table(
        hook,
        TABLE,
        "(order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, note VARCHAR(32), PRIMARY KEY (order_id))",
        "customer_id",
    )
    values = ", ".join(
        f"({oid}, {CUSTOMER_A if oid <= 10 else CUSTOMER_B}, 'initial {oid}')" for oid in range(1, 21)
    )
    wl.execute(hook, f"INSERT INTO customer.{TABLE} (order_id, customer_id, note) VALUES {values}")


def _move(hook: Any, order_id: int, to_customer: int, note: str) -> None:
    """vtgate refuses to update a vindex column: a move is DELETE + INSERT in one transaction."""
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text(f"DELETE FROM customer.{TABLE} WHERE order_id = {order_id}"))
        conn.execute(
            sqlalchemy.text(
                f"INSERT INTO customer.{TABLE} (order_id, customer_id, note) "
                f"VALUES ({order_id}, {to_customer}, '{note}')"
            )
        )
        conn.commit()


def _events(manifest: Manifest) -> list[tuple[int, str, str]]:
    """(order_id, op, shard) of the window's staged rows, in staged order."""
    rows = sorted(read_table(manifest, TABLE).to_pylist(), key=lambda r: r["_seq"])
    return [
        (r["order_id"] if r["order_id"] is not None else r["_before_order_id"], r["_op"], r["_shard"])
        for r in rows
    ]


@pytest.mark.parametrize("worker_clock", ["synced", "10 min behind"])
def test_moves_split_by_a_window_stop_keep_the_row(
    vitess: LocalVitess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker_clock: str
) -> None:
    if worker_clock != "synced":
        # The manifests' created_at: a look-back bounded by it stopped before the window holding
        # a move's INSERT, and the merge deleted the moved row.
        behind = datetime.timedelta(minutes=10)
        monkeypatch.setattr(writer, "utc_now", lambda: datetime.datetime.now(datetime.timezone.utc) - behind)
    hook = wl.hook_for(vitess, "vitess_straddle")
    _setup(hook)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(
        hook, store, tmp_path / "stage", f"straddle-{uuid.uuid4().hex[:8]}", "customer", [TABLE]
    )
    snapshot = sync.capture(snapshot=True)
    shard_of = {r["customer_id"]: r["_shard"] for r in read_table(snapshot, TABLE).to_pylist()}
    old, new = shard_of[CUSTOMER_A], shard_of[CUSTOMER_B]
    assert old != new

    def split_window(moves: list[tuple[int, int, str]], early_shard: str) -> Manifest:
        """Runs ``moves``; their halves on ``early_shard`` fall in the next window."""

        def act() -> None:
            for order_id, to_customer, note in moves:
                _move(hook, order_id, to_customer, note)

        return sync.capture_split(act, early_shard)

    # 1. Moves from the old shard to the new; the stop falls after the INSERTs, before the DELETEs.
    first = split_window([(3, CUSTOMER_B, "moved 3"), (4, CUSTOMER_B, "moved 4")], early_shard=old)
    assert _events(first) == [(3, "insert", new), (4, "insert", new)]
    # 2. The next split window brings those DELETEs (the old shard's stop was before them). Row 12
    #    moves the other way, split the other way round (its DELETE here, its INSERT next window);
    #    row 5 moves like rows 3 and 4, and is then deleted for good on its new shard.
    second = split_window([(12, CUSTOMER_A, "moved 12"), (5, CUSTOMER_B, "moved 5")], early_shard=old)
    wl.execute(hook, f"DELETE FROM customer.{TABLE} WHERE order_id = 5")
    third = sync.capture()
    assert sorted(_events(second)) == sorted(
        [(3, "delete", old), (4, "delete", old), (5, "insert", new), (12, "delete", new)]
    )
    assert sorted(_events(third)) == sorted([(5, "delete", old), (12, "insert", old), (5, "delete", new)])

    root = tmp_path / "delta"
    spark = spark_session()
    target_path = str(root / TABLE)
    for i, manifest in enumerate(sync.manifests):
        window = WindowToMerge(manifest.window_seq, manifest.path, (TABLE,) if i == 0 else ())
        merge(spark, MergePlan(sync.sync_id, (window,), sync.targets(root)))
    rows = wl.assert_equal_to_source(spark, hook, "customer", TABLE, target_path, ["order_id"])
    assert rows == 19
    _assert_history(spark, sync, tmp_path / "history")
    # Every catch-up window recorded the newest source time its read saw (a snapshot's copy has
    # none: the look-back ends at it anyway).
    assert [bool(m.source_ts_max) for m in sync.manifests] == [False] + [True] * (len(sync.manifests) - 1)


def _assert_history(spark: Any, sync: Any, root: Path) -> None:
    """The same windows merged in ``history`` mode: a move is one new version, contiguous with
    the one before, whichever half a window stop left for the next window (row 12's DELETE is
    merged a window before its INSERT: the version it ended is mended); row 5, moved and then
    deleted, ends deleted."""
    shape = TargetShape(TargetMode.HISTORY, metadata=True)
    targets = {t: dataclasses.replace(target, shape=shape) for t, target in sync.targets(root).items()}
    for i, manifest in enumerate(sync.manifests):
        window = WindowToMerge(manifest.window_seq, manifest.path, (TABLE,) if i == 0 else ())
        merge(spark, MergePlan(sync.sync_id, (window,), targets))
    versions: dict[int, list[Any]] = {}
    for r in spark.read.format("delta").load(str(root / TABLE)).collect():
        versions.setdefault(r["order_id"], []).append(r)
    p = "_vitess_"
    for oid, vs in versions.items():
        vs.sort(key=lambda r: (r[p + "valid_from"] is not None, r[p + "valid_from"] or 0))
        notes = [(r["note"], r[p + "deleted"], r[p + "current"]) for r in vs]
        if oid in (3, 4, 12):
            assert notes == [(f"initial {oid}", False, False), (f"moved {oid}", False, True)], (oid, vs)
        elif oid == 5:
            assert notes == [("initial 5", False, False), ("moved 5", True, False)], vs
        else:
            assert notes == [(f"initial {oid}", False, True)], (oid, vs)
        assert vs[0][p + "valid_from"] is None  # copied by the snapshot
        for a, b in itertools.pairwise(vs):
            assert a[p + "valid_to"] == b[p + "valid_from"] is not None, (oid, vs)
    assert len(versions) == 20
