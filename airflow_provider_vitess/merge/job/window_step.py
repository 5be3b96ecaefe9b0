"""One (window, table) step of the merge, in every target mode: the one path each window takes.

:func:`run_step` skips what the table's transaction version already covers, else reads the
window's staged rows (and, for a merged window, the earlier windows' events that can still
decide its keys, :mod:`.lookback`), asks the table's target mode what to write
(:mod:`.strategies`: its rows, and a replace, an append or a MERGE with its statement), and
writes it the same way for every mode, through the table format (:mod:`.formats`): the schema
changes first (each its own commit, refused before the first where the format cannot widen a
column: :meth:`.formats.TableFormat.evolve`), the Change Data Feed switch (a mode with
metadata), then the write, one commit marked with (``plan.txn_app_id(table)``, the window's
seq); the commit it made (or the format's skip: another run committed the window first) is the
step's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess import keyrange
from airflow_provider_vitess.merge.job import conflicts, lookback, strategies
from airflow_provider_vitess.merge.job.formats import Commit, TableFormat
from airflow_provider_vitess.merge.job.marks import commit_mark
from airflow_provider_vitess.merge.job.schema import window_columns, write_types
from airflow_provider_vitess.merge.job.steps import Action, Step, TableSize, TableState
from airflow_provider_vitess.merge.job.strategies import StepContext, Strategy, Write, WriteKind
from airflow_provider_vitess.merge.job.window_rows import col, read_window
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import TableResult, TableStatus, WriteMode
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.manifest import Manifest, load_manifest

log = logging.getLogger("vitess_merge")
Progress = Callable[[int, str, str], None]


def run_step(
    spark: SparkSession,
    fmt: TableFormat,
    plan: MergePlan,
    manifest: Manifest,
    step: Step,
    rows_per_file: int,
    progress: Progress,
    column_mapping: bool,
    known: dict[int, Manifest | None],
    size: TableSize | None = None,
    state: TableState | None = None,
) -> TableResult:
    """Apply one window to one table (module docstring). ``column_mapping``: the table maps
    columns by name; ``known``: the manifests read so far, by seq (None: not staged); ``size``:
    the table's files and bytes if known, else asked when a MERGE needs them; ``state``: the
    table as read before the run, updated by the steps before this one."""
    target = plan.targets[step.table]
    window = next(w for w in plan.windows if w.seq == step.seq)
    mode = WriteMode.REPLACE if step.table in window.replace_tables else WriteMode.MERGE
    if step.action is Action.ALREADY_APPLIED:
        return TableResult(step.table, target.path, TableStatus.ALREADY_APPLIED, mode, **_named(fmt))
    if step.action is Action.NO_CHANGES:
        return TableResult(step.table, target.path, TableStatus.NO_CHANGES, mode, **_named(fmt))
    progress(step.seq, step.table, "writing")
    strategy = strategies.for_target(target)
    s = StepContext.of(
        spark,
        fmt,
        target,
        step,
        plan.txn_app_id(step.table),
        manifest,
        state,
        column_mapping,
        rows_per_file,
        window.replace_tables,
    )
    changes: tuple[str, ...] = ()
    if step.action is Action.TRUNCATE:
        commit = write(fmt, s, strategy.truncate(s), size)
    else:
        staged, earlier, retired = read_step(spark, plan, manifest, step, known)
        try:
            if step.action is Action.REPLACE:
                chosen = strategy.replace(s, staged)
                ev = step.evolution  # a changelog's copy appended: the columns the log lacks first
                if ev is not None and not ev.empty:
                    fmt.evolve(spark, target.path, ev, widen_in_place=s.widens_in_place)
                    changes = tuple(ev.changes)
                commit = write(fmt, s, chosen, size)
            else:
                changes, commit = _merge(fmt, s, strategy, staged, earlier, retired, size)
        except Exception as exc:  # a key two shards hold fails inside Spark: say it plainly
            conflicts.raise_if_conflict(exc)
            raise
    if commit is None:  # the format skipped the write: another run committed the window first
        return TableResult(step.table, target.path, TableStatus.ALREADY_APPLIED, mode, **_named(fmt))
    progress(step.seq, step.table, "committed")
    return _result(step, target.path, commit, changes, fmt)


def _merge(
    fmt: TableFormat,
    s: StepContext,
    strategy: Strategy,
    staged: DataFrame,
    earlier: DataFrame | None,
    retired: Mapping[str, tuple[str, ...]] | None,
    size: TableSize | None,
) -> tuple[tuple[str, ...], Commit | None]:
    """A merged window: the mode's rows, then the schema changes, then the write; returns the
    schema changes and the commit (None: already applied)."""
    step = s.step
    assert step.columns is not None and step.evolution is not None and step.schema is not None
    types = write_types(step.columns, step.schema)
    chosen = strategy.merge(s, staged, earlier, retired, types)
    ev = step.evolution
    if not ev.empty:
        log.info("table %s: %s", step.table, "; ".join(ev.changes))
        fmt.evolve(s.spark, s.target.path, ev, widen_in_place=s.widens_in_place)
    if strategy.manages_cdf:
        fmt.set_change_data_feed(s.spark, s.target.path, s.target.shape, s.properties)
    return tuple(ev.changes), write(fmt, s, chosen, size, types[s.keys[0]])


def write(
    fmt: TableFormat, s: StepContext, w: Write, size: TableSize | None, key_type: T.DataType | None = None
) -> Commit | None:
    """``w`` as one commit marked with the window's (app id, seq), through ``fmt``; the commit
    it made, None when the table holds the window already; the commit carries the window's mark
    (:mod:`.marks`). A MERGE's ``size`` is the table's if
    known (a schema change leaves it as it is), and its first key (of ``key_type``) bounds the
    files it reads (:meth:`.formats.TableFormat.merge`)."""
    with fmt.marked(s.spark, commit_mark(s.manifest)):
        return _write(fmt, s, w, size, key_type)


def _write(
    fmt: TableFormat, s: StepContext, w: Write, size: TableSize | None, key_type: T.DataType | None
) -> Commit | None:
    path, keys, seq = s.target.path, s.keys, s.step.seq
    if w.kind is WriteKind.REPLACE:
        return fmt.replace(
            w.rows,
            path,
            keys,
            s.app_id,
            seq,
            files=w.files,
            column_mapping=w.column_mapping,
            properties=w.properties,
        )
    if w.kind is WriteKind.APPEND:
        return fmt.append(w.rows, path, s.app_id, seq, create=w.properties, column_mapping=w.column_mapping)
    assert w.statement is not None and key_type is not None
    return fmt.merge(
        s.spark,
        w.rows,
        path,
        w.statement,
        s.app_id,
        seq,
        table=s.step.table,
        key=keys[0],
        key_type=key_type,
        size=size,
        view_prefix=w.view_prefix,
    )


def read_step(
    spark: SparkSession, plan: MergePlan, manifest: Manifest, step: Step, known: dict[int, Manifest | None]
) -> tuple[DataFrame, DataFrame | None, Mapping[str, tuple[str, ...]] | None]:
    """The step's staged rows, and for a merged (not replacing) window the earlier windows'
    events that can still decide its keys and the shards a reshard retired. A replacing window is
    a consistent copy by itself."""
    assert step.columns is not None
    staged = read_window(spark, manifest, manifest.tables[step.table], step.columns)
    if step.action is Action.REPLACE:
        return staged, None, None
    return staged, _context(spark, plan, manifest, step, staged, known), _retired_shards(manifest, known)


def _context(
    spark: SparkSession,
    plan: MergePlan,
    manifest: Manifest,
    step: Step,
    staged: DataFrame,
    known: dict[int, Manifest | None],
) -> DataFrame | None:
    """Events of earlier windows that can still decide keys of this one (:mod:`.lookback`), in
    this window's columns and types, their ``_seq`` below this window's. ``known`` caches the
    manifests read (None: not staged)."""
    assert step.columns is not None
    table, target = step.table, plan.targets[step.table]
    found = lookback.commit_ts_range(manifest, table)
    if found is None:  # footers without statistics: ask Spark
        row = staged.agg(F.min(col(A.COMMIT_TS))).first()
        found = None if row is None or row[0] is None else (int(row[0]), int(row[0]))
    if found is None:
        return None

    def load(seq: int) -> Manifest | None:
        if seq not in known:
            known[seq] = load_manifest(
                manifest.location, plan.sync_id, seq, storage_options=manifest.storage_options
            )
        return known[seq]

    frames = []
    for batch in _batches(lookback.context_windows(manifest, table, found[0], load), table):
        earlier = batch[0]
        tm = earlier.manifest.tables[table]
        rows = read_window(
            spark,
            earlier.manifest,
            tm,
            window_columns(tm, target),
            context_of=manifest.window_seq,
            earlier=[e.manifest for e in batch[1:]],
        )
        ts = col(A.COMMIT_TS)
        counted = ts >= earlier.since
        # A grouped snapshot's copied rows count as of their group's copy end (lookback.copy_ends).
        ends = lookback.copy_ends(earlier.manifest)
        late = sorted(s for s, end in ends.items() if end + lookback.CLOCK_SKEW_SECONDS >= earlier.since)
        if late:
            counted = counted | ((ts == 0) & col(A.SHARD).isin(late))
        if earlier.reach is lookback.Reach.WHOLE:
            counted = counted | (ts > 0)
        elif earlier.reach is lookback.Reach.SHARD_NEWEST:
            # Each shard's events within seconds of its own newest one here: one clock per
            # comparison (lookback's docstring). The per-shard newest is a few rows: broadcast.
            newest = rows.where(ts > 0).groupBy(col(A.SHARD)).agg(F.max(ts).alias("_newest"))
            rows = rows.join(F.broadcast(newest), on=A.SHARD, how="left")
            counted = counted | ((ts > 0) & (ts >= col("_newest") - F.lit(lookback.CONTEXT_SECONDS)))
        rows = rows.where(counted)
        have = set(rows.columns)
        out = [col(A.OP), col(A.SHARD), col(A.COMMIT_TS), col(A.SEQ)]
        for name in [c for c in staged.columns if c not in (A.OP, A.SHARD, A.COMMIT_TS, A.SEQ)]:
            dtype = staged.schema[name].dataType
            value = col(name) if name in have else F.lit(None)
            out.append(value.cast(dtype).alias(name))
        frames.append(rows.select(*out))
        for each in batch:
            log.info(
                "window %d table %s: events of window %d count too (%s; since commit second %d)",
                step.seq,
                table,
                each.manifest.window_seq,
                each.reach.value,
                each.since,
            )
    return reduce(DataFrame.unionByName, frames) if frames else None


def _batches(context: list[lookback.ContextWindow], table: str) -> list[list[lookback.ContextWindow]]:
    """The context windows in groups read in one scan each (``read_window``'s ``earlier``):
    windows counted whole, with no grouped copy, whose table has the same schema versions (so
    the same filter, columns and types); each other window alone."""
    batches: list[list[lookback.ContextWindow]] = []
    alike: dict[tuple[str, ...], list[lookback.ContextWindow]] = {}
    for each in context:
        if each.reach is lookback.Reach.WHOLE and not lookback.copy_ends(each.manifest):
            schemas = tuple(s.to_json() for s in each.manifest.tables[table].schemas)
            if schemas in alike:
                alike[schemas].append(each)
                continue
            alike[schemas] = [each]
            batches.append(alike[schemas])
        else:
            batches.append([each])
    return batches


def _retired_shards(manifest: Manifest, known: dict[int, Manifest | None]) -> Mapping[str, tuple[str, ...]]:
    """Shards this window or its context read that a reshard retired by the window's end, each
    with the shards that took its keys (see :mod:`.window_rows`)."""
    live = [sg.shard for sg in manifest.end_vgtid.shard_gtids]
    seen = {sg.shard for sg in manifest.start_vgtid.shard_gtids}
    for seq, earlier in known.items():
        if earlier is not None and seq < manifest.window_seq:
            seen.update(sg.shard for sg in earlier.start_vgtid.shard_gtids)
    return keyrange.successors(sorted(seen), live)


def _named(fmt: TableFormat) -> dict[str, Any]:
    """How a result names its table's format, and the catalog the format names it in."""
    return {"table_format": fmt.name, "catalog": fmt.catalog}


def _result(step: Step, path: str, commit: Commit, changes: tuple[str, ...], fmt: TableFormat) -> TableResult:
    if step.action is Action.MERGE:
        inserted, updated = commit.rows_inserted, commit.rows_updated
        return TableResult(
            step.table,
            path,
            TableStatus.WRITTEN,
            WriteMode.MERGE,
            rows_upserted=inserted + updated,
            rows_inserted=inserted,
            rows_updated=updated,
            rows_deleted=commit.rows_deleted,
            table_version=commit.version,
            schema_changes=changes,
            files_touched=commit.files_touched,
            snapshot_id=commit.snapshot_id,
            **_named(fmt),
        )
    return TableResult(
        step.table,
        path,
        TableStatus.WRITTEN,
        WriteMode.REPLACE,
        rows_upserted=commit.rows_written,
        rows_inserted=commit.rows_written,
        table_version=commit.version,
        snapshot_id=commit.snapshot_id,
        **_named(fmt),
    )
