"""A key written and then deleted by two transactions of one commit second, on the real vtgate.

``history`` keeps one version per key, shard and commit second. The test commits, within one
second on one shard, transactions that insert a key and update another and one that deletes
both; once with a window stop between the two (the first window merges the insert as a
version, the next brings the delete with the insert in its look-back), once in one window. Merged
window by window in every target mode, each table must end with the second's last state: mirror
== ``SELECT *``; soft_delete's live rows == ``SELECT *`` and the deleted keys flagged; history's
current versions == ``SELECT *`` (the deleted keys have none); the changelog replayed in
``(window, order)`` == ``SELECT *``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.staging import Manifest, read_table
from airflow_provider_vitess.vstream.window import capture_stop_position
from tests.support import merge_workload as wl
from tests.support.delta_check import delta_txns, source_rows, spark_session
from tests.support.group_workload import create_orders
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

TABLE = "samesec_orders"
P = "_vitess_"


def _in_one_second(*transactions: Callable[[], None]) -> None:
    """Runs ``transactions`` right after a second starts, so that they commit in that second."""
    time.sleep(1.0 - time.time() % 1.0 + 0.02)
    for tx in transactions:
        tx()


def _staged(manifest: Manifest) -> list[tuple[int, str, int]]:
    """(order_id, op, commit second) of a window's staged rows, in staged order."""
    rows = sorted(read_table(manifest, TABLE).to_pylist(), key=lambda r: r["_seq"])
    return [
        (r["order_id"] if r["order_id"] is not None else r["_before_order_id"], r["_op"], r["_commit_ts"])
        for r in rows
    ]


def _written_and_deleted(hook: Any, sync: wl.Sync, new_key: int, old_key: int, split: bool) -> Manifest:
    """Transactions insert ``new_key`` and update ``old_key``, then one deletes both, in one
    second; with ``split`` a window's stop falls between them (the rest in a window of its own).
    Returns the window holding the deletes."""

    def write() -> None:
        wl.execute(
            hook,
            f"INSERT INTO customer.{TABLE} (order_id, customer_id, note) VALUES ({new_key}, 1, 'new')",
            f"UPDATE customer.{TABLE} SET note = 'changed' WHERE order_id = {old_key}",
        )

    def delete() -> None:
        wl.execute(hook, f"DELETE FROM customer.{TABLE} WHERE order_id IN ({new_key}, {old_key})")

    if not split:
        _in_one_second(write, delete)
        return sync.capture()
    stop: list[Any] = []
    _in_one_second(
        write, lambda: stop.append(capture_stop_position(sync.runner._open, sync.keyspace)), delete
    )
    committed, _ = sync.store.committed(sync.sync_id)
    assert committed is not None
    sync.store.plan_window(sync.sync_id, WindowKind.CATCHUP, committed, stop[0])
    first = sync.capture()  # resumes the planned window: reads up to that stop
    assert [op for oid, op, _ in _staged(first) if oid == new_key] == ["insert"], _staged(first)
    return sync.capture()


def _merge_all(sync: wl.Sync, root: Path, mode: TargetMode) -> str:
    shape = TargetShape(mode, metadata=mode is not TargetMode.MIRROR)
    targets = {t: dataclasses.replace(target, shape=shape) for t, target in sync.targets(root).items()}
    windows = tuple(
        WindowToMerge(m.window_seq, m.path, (TABLE,) if i == 0 else ()) for i, m in enumerate(sync.manifests)
    )
    merge(spark_session(), MergePlan(sync.sync_id, windows, targets))  # a commit per window
    return str(root / TABLE)


def test_a_key_deleted_in_the_second_it_was_written_ends_deleted_in_every_mode(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    hook = wl.hook_for(vitess, "vitess_same_second")
    create_orders(hook, f"customer.{TABLE}", range(1, 11))
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(
        hook, store, tmp_path / "stage", f"samesec-{uuid.uuid4().hex[:8]}", "customer", [TABLE]
    )
    sync.capture(snapshot=True)

    split = _written_and_deleted(hook, sync, new_key=101, old_key=1, split=True)
    one = _written_and_deleted(hook, sync, new_key=102, old_key=2, split=False)
    # The condition: each pair of transactions committed in one second (else the test proves nothing).
    for windows, keys in (((sync.manifests[1], split), (101, 1)), ((one,), (102, 2))):
        events = [e for w in windows for e in _staged(w) if e[0] in keys]
        assert len(events) == 4 and len({ts for _, _, ts in events}) == 1, events
    assert [op for oid, op, _ in _staged(split) if oid == 101] == ["delete"]
    assert sorted(op for oid, op, _ in _staged(one) if oid == 102) == ["delete", "insert"]

    spark = spark_session()
    want = source_rows(hook, "customer", TABLE)
    assert {r[0] for r in want} == set(range(3, 11))  # the deletes are the second's last state

    mirror = _merge_all(sync, tmp_path / "mirror", TargetMode.MIRROR)
    assert {tuple(r) for r in spark.read.format("delta").load(mirror).collect()} == want

    soft = spark.read.format("delta").load(_merge_all(sync, tmp_path / "soft", TargetMode.SOFT_DELETE))
    rows = soft.collect()
    assert {(r["order_id"], r["customer_id"], r["note"]) for r in rows if not r[P + "deleted"]} == want
    # A key inserted and deleted in one window is a tombstone too (a key deleted at the source).
    assert {r["order_id"] for r in rows if r[P + "deleted"]} == {1, 2, 101, 102}

    hist = spark.read.format("delta").load(_merge_all(sync, tmp_path / "hist", TargetMode.HISTORY)).collect()
    current = {(r["order_id"], r["customer_id"], r["note"]) for r in hist if r[P + "current"]}
    assert current == want, sorted(current - want)
    # Key 101's one version (the first window's) ends deleted at the second it started; key 1's
    # snapshot version ends at that second too (its update and delete are one version's end).
    ended = {r["order_id"]: (r["note"], r[P + "deleted"]) for r in hist if r["order_id"] in (1, 101, 102)}
    assert ended.get(101) == ("new", True) and 102 not in ended, ended
    for key in (1, 101):
        last = max((r for r in hist if r["order_id"] == key), key=lambda r: r[P + "valid_to"])
        assert last[P + "deleted"] and not last[P + "current"], last

    log_path = _merge_all(sync, tmp_path / "log", TargetMode.CHANGELOG)
    log = spark.read.format("delta").load(log_path).collect()
    state: dict[int, tuple[Any, ...]] = {}
    for r in sorted(log, key=lambda r: (r[P + "window_seq"], r[P + "order"])):
        if r[P + "op"] == "delete":
            state.pop(r["order_id"], None)
        else:
            state[r["order_id"]] = (r["order_id"], r["customer_id"], r["note"])
    assert set(state.values()) == want
    for path in (mirror, log_path):  # each window once in each Delta log
        versions = [v for _, v, _ in delta_txns(path)]
        assert len(versions) == len(set(versions)), versions
