"""One key held by two shards at once: a key that is unique per shard only.

MySQL enforces a PRIMARY or UNIQUE key per shard. In a sharded keyspace a key that does not
include the primary vindex column (and is not fed by a Vitess sequence) can therefore repeat
across shards: two rows of the source, one key. The merge's rule (:mod:`.window_rows`: each shard's
last event says whether that shard holds the key; the row exists if any shard holds it) would
keep one of them and later events would flip the Delta row between the two. So the merge fails,
naming table, key and shards, instead of writing one row for two.

When two shards holding one key is a duplicate for sure, and when it may be a row on its way
between shards (a move is a DELETE on one shard and an INSERT on the other, two shard commits
milliseconds apart, see :mod:`.context`):

* a window's stop is read shard by shard (a snapshot ends when the last shard's copy is over,
  each shard's stream live until then), so a move's INSERT can be in it and its DELETE in the
  next window. Two holders are a conflict when the other half of a move would have been read:
  the earlier holder's shard was read :data:`~.context.CONTEXT_SECONDS` past the latest
  holder's commit (``covered``: per shard, the latest commit second the window read of it; a
  shard that reached the window's stop, and every shard of a snapshot, was read up to the
  newest commit of the window), or the latest holder's row is a snapshot's copy (commit second
  0: a shard's copy is a consistent state, and a move after it is in its binlog). A duplicate
  INSERTed in a window's last seconds is therefore not seen in that window.
* a snapshot copied by shard groups: each group's streams end with its own copy, so a shard is
  read to its group's end, and holders in two groups are a conflict only where no move between
  the groups fits (:func:`_across_groups`; docs/design.md, "Shard groups").

Not seen at all: a key whose first row arrived in an earlier window (the snapshot, say) with no
event of it in this window or its look-back, and whose second row is inserted on another shard
now: to the events this is the INSERT half of a move whose DELETE half was merged before. The
remedy for such keys is the same (a key that includes the vindex column); docs/troubleshooting.md
has a query that finds them at the source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.exceptions import InvalidVgtidError, KeyConflictError
from airflow_provider_vitess.merge.job.lookback import CONTEXT_SECONDS, copy_ends
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.manifest import GROUP_READS, Manifest
from airflow_provider_vitess.vgtid import Vgtid

# The error Spark raises carries the text between these marks (raise_error adds its own words).
_BEGIN, _END = "<<vitess-key-conflict>>", "<</vitess-key-conflict>>"
_FOUND = re.compile(re.escape(_BEGIN) + "(.*?)" + re.escape(_END), re.DOTALL)


def remedy(table: str, keys: Sequence[str]) -> str:
    return (
        "MySQL enforces the key per shard only, so in a sharded keyspace it can repeat across "
        "shards unless it includes the primary vindex column (or a Vitess sequence feeds it). "
        f"Remedy: give the table a key that includes the vindex column, e.g. key_overrides="
        f"{{{table!r}: {{'source_unique_key_columns': [{', '.join(repr(k) for k in keys)}, "
        "'<vindex column>']}}, and re-snapshot it (resnapshot_tables); or make the key unique "
        "across shards at the source (a Vitess sequence) and re-snapshot. A row moving between "
        "shards at the instant a window ended can look the same once: a re-snapshot of the table "
        "then succeeds as it is"
    )


def guarded_op(
    keys: Sequence[str],
    table: str,
    covered: Mapping[str, int],
    op: Column,
    up: Column | None = None,
) -> Column:
    """``op``, or a Spark error (:func:`raise_if_conflict` turns it into
    :class:`KeyConflictError`) for a key two shards hold at once (module docstring).
    For a frame of each shard's last event per key (``_shard``, ``_up``, ``_ord``,
    ``_commit_ts`` and the key columns); ``covered``: per shard, the latest commit second the
    window read of it (:func:`covered`). Window functions over the key, so the check costs no
    pass of its own. ``up``: whether the row's shard holds the key (default ``_up``)."""
    by_key = Window.partitionBy(*[F.col(_q(k)) for k in keys])
    up = F.col("_up") if up is None else up
    shard, ts = F.col("_shard"), F.col(A.COMMIT_TS)
    reach = F.lit(None).cast(T.LongType())
    for s, second in covered.items():
        reach = F.when(shard == s, F.lit(second)).otherwise(reach)
    latest = F.max(F.when(up, F.struct(ts.alias("ts"), F.col("_ord").alias("ord"), shard.alias("s")))).over(
        by_key
    )
    # A holder other than the latest one, read far enough past the latest holder's commit that
    # the DELETE half of a move to the latest holder would be in the window; or the latest
    # holder's row is a snapshot's copy (commit second 0): not half of a move either.
    far_enough = (latest["ts"] == 0) | (reach >= latest["ts"] + F.lit(CONTEXT_SECONDS))
    groups = getattr(covered, "groups", None)
    if groups:
        far_enough = _across_groups(groups, shard, ts, reach, latest, far_enough)
    sure = up & (shard != latest["s"]) & far_enough
    conflict = F.max(sure.cast("int")).over(by_key) == 1
    holders = F.array_join(F.array_sort(F.collect_set(F.when(up, shard)).over(by_key)), ", ")
    values = F.concat_ws(", ", *[F.coalesce(F.col(_q(k)).cast("string"), F.lit("NULL")) for k in keys])
    message = F.concat(
        F.lit(f"{_BEGIN}table {table!r}: key ({', '.join(keys)}) = ("),
        values,
        F.lit(") is held by shards "),
        holders,
        F.lit(
            f" at once: two rows of the source with one key; the merge would keep one. {remedy(table, keys)}"
        ),
        F.lit(_END),
    )
    return F.when(conflict, F.raise_error(message)).otherwise(op)


