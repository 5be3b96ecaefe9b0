"""``history`` (SCD type 2): each window's versions of each key it touches, and the MERGE.

The events are the merge's own (:func:`.key_events`, with the look-back's context, in
the order ``_ord`` the mirror uses), and the same rule decides whether a key exists after each of
them: it does while some shard holds it (that shard's last event is an upsert; a key lives on
one shard at a time, so a row moved between shards, DELETE on one and INSERT on another, exists
throughout whichever half comes first). Per key, in event order:

* a shard's holding before its first event is read off that event (an insert: not held; an
  update or a delete: held), so the holders after each event are a running sum;
* a shard retired by a reshard that held a key at its last event hands that holding to the new
  shard that has events of it (:func:`_heirs`: its events count as that shard's), as the mirror
  drops a retired shard's last event once a new shard has one;
* a delete followed by the key's next event, an upsert on another shard, at most
  :data:`~.lookback.CONTEXT_SECONDS` later, is the first half of a move: it counts right after
  that upsert (no deleted gap between the two versions);
* events run in *groups*: consecutive events of one shard, one commit second and one window
  (the rows of one transaction share all three; a window's stop between two transactions of one
  second splits them, as the earlier window already merged the first). A group that ends with
  the key existing and with an upsert (a move's delete, counted after its insert, aside) gives
  one version, with the values of the latest upsert; one that ends with the key gone ends the
  version before it (``deleted``). A delete and re-insert inside one group ends the
  version before with ``deleted`` and starts the next at the same second.

So a version is the state a second ends with (one version per key per shard, commit second and
window; a key deleted in its last transaction of the second has none):
updates of a key inside one transaction give one version. ``valid_from`` is the group's commit
time (the second the merge orders it by, :data:`.order.ORDER_TS`), ``valid_to`` the next
group's that ends it (NULL: current). A snapshot's rows start at an
unknown time (``valid_from`` NULL).

The MERGE closes the Delta table's current version of each key whose first group in the window
ends it (``valid_to``, ``current`` false, ``deleted``) and inserts the window's versions, as one
commit carrying the window's transaction id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import conflicts, merge_sql, order, partial
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.lookback import CONTEXT_SECONDS
from airflow_provider_vitess.merge.job.shapes import ROLE_TYPES, commit_time, meta_columns
from airflow_provider_vitess.merge.job.window_rows import CHANGE, CTX, ORD, SHARD, UP, col, key_events
from airflow_provider_vitess.merge.modes import (
    COMMIT_TS,
    CURRENT,
    DELETED,
    SYNCED_AT,
    VALID_FROM,
    VALID_TO,
    WINDOW_SEQ,
    TargetShape,
)
from airflow_provider_vitess.merge.modes import OP as OP_ROLE

ACTION, INSERT, CLOSE = "_action", "insert", "close"
HEAL_TS = "_heal_ts"  # a close row: the end of the version an earlier window ended at a move's delete
# Versions start and end at the second the merge orders an event by (its commit second, made
# non-decreasing along its shard's events of the key: :data:`.order.ORDER_TS`), so a version never
# ends before it starts.
_TS = order.ORDER_TS
_WIN = order.WINDOW


def _events(
    staged: DataFrame,
    context: DataFrame | None,
    keys: Sequence[str],
    data: Sequence[str],
    table: str,
    retired: Mapping[str, Sequence[str]],
    copies_at: Mapping[str, int] | None = None,
) -> DataFrame:
    """The window's events at each key it touches, with the context's of those keys
    (``copies_at``: a grouped snapshot's copy ends, :func:`.order.key_order`)."""
    events = key_events(staged, keys, data).withColumn(CTX, F.lit(False))
    if context is not None:
        events = events.unionByName(key_events(context, keys, data).withColumn(CTX, F.lit(True)))
    blobs = [c for c in events.columns if c.startswith(partial.HAS)]
    if blobs:  # a partial row image (NOBLOB): a version needs every value
        left_out = reduce(lambda a, b: a | b, [~col(c) for c in blobs])
        events = events.withColumn(
            "_guard",
            F.when(
                col(UP) & left_out,
                F.raise_error(
                    F.lit(
                        f"table {table!r}: a row image leaves out BLOB/TEXT columns "
                        "(binlog_row_image=NOBLOB), and a history version needs every value. "
                        "Remedy: set binlog_row_image=FULL on the MySQL of every tablet the sync "
                        "streams from (let the connections that write reconnect), then re-snapshot "
                        "the table (resnapshot_tables): the staged window and the binlog keep the "
                        "partial images; or give the table another target mode at a new target "
                        "location and re-snapshot it"
                    )
                ),
            ),
        ).where(col("_guard").isNull())
        events = events.drop("_guard", *blobs)
    # The keys the window touches, ranked, with each event's next one (for a move's two halves).
    following = (UP, SHARD, _TS, _WIN)
    return order.key_order(events, keys, retired, following=following, window=True, copies_at=copies_at)


def _heirs(e: DataFrame, keys: Sequence[str], retired: Mapping[str, Sequence[str]]) -> DataFrame:
    """A retired shard's events of a key that a shard which replaced it has events of, counted
    as that shard's when the old shard held the key at its last event: the new shard holds the
    old one's row from the switch on (its copy gave no event), so its holding continues the old
    shard's. Counted apart, the old shard would hold a key for ever after its last upsert (a key
    deleted on the new shard stays current). The heir: the new shard whose earliest event of the
    key is not an insert (it had the row), else the earliest; a retired shard's events all come
    before the new shards' (the journal).

    An old shard whose last event deleted the key handed nothing on, and its events stay its own
    (holding nothing after them): the new shard's holding starts from its own first event. Joined,
    the new shard's first event would continue the old shard's deletion, and where the look-back
    left out the new shard's insert after the switch (its own events older than the window's
    look-back, the old shard's within seconds of its journal), a delete there would end nothing:
    the version the earlier window merged stayed current."""
    by_key = Window.partitionBy(*[col(k) for k in keys])
    shard = col(SHARD)
    for old, new in retired.items():
        first = F.struct((col(CHANGE) == "insert").alias("insert"), col(ORD).alias("ord"), shard.alias("s"))
        held = F.max(F.when(shard == old, F.struct(col(ORD).alias("ord"), col(UP).alias("up")))).over(by_key)
        earliest = F.min(F.when(shard.isin(list(new)), first)).over(by_key)
        e = e.withColumn("_heir", F.when(held["up"], earliest))
        heir = col("_heir")["s"]
        for c in (SHARD, order.NEXT + SHARD):  # the next event's shard too
            e = e.withColumn(c, F.when((col(c) == old) & heir.isNotNull(), heir).otherwise(col(c)))
        e = e.drop("_heir")
    return e


def versions(
    staged: DataFrame,
    context: DataFrame | None,
    keys: Sequence[str],
    data: Sequence[str],
    shape: TargetShape,
    seq: int,
    table: str,
    covered: Mapping[str, int],
    retired: Mapping[str, Sequence[str]] | None = None,
) -> DataFrame:
    """The MERGE's source: ``_action`` = insert (a version of this window) or close (the end of
    the Delta table's current version of the key), the key and data columns, and the shape's
    metadata columns (module docstring). A key two shards hold at once after the window (two
    live rows of the source, which would be one current version flipping between them) makes the
    first Spark action fail as a mirror's merge does (:mod:`.conflicts`; ``covered``, ``retired``
    as for :func:`.window_rows.last_per_key`)."""
    ends = conflicts.copy_ends_of(covered)
    e = _heirs(_events(staged, context, keys, data, table, retired or {}, ends), keys, retired or {})
    key_cols = [col(k) for k in keys]
    nxt = {n: col(order.NEXT + n) for n in (UP, SHARD, _TS, _WIN)}
    nxt[ORD] = F.when(nxt[UP].isNotNull(), col(ORD) + 1)  # ranks are 1, 2, ... per key
    healed = ~col(UP) & F.coalesce(nxt[UP], F.lit(False))
    healed = healed & (nxt[SHARD] != col(SHARD)) & (nxt[_TS] - col(_TS) <= CONTEXT_SECONDS)
    e = (
        e.withColumn("_healed", healed)
        .withColumn("_eff", F.when(col("_healed"), nxt[ORD] * 2 + 1).otherwise(col(ORD) * 2))
        .withColumn("_gshard", F.when(col("_healed"), nxt[SHARD]).otherwise(col(SHARD)))
        .withColumn("_gts", F.when(col("_healed"), nxt[_TS]).otherwise(col(_TS)))
        .withColumn("_gwin", F.when(col("_healed"), nxt[_WIN]).otherwise(col(_WIN)))
    )
    up = col(UP).cast("int")
    prior = F.when(col(CHANGE) == "insert", 0).otherwise(1)  # the shard's holding before it
    by_shard = Window.partitionBy(*key_cols, col(SHARD)).orderBy(col("_eff"))
    first = F.lag(col(ORD)).over(by_shard).isNull()
    e = e.withColumn("_first", first).withColumn("_delta", up - F.coalesce(F.lag(up).over(by_shard), prior))
    # A shard holds the key after the window when its last event is an upsert (a retired shard's
    # events count as its heir's); two holders at once fail the job (.conflicts). Over the
    # windows above: no pass of its own.
    held = col(UP) & F.lead(col(ORD)).over(by_shard).isNull()
    ok = conflicts.guarded_op(keys, table, covered, F.lit(True), up=col("_held"))
    e = e.withColumn("_held", held).withColumn("_ok", ok).where(col("_ok")).drop("_held", "_ok")
    key_all = Window.partitionBy(*key_cols)
    ordered = Window.partitionBy(*key_cols).orderBy(col("_eff"))
    running = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    h0 = F.sum(F.when(col("_first"), prior).otherwise(0)).over(key_all)
    e = e.withColumn("_h0", h0).withColumn("_exists", (col("_h0") + F.sum("_delta").over(running)) > 0)
    e = e.withColumn("_vals", F.last(F.when(col(UP), F.struct(*[col(c) for c in data])), True).over(running))
    # Groups: runs of one shard, one commit second and one window. A window's stop can fall
    # between two transactions of one second: the earlier window merged the first as a version of
    # its own, which the second (a delete) must end, not join.
    group = F.struct(col("_gshard"), col("_gts"), col("_gwin"))
    prev_g = F.lag(group).over(ordered)
    starts = F.when(prev_g.isNull() | (prev_g != group), 1).otherwise(0)
    e = e.withColumn("_run", F.sum(starts).over(running))
    # The run's last event: the next one starts another run (in the same order: no sort of its own).
    e = e.withColumn("_i", F.when(F.coalesce(F.lead(col("_run")).over(ordered), F.lit(-1)) != col("_run"), 1))
    runs = e.groupBy(*key_cols, col("_run")).agg(
        F.min(F.when(col("_i") == 1, col("_gts"))).alias("_ts"),
        F.max(F.when(col("_i") == 1, col("_exists").cast("int"))).alias("_end"),
        F.min(col("_exists").cast("int")).alias("_min"),
        # The group's last event but a move's delete counted after its insert: an upsert, or the
        # group's shard gave up the row (an update then a delete while another shard holds it).
        F.max(F.when(~col("_healed"), F.struct(col("_eff").alias("e"), up.alias("u")))).alias("_last"),
        F.max(F.when(~col(CTX), 1).otherwise(0)).alias("_in_window"),
        F.first(F.when(col("_i") == 1, col("_vals")), True).alias("_vals"),
        F.first(col("_h0")).alias("_h0"),
        # A move's first half (a delete) merged by an earlier window, its second half here.
        F.max(F.when(col("_healed") & col(CTX), col(_TS))).alias(HEAL_TS),
    )
    by_run = Window.partitionBy(*key_cols).orderBy(col("_run"))
    before = F.coalesce(F.lag(col("_end")).over(by_run), (col("_h0") > 0).cast("int"))
    runs = runs.withColumn("_before", before)
    kind = (
        F.when((col("_end") == 1) & (col("_last")["u"] == 1), F.lit(INSERT))
        .when((col("_end") == 0) & (col("_before") == 1), F.lit(CLOSE))
        .otherwise(F.lit(None))
    )
    runs = runs.withColumn("_kind", kind).where(col("_kind").isNotNull())
    gap = (col("_kind") == INSERT) & (col("_min") == 0)  # deleted and inserted again in the run
    runs = runs.withColumn("_gap", gap)
    later = Window.partitionBy(*key_cols).orderBy(col("_run"))
    nk, nts, ngap = (F.lead(col(c)).over(later) for c in ("_kind", "_ts", "_gap"))
    prev_in_window = F.lag(col("_in_window")).over(later)
    runs = (
        runs.withColumn("_valid_to", nts)
        .withColumn("_ended_by_delete", F.coalesce((nk == CLOSE) | ngap, F.lit(False)))
        .withColumn("_opens_window", F.coalesce(prev_in_window, F.lit(0)) == 0)
        .where(col("_in_window") == 1)
    )
    ts = commit_time(col("_ts"))
    meta = {
        OP_ROLE: F.when(col("_before") == 1, F.lit("update")).otherwise(F.lit("insert")),
        COMMIT_TS: ts,
        WINDOW_SEQ: F.lit(seq),
        SYNCED_AT: F.current_timestamp(),
        VALID_FROM: ts,
        VALID_TO: commit_time(col("_valid_to")),
        CURRENT: col("_valid_to").isNull(),
        DELETED: col("_ended_by_delete"),
    }
    inserts = [
        F.lit(INSERT).alias(ACTION),
        F.lit(None).cast(T.LongType()).alias(HEAL_TS),
        *key_cols,
        *[col("_vals")[c].alias(c) for c in data if c not in keys],
        *meta_columns(shape, meta),
    ]
    # The first group of the key in this window ends the version Delta holds as current.
    close_meta = {VALID_TO: ts, DELETED: (col("_kind") == CLOSE) | col("_gap")}
    closes = [
        F.lit(CLOSE).alias(ACTION),
        col(HEAL_TS).cast(T.LongType()).alias(HEAL_TS),
        *key_cols,
        *[F.lit(None).cast(staged.schema[c].dataType).alias(c) for c in data if c not in keys],
        *[close_meta.get(r, F.lit(None)).cast(ROLE_TYPES[r]).alias(shape.name(r)) for r in shape.roles()],
    ]
    # A run gives an insert, a close, or both: one pass over the runs (a union of two selects
    # would compute every window above the shuffle twice).
    both = F.array(
        F.when(col("_kind") == INSERT, F.struct(*inserts)),
        F.when(col("_opens_window"), F.struct(*closes)),
    )
    rows = runs.select(F.explode(both).alias("_r")).where(col("_r").isNotNull()).select("_r.*")
    marked = meta_columns(shape, {r: col(shape.name(r)) for r in shape.roles()})  # the field marker
    names = set(shape.columns())
    return rows.select(*[col(c) for c in rows.columns if c not in names], *marked)


def merge_statement(
    target: str,
    view: str,
    keys: Sequence[str],
    schema: T.StructType,
    shape: TargetShape,
    columns: Sequence[str],
    prune: str | None,
) -> str:
    """The MERGE of :func:`versions`' rows (``columns``: theirs; a data column of ``schema``
    they lack, a dropped one, is NULL): close the current versions, insert the new ones."""
    current, valid_to, deleted = (shape.name(r) for r in (CURRENT, VALID_TO, DELETED))
    # The current version, or the one an earlier window ended at a move's delete (``_heal_ts``):
    # it is the key's latest and none is current, so one row matches.
    healed = f"(t.{q(deleted)} AND t.{q(valid_to)} = timestamp_seconds(s.{q(HEAL_TS)}))"
    on = f"({merge_sql.keys_match(keys)}) AND (t.{q(current)} OR {healed}) AND s.{q(ACTION)} = '{CLOSE}'"
    if prune is not None:
        on = f"{on} AND ({prune})"
    values = {
        n: (v if n in columns else f"CAST(NULL AS {f.dataType.simpleString()})")
        for (n, v), f in zip(merge_sql.casts(schema).items(), schema.fields, strict=True)
    }
    values.update({m: f"s.{q(m)}" for m in shape.columns()})
    close = [(valid_to, f"s.{q(valid_to)}"), (current, "false"), (deleted, f"s.{q(deleted)}")]
    clauses = [
        merge_sql.When(True, merge_sql.Then.UPDATE, None, close),
        merge_sql.When(False, merge_sql.Then.INSERT, f"s.{q(ACTION)} = '{INSERT}'", list(values.items())),
    ]
    return merge_sql.merge_into(target, view, on, clauses)
