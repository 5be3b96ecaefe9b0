"""The merge's per-key order does not depend on which process staged an event (shard groups).

The same seeded events are staged twice: as one part, with ``_seq`` from the single-process
k-way merge (:class:`~airflow_provider_vitess.vstream.ordering.ShardMerger`, all shards), and as
one part per shard group (each group's own merger over its shards only, ``_seq`` from 1 again).
The merge's results must be identical: the mirror's last event per key (with the deciding event's
commit time and change, what ``soft_delete`` writes), ``history``'s versions and ``changelog``'s
rows with their per-key order. And where each shard's commit seconds never go backwards, the
per-key order is exactly the single-process ``_seq`` order (``order.key_order``'s claim). The
events move keys between shards of different groups in both orders, within a second and across
seconds, delete and re-insert a key in one second, and change keys. Local Spark, no Delta.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import history, order, shapes, window_rows
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.vstream.ordering import ShardMerger, ShardTransaction
from airflow_provider_vitess.vstream.spill import SpillableEvents
from tests.support.delta_check import spark_session
from tests.support.staged_frames import SCHEMA

SHARDS = ("-40", "40-80", "80-c0", "c0-")
LAYOUT = (("-40", "40-80"), ("80-c0", "c0-"))  # two groups of two shards
Row = tuple[str, str, int, int | None, str | None, int | None]  # op, shard, ts, id, v, before id


@pytest.fixture(scope="module")
def spark() -> Any:
    # The suite's one local session (Delta's jars on it): a session of its own, started first in
    # an xdist worker, would leave that worker's JVM without them for every later Delta test.
    return spark_session()


def _workload(seed: int, monotone: bool) -> dict[str, list[tuple[int, list[Row]]]]:
    """Per shard, its transactions in binlog order: (commit second, rows). Keys live on one
    shard at a time; a move is a delete on one shard and an insert on another (either first,
    same second or not); some keys are deleted and inserted again in one second, some change."""
    rng = random.Random(seed)
    where: dict[int, str] = {}
    txns: dict[str, list[tuple[int, list[Row]]]] = {s: [] for s in SHARDS}
    clock = {s: 1_800_000_000 for s in SHARDS}
    next_id = 1

    def commit(shard: str, rows: list[Row], same_second: bool = False) -> None:
        if not same_second:
            clock[shard] += rng.choice((0, 0, 1, 2))
        ts = clock[shard] if monotone else clock[shard] - rng.choice((0, 0, 0, 1, 3))
        txns[shard].append((ts, [(op, shard, ts, k, v, b) for op, _, _, k, v, b in rows]))

    for step in range(120):
        choice = rng.random()
        if choice < 0.25 or not where:
            shard = rng.choice(SHARDS)
            where[next_id] = shard
            commit(shard, [("insert", shard, 0, next_id, f"i{step}", None)])
            next_id += 1
            continue
        key = rng.choice(sorted(where))
        shard = where[key]
        if choice < 0.45:
            commit(shard, [("update", shard, 0, key, f"u{step}", key)])
        elif choice < 0.7:  # a move to another shard: its halves in either order
            other = rng.choice([s for s in SHARDS if s != shard])
            halves = [
                (shard, ("delete", shard, 0, None, None, key)),
                (other, ("insert", other, 0, key, f"m{step}", None)),
            ]
            if rng.random() < 0.5:
                halves.reverse()
            for s, row in halves:
                # Align the two shards' clocks now and then: the halves in one second.
                if rng.random() < 0.5:
                    clock[s] = max(clock.values())
                commit(s, [row], same_second=True)
            where[key] = other
        elif choice < 0.8:  # deleted and inserted again in the same second
            commit(shard, [("delete", shard, 0, None, None, key)])
            commit(shard, [("insert", shard, 0, key, f"r{step}", None)], same_second=True)
        elif choice < 0.9:  # the key changes
            commit(shard, [("update", shard, 0, next_id, f"k{step}", key)])
            del where[key]
            where[next_id] = shard
            next_id += 1
        else:
            commit(shard, [("delete", shard, 0, None, None, key)])
            del where[key]
    return txns


def _merged_order(txns: dict[str, list[tuple[int, list[Row]]]], shards: tuple[str, ...]) -> list[Row]:
    """The rows as one process over ``shards`` stages them: its k-way merge's order."""
    merger = ShardMerger([("ks", s) for s in shards])
    units: dict[int, list[Row]] = {}
    released: list[ShardTransaction] = []
    for shard in shards:  # each shard's stream in binlog order; arrival order does not matter
        for ts, rows in txns[shard]:
            unit = ShardTransaction("ks", shard, ts, ts, 0, SpillableEvents(), None, len(rows))
            units[id(unit)] = rows
            released.extend(merger.push(unit))
    for shard in shards:
        released.extend(merger.mark_done(("ks", shard)))
    released.extend(merger.drain())
    return [row for unit in released for row in units[id(unit)]]


