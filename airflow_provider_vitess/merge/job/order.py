"""The merge's per-key order of events: one that does not depend on which process staged an event.

A window read by one process has one ``_seq`` over all its shards (the k-way merge of
``vstream/ordering.py``); a window read by shard groups (``capture/groups.py``) has one ``_seq``
per group, each from 1. Both keep every shard's binlog order, and that is all this order takes
from ``_seq``; across shards it takes each event's commit second and shard. docs/design.md,
"Shard groups", has the proof; ``tests/job/test_group_order.py`` checks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.lookback import SEQ_SHIFT
from airflow_provider_vitess.staging import arrow_types as A

_SHARD, _ORD, _CTX = "_shard", "_ord", "_ctx"  # as in .window_rows' per-key frame (rows imports this module)
# The commit second an event is ordered by (key_order's output): its own, made non-decreasing
# along its shard's events of the key in its window (and after a retired predecessor's). It
# depends on that window's events only, so a rerun or a later window's look-back computes the
# same value; ``history``'s versions start and end at it.
ORDER_TS = "_order_ts"
NEXT = "_next"  # + a column: its value at the key's next event (key_order's ``following``)
# The window an event belongs to (key_order's ``window=True``): 0 for the window itself, -k for the
# look-back's k-th context window before it.
WINDOW = "_win"


def col(name: str) -> Column:
    return F.col(q(name))


def key_order(
    events: DataFrame,
    keys: Sequence[str],
    retired: Mapping[str, Sequence[str]] | None = None,
    following: Sequence[str] = (),
    window: bool = False,
    copies_at: Mapping[str, int] | None = None,
) -> DataFrame:
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
    groups): each input is a property of one shard's events. The second it orders by is kept as
    :data:`ORDER_TS`. Events with ``_ctx`` (the look-back's context, :mod:`.lookback`) count only
    for keys the window itself touches: the others' are dropped (in the same pass). ``following``:
    columns whose value at the key's next event is wanted, as ``_next<column>`` (NULL at its last
    event), taken in the pass that ranks (ordering by the rank again would sort once more).

    ``retired`` (a reshard's old shard -> the shards that replaced it, :mod:`.window_rows`): an old
    shard's events of a key come before its successors' (its journal ends its stream, theirs start
    there), which neither the seconds nor the names say: a successor's second is raised to the old
    shard's last second of the key (its host's clock may be behind) and, in one second, the old
    shard comes first (``-40`` would sort before ``-80``, which it replaced).

    ``window``: keep each event's window as :data:`WINDOW` (it may also be one of ``following``).

    ``copies_at`` (a snapshot copied by shard groups: per shard, the source second its group's
    copy ended, :func:`.lookback.copy_ends`): a copied row (commit second 0) is ranked as of its
    group's end, before the commit second: the groups' copies end apart, and a key held by two
    groups' shards at once there is a row that moved after the earlier group's end
    (:mod:`.conflicts`), so the later group's state is the newer."""
    win = F.floor(col(_ORD) / F.lit(2 * SEQ_SHIFT))
    by_key = [col(k) for k in keys]
    # One partitioning and ordering (by key; shard, window, order) for every window function but the
    # rank (one sort): the running maximum of (shard, window, second) is the running maximum of the
    # second within the current shard; an old shard's last second of the key and whether the
    # window touches the key are over the whole partition.
    along = Window.partitionBy(*by_key).orderBy(col(_SHARD), col(WINDOW), col(_ORD))
    running = F.max(F.struct(col(_SHARD), col(WINDOW), col(A.COMMIT_TS).alias("ts"))).over(
        along.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    whole = along.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    kts, gen = running["ts"], F.lit(1)
    lead: Column | None = None
    if copies_at:
        at = F.lit(0).cast(T.LongType())
        for s, second in copies_at.items():
            at = F.when(col(_SHARD) == s, F.lit(second)).otherwise(at)
        eff = F.when(col(A.COMMIT_TS) == 0, at).otherwise(col(A.COMMIT_TS))
        lead = F.max(F.struct(col(_SHARD), col(WINDOW), eff.alias("ts"))).over(
            along.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )["ts"]
    for old, new in (retired or {}).items():
        # The old shard's last window of the key and its latest second there: a floor for its
        # successors' events of that window (an earlier window comes first anyway).
        old_last = F.max(F.when(col(_SHARD) == old, F.struct(col(WINDOW), col(A.COMMIT_TS).alias("ts"))))
        old_last = old_last.over(whole)
        floor = F.when(col(_SHARD).isin(list(new)) & (old_last[WINDOW] == col(WINDOW)), old_last["ts"])
        kts = F.greatest(kts, floor)
        gen = F.when(col(_SHARD) == old, F.lit(0)).otherwise(gen)
    ordered = events.withColumn(WINDOW, win).withColumn(ORDER_TS, kts).withColumn("_gen", gen)
    ordered = ordered.withColumn("_lead", F.lit(0) if lead is None else lead)
    if _CTX in events.columns:  # only the keys the window touches: not those of context events only
        touched = F.max(F.when(col(_CTX), 0).otherwise(1)).over(whole) == 1
        ordered = ordered.withColumn("_touched", touched).where(col("_touched")).drop("_touched")
    rank_by = (col(WINDOW), col("_lead"), col(ORDER_TS), col("_gen"), col(_SHARD), col(_ORD))
    ranked = Window.partitionBy(*by_key).orderBy(*rank_by)
    for c in following:
        ordered = ordered.withColumn(NEXT + c, F.lead(col(c)).over(ranked))
    ranks = ordered.withColumn(_ORD, F.row_number().over(ranked).cast(T.LongType())).drop("_gen", "_lead")
    return ranks if window else ranks.drop(WINDOW)
