"""A key inserted (or updated) and then deleted by two transactions of one commit second on one
shard: the second ends with the key gone, so no version of it may stay current.

``history`` keeps one version per key, shard and commit second. When a window's stop falls
between the two transactions, the earlier window merges the insert as a current version and the
next one brings the delete, with the insert in its look-back context. Counted as one group (one
shard, one second) the two made a group that ends with the key gone and had no key before it, so
nothing closed the version the earlier window wrote: the delete was lost. Also in one window, and
staged by shard groups. Local Spark, no Delta (``tests/integration/merge/test_same_second.py`` runs the
same shapes through the real cluster and Delta).
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from airflow_provider_vitess.merge.job import history, shapes, window_rows
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from tests.support.delta_check import spark_session
from tests.support.history_table import HistoryTable
from tests.support.staged_frames import SCHEMA, SCHEMA_OUT, numbered

T0 = 1_800_000_000
KEYS, DATA = ["id"], ["id", "v"]
SHAPE = TargetShape(TargetMode.HISTORY)
COVERED = {"-80": T0 + 100, "80-": T0 + 100}


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()  # the suite's one local session (see test_group_order)


def _frame(spark: SparkSession, rows: Staged, back: int = 0) -> DataFrame:
    """Staged rows (op, shard, ts, id, v, before id) with ``_seq`` 1, 2, ...; ``back``: a
    context window that many windows before the merged one (the look-back's shifted ``_seq``)."""
    return spark.createDataFrame(numbered(rows, back), SCHEMA)


# Key 5 inserted and deleted in one second (two transactions); key 6 updated and deleted in one
# second; key 7 updated in the first transaction and again in the second (stays, one version).
Staged = list[tuple[Any, ...]]
FIRST: Staged = [
    ("insert", "-80", T0 + 1, 5, "a", None),
    ("update", "-80", T0 + 1, 6, "b", 6),
    ("update", "-80", T0 + 1, 7, "c", 7),
]
SECOND: Staged = [
    ("delete", "-80", T0 + 1, 5, None, 5),
    ("delete", "-80", T0 + 1, 6, None, 6),
    ("update", "-80", T0 + 1, 7, "d", 7),
]


def _history(spark: SparkSession, windows: list[Staged]) -> dict[int, list[tuple[Any, ...]]]:
    """The windows merged one after another into an in-memory ``history`` table (each with the
    windows before it as its look-back): per key, its versions (v, current, deleted). Key 6 and 7
    were copied by a snapshot."""
    table = HistoryTable(copied={6: "s6", 7: "s7"})
    for i, rows in enumerate(windows):
        context = None
        if i:
            context = _frame(spark, [r for w in windows[:i] for r in w], back=1)
        staged = _frame(spark, rows)
        out = history.versions(staged, context, KEYS, DATA, SHAPE, i + 1, "t", covered=COVERED)
        table.apply(out.collect())
    return table.lives()


@pytest.mark.parametrize("split", [False, True], ids=["one window", "split by a window stop"])
def test_a_key_deleted_in_the_second_it_was_written_is_not_current(spark: SparkSession, split: bool) -> None:
    windows = [FIRST, SECOND] if split else [FIRST + SECOND]
    got = _history(spark, windows)
    current = {k: [v for v, cur, _ in vs if cur] for k, vs in got.items()}
    assert current.get(5, []) == [] and current[6] == [] and current[7] == ["d"], got
    # Key 6's last version ends deleted; key 5 has no version left current (split: its one
    # version, the first window's, ended by the delete).
    assert got[6][-1] == ("s6", False, True) if not split else got[6][-1][1:] == (False, True), got
    if split:
        assert got[5] == [("a", False, True)], got
    else:
        assert 5 not in got, got


@pytest.mark.parametrize("split", [False, True], ids=["one window", "split by a window stop"])
def test_the_other_modes_end_with_the_seconds_last_state(spark: SparkSession, split: bool) -> None:
    """mirror and soft_delete take each key's last event, changelog lists both transactions."""
    staged = _frame(spark, SECOND if split else FIRST + SECOND)
    context = _frame(spark, FIRST, back=1) if split else None
    last = window_rows.last_per_key(staged, KEYS, DATA, context, covered=COVERED, meta=True).collect()
    assert {r["id"]: (r["_op"], r["v"]) for r in last} == {
        5: ("delete", None),
        6: ("delete", None),
        7: ("upsert", "d"),
    }
    log_shape = TargetShape(TargetMode.CHANGELOG)
    log = shapes.changelog_rows(staged, KEYS, SCHEMA_OUT, log_shape, 2, snapshot=False).collect()
    ops = sorted((r["id"], r[log_shape.name("order")], r[log_shape.name("op")]) for r in log)
    want = [
        (5, 1, "insert"),
        (5, 2, "delete"),
        (6, 1, "update"),
        (6, 2, "delete"),
        (7, 1, "update"),
        (7, 2, "update"),
    ]
    assert ops == (want if not split else [(5, 1, "delete"), (6, 1, "delete"), (7, 1, "update")])


def test_grouped_staging_gives_the_same_versions(spark: SparkSession) -> None:
    """Two shard groups staged a window each with ``_seq`` from 1: key 5 on -80, key 8 inserted and
    deleted in one second on 80-; the versions are those of the same events staged as one part."""
    other = [("insert", "80-", T0 + 1, 8, "x", None), ("delete", "80-", T0 + 1, 8, None, 8)]
    one = history.versions(
        _frame(spark, FIRST + SECOND + other), None, KEYS, DATA, SHAPE, 1, "t", covered=COVERED
    )
    grouped_rows = [
        (op, s, ts, i, k, v, b)
        for part in (FIRST + SECOND, other)
        for i, (op, s, ts, k, v, b) in enumerate(part, 1)
    ]
    grouped = spark.createDataFrame(grouped_rows, SCHEMA)
    two = history.versions(grouped, None, KEYS, DATA, SHAPE, 1, "t", covered=COVERED)
    drop = SHAPE.name("synced_at")
    assert sorted(map(tuple, one.drop(drop).collect()), key=repr) == sorted(
        map(tuple, two.drop(drop).collect()), key=repr
    )
    assert not any(r["id"] == 8 for r in one.collect())
