"""The merge's per-key order across a reshard: a retired shard's events of a key come before the
events of the shards that replaced it, whatever the shards' names and commit seconds.

A window read across a reshard's switch holds a key's last events on the old shard (up to its
journal) and its first events on a new shard (from the journal on), often in the same commit
second. Ranked by (commit second, shard name) a new shard named before the old one (``-40``
after splitting ``-80``; ``-80`` after merging ``-40`` and ``40-80``) would come first, and
``history`` would keep the old shard's values as the current version, ``changelog`` would list
the changes out of order. Local Spark, no Delta.
"""

from __future__ import annotations

from datetime import datetime, timezone
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

# (old shards, new shards): a split whose first half sorts before the old shard, a merge whose
# new shard sorts before an old one, and a split whose halves sort after it.
RESHARDS = [
    (("-80",), ("-40", "40-80")),
    (("-40", "40-80"), ("-80",)),
    (("80-",), ("80-c0", "c0-")),
]


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()  # the suite's one local session (see test_group_order)


def _staged(spark: SparkSession, old: str, new: str, skew: int) -> DataFrame:
    """Key 5 updated twice on ``old`` up to the switch, then on ``new``: the new shard's first
    change in the old one's last second (``skew`` 0), or a second before it (``skew`` 1: the
    new shard's host clock behind). Staged in binlog order per shard, the old shard first."""
    rows = [
        ("update", old, T0, 1, 5, "a", 5),
        ("update", old, T0 + 1, 2, 5, "b", 5),
        ("update", new, T0 + 1 - skew, 3, 5, "c", 5),
        ("update", new, T0 + 2, 4, 7, "x", 7),  # another key, on the new shard only
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _case(olds: tuple[str, ...], news: tuple[str, ...]) -> tuple[str, str, dict[str, tuple[str, ...]]]:
    old, new = olds[-1], news[0]
    return old, new, {o: news for o in olds}


@pytest.mark.parametrize("skew", [0, 1])
@pytest.mark.parametrize(("olds", "news"), RESHARDS)
def test_a_retired_shards_events_come_before_its_successors(
    spark: SparkSession,
    olds: tuple[str, ...],
    news: tuple[str, ...],
    skew: int,
) -> None:
    old, new, retired = _case(olds, news)
    staged = _staged(spark, old, new, skew)

    mirror = window_rows.last_per_key(staged, KEYS, DATA, None, retired, covered={}, meta=True)
    assert {r["id"]: r["v"] for r in mirror.collect()} == {5: "c", 7: "x"}

    shape = TargetShape(TargetMode.HISTORY)
    out = history.versions(staged, None, KEYS, DATA, shape, 9, "t", covered={}, retired=retired)
    rows = out.where(out[history.ACTION] == history.INSERT).collect()
    current = {r["id"]: r["v"] for r in rows if r[shape.name("current")]}
    assert current == {5: "c", 7: "x"}
    # The new shard continues the old one's holding, so b and c, one second, are one version
    # (one version per key, shard and second); intervals contiguous, never ending before they start.
    life = sorted(
        (r[shape.name("valid_from")], r[shape.name("valid_to")], r["v"]) for r in rows if r["id"] == 5
    )
    start, switch = (datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None) for t in (T0, T0 + 1))
    assert life == [(start, switch, "a"), (switch, None, "c")], life

    log_shape = TargetShape(TargetMode.CHANGELOG)
    log = shapes.changelog_rows(staged, KEYS, SCHEMA_OUT, log_shape, 9, snapshot=False, retired=retired)
    by_order = sorted((r[log_shape.name("order")], r["v"]) for r in log.collect() if r["id"] == 5)
    assert [v for _, v in by_order] == ["a", "b", "c"]


def test_a_retired_shard_that_deleted_the_key_hands_nothing_on(spark: SparkSession) -> None:
    """Key 5 inserted and deleted on the old shard just before its journal, inserted again on a
    new shard after the switch (window 1), deleted there (window 2). Window 2's look-back has the
    old shard's events (within seconds of its journal) but not the new shard's insert (older
    than the look-back's seconds on that shard). The delete ends the version window 1 merged:
    the old shard's deletion is not the new shard's holding (found by test_reshard's CI run: the
    version stayed current)."""
    old, new, retired = "0", "80-", {"0": ("-80", "80-")}
    first = [
        ("insert", old, T0, 5, "a", None),
        ("delete", old, T0 + 1, 5, None, 5),
        ("insert", new, T0 + 10, 5, "b", None),
    ]
    second = [("delete", new, T0 + 20, 5, None, 5)]
    covered = {"-80": T0 + 20, "80-": T0 + 20}
    shape, table = TargetShape(TargetMode.HISTORY), HistoryTable()
    w1 = spark.createDataFrame(numbered(first), SCHEMA)
    merged = history.versions(w1, None, KEYS, DATA, shape, 1, "t", covered=covered, retired=retired)
    table.apply(merged.collect())
    assert table.current() == {5: ["b"]}, table.versions

    staged = spark.createDataFrame(numbered(second), SCHEMA)
    context = spark.createDataFrame(numbered(first, back=1)[:2], SCHEMA)
    out = history.versions(staged, context, KEYS, DATA, shape, 2, "t", covered=covered, retired=retired)
    table.apply(out.collect())
    assert table.current() == {5: []}, table.versions
    assert table.lives()[5] == [("a", False, True), ("b", False, True)], table.lives()
    # The mirror's rule (each new shard's last event) agrees: the key is gone.
    mirror = window_rows.last_per_key(staged, KEYS, DATA, context, retired, covered=covered)
    assert [(r["id"], r["_op"]) for r in mirror.collect()] == [(5, "delete")]
