"""The merge's per-key rules against the source across a reshard, on seeded runs of
:mod:`tests.support.reshard_model`: its windows merged in order, the ``history`` table's current
versions and the mirror's rows are the source's rows at the end, for every key of every scenario.

``make test`` runs the fixed seed below (4005 kept ``history``'s version of a key deleted across
the switch current before ``history._heirs`` took an old shard's deletion for its successor's
holding); ``make soak-reshard-model`` draws ``RESHARD_MODEL_SEEDS`` more. Local Spark, no Delta.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess.merge.job import history, window_rows
from tests.support import reshard_model as model
from tests.support.delta_check import spark_session
from tests.support.history_table import SHAPE, HistoryTable
from tests.support.staged_frames import SCHEMA

KEYS, DATA = ["id"], ["id", "v"]
FIXED = [4005]
SOAK = int(os.environ.get("RESHARD_MODEL_SEEDS", "0"))
FIRST = int(os.environ.get("RESHARD_MODEL_FIRST", "5000"))


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()  # the suite's one local session (see test_group_order)


def _check(spark: SparkSession, seed: int) -> None:
    """The seed's windows merged in order into ``history`` and the mirror's rows; both end as the
    source does. (Checked at the end: at a stop between a move's two commits the source itself
    holds the row twice or not at all for a moment.)"""
    run = model.draw(seed)
    table, mirror = HistoryTable(copied=run.copied), dict[int, str | None](run.copied)
    for w in range(len(run.windows)):
        rows = model.staged(run, w)
        if not rows:
            continue
        staged = spark.createDataFrame(rows, SCHEMA)
        earlier = model.context(run, w)
        context = spark.createDataFrame(earlier, SCHEMA) if earlier else None
        retired, covered = model.retired(run, w), model.covered(run, w)
        out = history.versions(staged, context, KEYS, DATA, SHAPE, w + 1, "t", covered, retired)
        table.apply(out.collect())
        last = window_rows.last_per_key(staged, KEYS, DATA, context, retired, covered=covered)
        for r in last.collect():
            mirror[r["id"]] = r["v"] if r["_op"] == window_rows.UPSERT else None
    want = {k: [v] for k, v in run.final.items() if v is not None}
    current = {k: vs for k, vs in table.current().items() if vs}
    keys = set(current) | set(want)
    wrong = sorted((k, current.get(k), want.get(k)) for k in keys if current.get(k) != want.get(k))
    assert not wrong, (seed, "history's current versions (key, history, source):", wrong[:5])
    kept = {k: [v] for k, v in mirror.items() if v is not None}
    assert kept == want, (seed, "mirror", sorted(set(kept) ^ set(want))[:5])


@pytest.mark.parametrize("seed", FIXED)
def test_history_and_the_mirror_end_as_the_source_across_a_reshard(spark: SparkSession, seed: int) -> None:
    _check(spark, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(FIRST, FIRST + SOAK))
def test_more_seeds(spark: SparkSession, seed: int) -> None:
    _check(spark, seed)