def _frame(spark: SparkSession, parts: list[list[Row]]) -> DataFrame:
    """One staged frame from ``parts``, each with ``_seq`` from 1 in its own order."""
    data: list[tuple[Any, ...]] = []
    for rows in parts:
        for seq, (op, shard, ts, key, v, before) in enumerate(rows, start=1):
            data.append((op, shard, ts, seq, key, v, before))
    return spark.createDataFrame(data, SCHEMA)


def _stagings(spark: SparkSession, seed: int, monotone: bool) -> tuple[DataFrame, DataFrame, list[Row]]:
    txns = _workload(seed, monotone)
    one = _merged_order(txns, SHARDS)
    groups = [_merged_order(txns, group) for group in LAYOUT]
    assert sorted(one) == sorted(r for g in groups for r in g)  # the same events
    return _frame(spark, [one]), _frame(spark, groups), one


def _sorted(frame: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_one_part_and_group_parts_merge_alike(spark: SparkSession, seed: int) -> None:
    single, grouped, _ = _stagings(spark, seed, monotone=seed % 2 == 0)
    keys, data = ["id"], ["id", "v"]

    def mirror(staged: DataFrame) -> list[tuple[Any, ...]]:
        out = window_rows.last_per_key(
            staged, keys, data, covered={s: 2_000_000_000 for s in SHARDS}, meta=True
        )
        return _sorted(out)

    assert mirror(single) == mirror(grouped)
    assert len(mirror(single)) > 30  # keys the window touched

    shape = TargetShape(TargetMode.HISTORY)

    def versions(staged: DataFrame) -> list[tuple[Any, ...]]:
        out = history.versions(staged, None, keys, data, shape, 7, "t", covered={})
        return _sorted(out.drop(shape.name("synced_at")))

    assert versions(single) == versions(grouped)

    log_shape = TargetShape(TargetMode.CHANGELOG)
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])

    def changelog(staged: DataFrame) -> list[tuple[Any, ...]]:
        out = shapes.changelog_rows(staged, keys, schema, log_shape, 7, snapshot=False)
        return _sorted(out.drop(log_shape.name("synced_at")))

    assert changelog(single) == changelog(grouped)


@pytest.mark.parametrize("seed", [11, 12])
def test_with_monotone_seconds_the_order_is_the_single_process_seq(spark: SparkSession, seed: int) -> None:
    single, grouped, _ = _stagings(spark, seed, monotone=True)
    keys, data = ["id"], ["id", "v"]
    for staged in (single, grouped):
        events = order.key_order(window_rows.key_events(staged, keys, data), keys)
        ranked = {(r["id"], r["_shard"], r["_commit_ts"], r["_ord"]) for r in events.collect()}
        # The single-process staging's own order of each key's events, by _seq.
        raw = window_rows.key_events(single, keys, data).collect()
        by_key: dict[int, list[Any]] = {}
        for r in sorted(raw, key=lambda r: r["_ord"]):
            by_key.setdefault(r["id"], []).append((r["_shard"], r["_commit_ts"]))
        want = {(k, s, ts, i) for k, evs in by_key.items() for i, (s, ts) in enumerate(evs, start=1)}
        assert ranked == want