class Reach(dict[str, int]):
    """Per shard, the latest commit second the window read of it (:func:`covered`); for a
    snapshot copied by shard groups also ``groups``: per shard, its group and when that group's
    copy ended (:func:`.lookback.copy_ends`)."""

    def __init__(self, reach: Mapping[str, int], groups: Mapping[str, tuple[int, int]] | None = None):
        super().__init__(reach)
        self.groups: dict[str, tuple[int, int]] = dict(groups or {})


def covered(manifest: Manifest, staged: DataFrame) -> Reach:
    """Per shard, the latest commit second the window read of it, as far as its staged rows of
    the table show: a shard that reached the window's stop (every shard, in a snapshot: each
    one's stream runs until the last copy is over) was read up to the newest commit of the
    window (every event in it committed before the stop was read), another one up to its own
    newest row here. One aggregation of two staged columns.

    A snapshot copied by shard groups (its manifest's ``group_reads``): each group's streams ran
    until its own copy was over, not the others', so its shards were read up to that group's
    newest source second (what its read saw, or its newest row here), and the result names each
    shard's group and copy end (:class:`Reach`, :func:`.lookback.copy_ends`)."""
    rows = staged.groupBy(F.col(A.SHARD)).agg(F.max(F.col(A.COMMIT_TS))).collect()
    newest = {str(r[0]): int(r[1]) for r in rows if r[1] is not None}
    top = max(newest.values(), default=0)
    stop = manifest.stop_vgtid
    reads = manifest.stats.get(GROUP_READS) if stop is None else None
    if reads:
        out, groups, ends = dict(newest), {}, copy_ends(manifest)
        for g, read in enumerate(reads):
            shards = [str(s) for s in read.get("shards") or ()]
            reach = max([int(read.get("read_to") or 0), *(newest.get(s, 0) for s in shards)])
            for s in shards:
                out[s] = reach
                if s in ends:
                    groups[s] = (g, ends[s])
        return Reach(out, groups)
    if stop is None:
        return Reach(dict.fromkeys(newest, top))
    out = dict(newest)
    for sg in manifest.end_vgtid.shard_gtids:
        target = stop.shard(sg.keyspace, sg.shard)
        try:
            reached = target is not None and Vgtid((sg,)).has_reached(Vgtid((target,)))
        except InvalidVgtidError:  # not a resolved position: not known to be reached
            reached = False
        if reached:
            out[sg.shard] = top
    return Reach(out)


def _across_groups(
    groups: Mapping[str, tuple[int, int]],
    shard: Column,
    ts: Column,
    reach: Column,
    latest: Column,
    same: Column,
) -> Column:
    """``same`` (the rule above) for two holders copied by one group (their streams ran
    together); for holders of a grouped snapshot's different groups, whose copies ended apart
    (each group's end ``E``, :func:`.lookback.copy_ends`): a move from the earlier group's shard
    to the other's after the earlier group's end is in neither's part (its DELETE is in the next
    window), so two holders are a conflict only when no such move fits:

    * the latest holder's row came from its binlog at second ``t``: this holder's group read
      past ``t + CONTEXT_SECONDS`` (the move's DELETE would be here), and, when this holder's row
      is a copy, its group ended ``CONTEXT_SECONDS`` before the latest's (a move from the latest
      holder before this copy would be in the latest's part);
    * both rows are copies: the two groups' copies ended within ``CONTEXT_SECONDS`` of each
      other (a move between them would have to fall in that gap: as a move at the instant a
      window ends, once). Copies that ended further apart are not refused here: the key may
      have moved between them (docs/design.md, "Shard groups")."""
    group, end = F.lit(None).cast(T.LongType()), F.lit(None).cast(T.LongType())
    latest_group, latest_end = group, end
    for s, (g, e) in groups.items():
        group = F.when(shard == s, F.lit(g)).otherwise(group)
        end = F.when(shard == s, F.lit(e)).otherwise(end)
        latest_group = F.when(latest["s"] == s, F.lit(g)).otherwise(latest_group)
        latest_end = F.when(latest["s"] == s, F.lit(e)).otherwise(latest_end)
    gap = F.lit(CONTEXT_SECONDS)
    binlog = (reach >= latest["ts"] + gap) & ((ts > 0) | (end + gap <= latest_end))
    copies = F.abs(end - latest_end) < gap
    across = F.when(latest["ts"] == 0, copies).otherwise(binlog)
    return F.when(group.isNull() | latest_group.isNull() | (group == latest_group), same).otherwise(across)


def copy_ends_of(covered: Mapping[str, int] | None) -> dict[str, int]:
    """The copy ends a :class:`Reach` names (a grouped snapshot's), for ``order.key_order``."""
    return {s: end for s, (_, end) in getattr(covered, "groups", {}).items()}


def raise_if_conflict(exc: BaseException) -> None:
    """Re-raise a Spark error that :func:`guarded_op` caused as :class:`KeyConflictError`."""
    found = _FOUND.search(str(exc))
    if found is not None:
        raise KeyConflictError(found.group(1)) from None


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
