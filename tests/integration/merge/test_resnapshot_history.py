"""A re-snapshot never erases a ``history``, ``soft_delete`` or ``changelog`` table's past (issue 38
item 5).

On the real vtgate, merged through the job into real Delta tables: a table's keys are updated
and deleted over two catch-ups, then a column's type changes at the source (INT -> VARCHAR);
the catch-up that reads it is refused by the merge, whose remedy is a re-snapshot; the
re-snapshot is merged, then one more catch-up. Afterwards, in ``history``: every version closed
before the re-snapshot is still there with its values (``qty`` as text now), exactly one current
version per live key and it equals ``SELECT *``, the keys deleted are ended, a key the copy shows
unchanged keeps its version, and the versions of a key never overlap; in ``soft_delete``: the live
rows equal ``SELECT *`` and every key deleted is a tombstone (earlier tombstones as they were); in
``changelog``: every row logged before is still there (``qty`` as text), the copy's rows are
appended, and the log replayed is ``SELECT *`` (its re-snapshot's append failed on the log's INT
column, run after run).
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import MergeSchemaError
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.staging import Manifest
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess
from tests.support.mode_oracles import replay_changelog

pytestmark = pytest.mark.integration

TABLE = "resnap_items"
P = "_vitess_"
MODES = (TargetMode.HISTORY, TargetMode.SOFT_DELETE, TargetMode.CHANGELOG)


def _targets(sync: wl.Sync, root: Path) -> dict[TargetMode, dict[str, TableTarget]]:
    return {
        mode: {
            t: dataclasses.replace(
                target, path=str(root / mode.value / t), shape=TargetShape(mode, metadata=True)
            )
            for t, target in sync.targets(root).items()
        }
        for mode in MODES
    }


def _merge(
    spark: Any, sync: wl.Sync, targets: dict[str, TableTarget], *windows: tuple[Manifest, bool]
) -> None:
    chosen = tuple(WindowToMerge(m.window_seq, m.path, (TABLE,) if snap else ()) for m, snap in windows)
    merge(spark, MergePlan(sync.sync_id, chosen, targets))


def _rows(spark: Any, path: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.format("delta").load(path).collect()]


def _data(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    return {r["id"]: (r["id"], r["qty"], r["note"]) for r in rows}


def _source(hook: Any) -> dict[int, tuple[Any, ...]]:
    _, rows = wl.select_all(hook, "commerce", TABLE)
    return {r[0]: tuple(r) for r in rows}


def test_a_resnapshot_after_a_type_change_keeps_the_past(vitess: LocalVitess, tmp_path: Path) -> None:
    hook = wl.hook_for(vitess, "vitess_resnap")
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} (id INT NOT NULL PRIMARY KEY, qty INT, note VARCHAR(32))",
        f"INSERT INTO commerce.{TABLE} VALUES " + ", ".join(f"({i}, {10 * i}, 'n{i}')" for i in range(1, 8)),
    )
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(hook, store, tmp_path / "stage", f"resnap_{uuid.uuid4().hex[:8]}", "commerce", [TABLE])
    spark = spark_session()
    snapshot = sync.capture(snapshot=True)
    targets = _targets(sync, tmp_path / "delta")
    wl.execute(
        hook,
        f"UPDATE commerce.{TABLE} SET qty = 11 WHERE id = 1",
        f"UPDATE commerce.{TABLE} SET note = 'm2' WHERE id = 2",
        f"DELETE FROM commerce.{TABLE} WHERE id = 3",
    )
    first = sync.capture()
    wl.execute(
        hook,
        f"UPDATE commerce.{TABLE} SET qty = 12 WHERE id = 1",
        f"DELETE FROM commerce.{TABLE} WHERE id = 4",
    )
    second = sync.capture()
    for mode in MODES:
        _merge(spark, sync, targets[mode], (snapshot, True), (first, False), (second, False))
    before = {mode: _rows(spark, targets[mode][TABLE].path) for mode in MODES}
    closed_before = [r for r in before[TargetMode.HISTORY] if not r[P + "current"]]
    assert sorted((r["id"], r["qty"], r["note"], r[P + "deleted"]) for r in closed_before) == [
        (1, 10, "n1", False),
        (1, 11, "n1", False),
        (2, 20, "n2", False),
        (3, 30, "n3", True),
        (4, 40, "n4", True),
    ]
    tombstones_before = {r["id"]: r for r in before[TargetMode.SOFT_DELETE] if r[P + "deleted"]}
    assert sorted(tombstones_before) == [3, 4]
    log_before = before[TargetMode.CHANGELOG]
    assert len(log_before) == 7 + 3 + 2  # the snapshot's rows, then one per change

    # The type change, read by a catch-up whose merge is refused with the remedy: a re-snapshot.
    wl.execute(
        hook,
        f"ALTER TABLE commerce.{TABLE} MODIFY qty VARCHAR(16)",
        f"UPDATE commerce.{TABLE} SET qty = '12 boxes' WHERE id = 1",
        f"DELETE FROM commerce.{TABLE} WHERE id = 5",
        f"INSERT INTO commerce.{TABLE} VALUES (8, '80', 'n8')",
    )
    refused = sync.capture()
    for mode in MODES:
        with pytest.raises(MergeSchemaError, match=r"resnapshot_tables.*" + TABLE):
            _merge(spark, sync, targets[mode], (refused, False))
    resnapshot = sync.capture(snapshot=True)  # what the remedy says; the refused window is not merged
    wl.execute(hook, f"UPDATE commerce.{TABLE} SET note = 'after' WHERE id = 2")
    after = sync.capture()
    for mode in MODES:
        _merge(spark, sync, targets[mode], (resnapshot, True), (after, False))

    source = _source(hook)
    assert sorted(source) == [1, 2, 6, 7, 8]
    _check_history(_rows(spark, targets[TargetMode.HISTORY][TABLE].path), closed_before, source)
    _check_soft_delete(_rows(spark, targets[TargetMode.SOFT_DELETE][TABLE].path), tombstones_before, source)
    _check_changelog(_rows(spark, targets[TargetMode.CHANGELOG][TABLE].path), log_before, source)


def _check_history(rows: list[dict[str, Any]], closed_before: list[dict[str, Any]], source: dict) -> None:
    # Every version closed before the re-snapshot, unchanged (qty now text: '10' for 10).
    def plain(r: dict[str, Any]) -> tuple[Any, ...]:
        qty = None if r["qty"] is None else str(r["qty"])
        return (r["id"], qty, r["note"], r[P + "valid_from"], r[P + "valid_to"], r[P + "deleted"])

    kept = {plain(r) for r in rows if not r[P + "current"]}
    missing = [plain(r) for r in closed_before if plain(r) not in kept]
    assert not missing, f"versions closed before the re-snapshot are gone: {missing}"
    current = [r for r in rows if r[P + "current"]]
    assert sorted(r["id"] for r in current) == sorted(source), "one current version per live key"
    assert _data(current) == source
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(r["id"], []).append(r)
    for key, versions in by_key.items():
        versions.sort(key=lambda r: (r[P + "valid_from"] is not None, r[P + "valid_from"] or 0))
        for a, b in itertools.pairwise(versions):
            assert a[P + "valid_to"] is not None and b[P + "valid_from"] is not None, (key, versions)
            assert a[P + "valid_to"] <= b[P + "valid_from"], f"key {key}: versions overlap: {versions}"
        for v in versions:
            assert (
                v[P + "valid_to"] is None
                or v[P + "valid_from"] is None
                or v[P + "valid_from"] <= v[P + "valid_to"]
            )
    # Deleted keys are ended: 3 and 4 before the re-snapshot, 5 found gone by it.
    for key in (3, 4, 5):
        assert by_key[key][-1][P + "deleted"] and not by_key[key][-1][P + "current"], by_key[key]
    # 6 and 7, unchanged since the first snapshot: their copied version stays current.
    for key in (6, 7):
        assert [(v["qty"], v[P + "valid_from"], v[P + "current"]) for v in by_key[key]] == [
            (str(10 * key), None, True)
        ]
    # 1: its value changed between the sync's last merged change and the copy: a new version.
    assert [v["qty"] for v in by_key[1]] == ["10", "11", "12", "12 boxes"]
    assert [v["note"] for v in by_key[2]] == ["n2", "m2", "after"]  # unchanged by the copy, then updated
    assert [(v["qty"], v[P + "current"]) for v in by_key[8]] == [("80", True)]


def _check_soft_delete(
    rows: list[dict[str, Any]], tombstones_before: dict[int, dict[str, Any]], source: dict
) -> None:
    live = [r for r in rows if not r[P + "deleted"]]
    assert _data(live) == source
    tombstones = {r["id"]: r for r in rows if r[P + "deleted"]}
    assert sorted(tombstones) == [3, 4, 5], "every deleted key stays a tombstone"
    for key, was in tombstones_before.items():
        assert tombstones[key][P + "deleted_at"] == was[P + "deleted_at"] is not None
        assert (tombstones[key]["qty"], tombstones[key]["note"]) == (str(was["qty"]), was["note"])
    assert tombstones[5][P + "deleted_at"] is not None and (tombstones[5]["qty"], tombstones[5]["note"]) == (
        "50",
        "n5",
    )
    assert len(rows) == len({r["id"] for r in rows}) == 8


def _check_changelog(rows: list[dict[str, Any]], log_before: list[dict[str, Any]], source: dict) -> None:
    """The log before the re-snapshot stays, every row of it (``qty`` as text now); the copy's
    rows and the change after it are appended; replayed, the log is ``SELECT *``."""

    def plain(r: dict[str, Any]) -> tuple[Any, ...]:
        qty = None if r["qty"] is None else str(r["qty"])
        return (r["id"], qty, r["note"], r[P + "op"], r[P + "window_seq"], r[P + "order"])

    kept = Counter(plain(r) for r in rows)
    missing = [plain(r) for r in log_before if kept[plain(r)] < 1]
    assert not missing, f"log rows written before the re-snapshot are gone: {missing}"
    assert len(rows) == len(log_before) + len(source) + 1  # the copy's rows, then the one update
    replayed = {r["id"]: (r["id"], r["qty"], r["note"]) for r in replay_changelog(TABLE, rows)}
    assert replayed == source
