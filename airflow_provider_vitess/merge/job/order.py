"""The merge's per-key order of events: one that does not depend on which process staged an event.

A window read by one process has one ``_seq`` over all its shards (the k-way merge of
``vstream/ordering.py``); a window read by shard groups (``capture/groups.py``) has one ``_seq``
per group, each from 1. Both keep every shard's binlog order, and that is all this order takes
from ``_seq``; across shards it takes each event's commit second and shard. docs/design.md,
"Shard groups", has the proof; ``tests/unit/test_group_order.py`` checks it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.lookback import SEQ_SHIFT
from airflow_provider_vitess.staging import arrow_types as A

_SHARD, _ORD = "_shard", "_ord"  # as in .apply's per-key frame


def col(name: str) -> Column:
    return F.col(q(name))


def key_order(events: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``_ord`` becomes each key's events' rank in the merge's order (1, 2, ...), an order that does
    not depend on which process staged an event (docs/design.md, "Shard groups"):

    * the window first (context windows before the window itself: their ``_seq`` are shifted by
      :data:`.lookback.SEQ_SHIFT` per window back, so ``floor(_ord / 2 SEQ_SHIFT)`` is -k);
    * then the commit second made non-decreasing along the key's events of each shard (the running
      maximum in the shard's binlog order), then the shard name;
    * then the staged order, which within one shard is its binlog order in every staging.

    Two events of one shard keep their binlog order (the running maximum never decreases along
    it), so per shard nothing changes; across shards the order is the one the single-process
    k-way merge gives (commit second, shard, position) wherever a shard's commit seconds do not go
    backwards, and is the same whether the shards were staged by one process or by several (shard
    groups): each input is a property of one shard's events."""
    win = F.floor(col(_ORD) / F.lit(2 * SEQ_SHIFT))
    by_key = [col(k) for k in keys]
    # One partitioning (by key) for both windows: the running maximum of (shard, window, second)
    # in (shard, window, order) is the running maximum of the second within the current shard.
    along = (
        Window.partitionBy(*by_key)
        .orderBy(col(_SHARD), col("_win"), col(_ORD))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    running = F.max(F.struct(col(_SHARD), col("_win"), col(A.COMMIT_TS).alias("ts"))).over(along)
    ranked = Window.partitionBy(*by_key).orderBy(col("_win"), col("_kts"), col(_SHARD), col(_ORD))
    return (
        events.withColumn("_win", win)
        .withColumn("_kts", running["ts"])
        .withColumn(_ORD, F.row_number().over(ranked).cast(T.LongType()))
        .drop("_win", "_kts")
    )
