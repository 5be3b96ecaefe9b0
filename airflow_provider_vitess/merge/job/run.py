"""The merge itself: apply a plan's staged windows to its Delta tables, each window once.

:func:`merge` runs in the Spark driver: spark-submit's (:mod:`.main`, the file the operator
submits) or, over Spark Connect, the task's own process (:mod:`.connect`). How the Delta tables'
state is read differs between the two and is chosen once per merge (:mod:`.delta_access`).

Before writing anything: load every window's manifest (a missing one is an error naming it),
verify each staged part's size and sha256 (a damaged one is an error naming the file), read the
state of each Delta table the windows write (staged rows, or replaced: a table they do not
touch is not read), check it is what the sync last wrote (:mod:`.integrity`), and plan every
(window, table) step (:mod:`.steps`), so an incompatible schema change fails the run before its
first commit. Then the tables, several at once (:mod:`.sessions`), each window by window in seq
order: skip what the table's transaction version already covers, else reduce the window to one
change per key (:mod:`.apply`; a merged window also reads a few seconds of earlier windows,
:mod:`.lookback`) and replace the table with it or MERGE it in, as one Delta commit carrying
txnAppId = ``plan.txn_app_id(table)`` and txnVersion = the window's seq: a rerun after a crash,
at any point, commits nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_vitess import keyrange
from airflow_provider_vitess.exceptions import UnsupportedDeltaError
from airflow_provider_vitess.merge.job import (
    apply,
    conflicts,
    delta_log,
    lookback,
    partial,
    shaped,
    shapes,
)
from airflow_provider_vitess.merge.job.delta_access import DeltaAccess, for_session
from airflow_provider_vitess.merge.job.integrity import check_targets
from airflow_provider_vitess.merge.job.schema import (
    WindowColumns,
    needs_column_mapping,
    window_columns,
    write_types,
)
from airflow_provider_vitess.merge.job.sessions import TableSessions
from airflow_provider_vitess.merge.job.steps import (
    Action,
    Step,
    TableSize,
    TableState,
    plan_steps,
    touched_tables,
)
from airflow_provider_vitess.merge.job.window_rows import OP, UPSERT, col, last_per_key, read_window
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError
from airflow_provider_vitess.merge.report import (
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
)
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging import Manifest, load_manifest, verify
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.files import MANIFEST_NAME

log = logging.getLogger("vitess_merge")
DEFAULT_ROWS_PER_FILE = 1_000_000
Progress = Callable[[int, str, str], None]


def load_windows(plan: MergePlan) -> list[Manifest]:
    """Every window's manifest, its parts verified (the tables the plan merges)."""
    out = []
    for w in plan.windows:
        suffix = f"/{plan.sync_id}/window={w.seq:010d}/{MANIFEST_NAME}"
        if not w.manifest_path.endswith(suffix):
            raise MergePlanError(
                f"window {w.seq}: manifest path {w.manifest_path!r} is not '<staging location>{suffix}'"
            )
        manifest = load_manifest(w.manifest_path[: -len(suffix)], plan.sync_id, w.seq)
        if manifest is None:
            raise MergePlanError(f"window {w.seq}: staged manifest {w.manifest_path} does not exist")
        verify(manifest, [t for t in sorted(plan.targets) if t in manifest.tables])
        out.append(manifest)
    return out


def merge(
    spark: SparkSession,
    plan: MergePlan,
    *,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    progress: Progress | None = None,
    new_session: Callable[[], SparkSession] | None = None,
    parallelism: int | None = None,
    timings: dict[str, float] | None = None,
    delta: DeltaAccess | None = None,
) -> MergeReport:
    """Apply ``plan``'s windows to its Delta tables (module docstring); the report says what.

    Only the tables the windows write (:func:`~.steps.touched_tables`) are read, checked and
    merged; the others are NO_CHANGES without a look at their Delta table. Tables are
    independent, so their states are read and their steps run (in window order) up to
    ``parallelism`` tables at once, each on its own session (:class:`.sessions.TableSessions`;
    ``new_session`` makes them, default ``spark.newSession``). ``timings`` receives the seconds
    of each phase (``manifests``, ``states``, ``table <name>``, ``tables``), for the
    benchmark's breakdown. ``delta``: how the tables' state is read (:mod:`.delta_access`),
    chosen here by the kind of ``spark`` unless the caller knows it."""
    started = time.monotonic()
    delta = delta or for_session(spark)
    timed = timings if timings is not None else {}
    manifests = load_windows(plan)
    timed["manifests"] = time.monotonic() - started
    pool = TableSessions(spark, new_session, parallelism, activate=delta.activate)

    def read_state(session: SparkSession, table: str) -> TableState:
        target = plan.targets[table]
        return delta.table_state(
            session, target.path, plan.txn_app_id(table), restores_after=target.last_delta_version
        )

    # What the sync last wrote is checked for each table before this run writes it; a table
    # the windows do not write is left as it is, and checked when a window writes it.
    states = pool.map(read_state, {t: t for t in touched_tables(plan, manifests)})
    check_targets(plan, states)
    steps = plan_steps(plan, manifests, states)
    timed["states"] = time.monotonic() - started - timed["manifests"]
    by_seq = {m.window_seq: m for m in manifests}
    # Manifests by seq, the plan's and earlier windows' read for context: each read once per run.
    known: dict[int, Manifest | None] = dict(by_seq)
    chains: dict[str, list[Step]] = {}
    for step in steps:  # plan_steps orders them by window: each table's chain keeps that order
        chains.setdefault(step.table, []).append(step)

    report = progress or (lambda *_: None)

    def run_chain(session: SparkSession, chain: list[Step]) -> list[TableResult]:
        out, began_chain = [], time.monotonic()
        state = states.get(chain[0].table)  # None: a table the windows do not write
        mapping = state is not None and state.column_mapping
        size = None if state is None else state.size  # until this run writes the table
        for step in chain:
            began = time.monotonic()
            result = _run(
                session,
                delta,
                plan,
                by_seq[step.seq],
                step,
                rows_per_file,
                report,
                mapping,
                known,
                size,
                state,
            )
            if state is not None and result.status is TableStatus.WRITTEN:  # for the next window
                written = {**state.properties, **shapes.properties(plan.targets[step.table].shape)}
                state = dataclasses.replace(state, exists=True, properties=written)
            if result.status is TableStatus.WRITTEN:
                size = None
            if (
                result.status is TableStatus.ALREADY_APPLIED
                and result.delta_version is None
                and state is not None
            ):
                # Held by a commit of an earlier run: the table's version now stands for it.
                result = dataclasses.replace(result, delta_version=state.version)
            log.info(
                "window %d table %s in %.2fs: %s",
                step.seq,
                step.table,
                time.monotonic() - began,
                json.dumps(result.to_dict()),
            )
            out.append(result)
        if state is not None:
            timed[f"table {chain[0].table}"] = time.monotonic() - began_chain
        return out

    began_chains = time.monotonic()
    done = pool.map(run_chain, {t: c for t, c in chains.items() if t in states})
    # The others are NO_CHANGES steps: no Spark, no session.
    done.update({t: run_chain(spark, c) for t, c in chains.items() if t not in states})
    timed["tables"] = time.monotonic() - began_chains
    results: dict[int, list[TableResult]] = {w.seq: [] for w in plan.windows}
    for step in steps:  # the report lists them in plan order, whichever thread finished first
        results[step.seq].append(done[step.table].pop(0))
    log.info(
        "sync %s: %d window(s), %d of %d tables written, in %.1fs (%s)",
        plan.sync_id,
        len(plan.windows),
        len(states),
        len(plan.targets),
        time.monotonic() - started,
        ", ".join(f"{k} {v:.2f}s" for k, v in timed.items()),
    )
    return MergeReport(plan.sync_id, tuple(WindowResult(s, tuple(r)) for s, r in results.items()))


def _run(
    spark: SparkSession,
    delta: DeltaAccess,
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
    target = plan.targets[step.table]
    app_id = plan.txn_app_id(step.table)
    window = next(w for w in plan.windows if w.seq == step.seq)
    mode = WriteMode.REPLACE if step.table in window.replace_tables else WriteMode.MERGE
    if step.action is Action.ALREADY_APPLIED:
        return TableResult(step.table, target.path, TableStatus.ALREADY_APPLIED, mode)
    if step.action is Action.NO_CHANGES:
        return TableResult(step.table, target.path, TableStatus.NO_CHANGES, mode)
    progress(step.seq, step.table, "writing")
    keys = list(target.key_columns)
    changes: tuple[str, ...] = ()
    merged = False  # whether Delta says it ran a MERGE (a replace answers nothing either way)
    shaped_step = None
    if not target.shape.plain:  # a target mode of its own (.shaped); a plain mirror goes on here
        shaped_step = shaped.ShapedStep.of(
            target, step, app_id, manifest, state, column_mapping, size, rows_per_file, window.replace_tables
        )
    if step.action is Action.TRUNCATE and shaped_step is not None:
        shaped.truncate(spark, shaped_step)
    elif step.action is Action.TRUNCATE:
        assert step.schema is not None
        empty = spark.createDataFrame([], step.schema)
        apply.write_replace(empty, target.path, keys, app_id, step.seq, files=1, column_mapping=False)
    elif shaped_step is not None:
        assert step.columns is not None
        staged, earlier, retired = _read_step(spark, plan, manifest, step, known)
        try:
            changes, merged = shaped.write(
                spark, delta, shaped_step, staged, earlier, retired, _with_comments(step.columns)
            )
        except Exception as exc:
            conflicts.raise_if_conflict(exc)
            raise
    else:
        assert step.columns is not None
        tm = manifest.tables[step.table]
        staged, earlier, retired = _read_step(spark, plan, manifest, step, known)
        final = last_per_key(
            staged,
            keys,
            [c.name for c in step.columns.columns],
            earlier,
            retired,
            table=step.table,
            covered=conflicts.covered(manifest, staged),
            replace=step.action is Action.REPLACE,
        )
        try:
            if step.action is Action.REPLACE:
                rows = final.where(col(OP) == UPSERT).select(*_with_comments(step.columns))
                mapping = column_mapping or needs_column_mapping(rows.columns)
                files = apply.files_for(tm.rows, rows_per_file)
                apply.write_replace(
                    rows, target.path, keys, app_id, step.seq, files=files, column_mapping=mapping
                )
            else:
                changes, merged = _merge(spark, delta, final, target.path, keys, step, app_id, size)
        except Exception as exc:  # a key two shards hold fails inside Spark: say it plainly
            conflicts.raise_if_conflict(exc)
            raise
    commit = delta_log.last_commit(spark, target.path, delta.read_log_file)
    if commit is None and merged:
        raise UnsupportedDeltaError(
            f"window {step.seq} table {step.table}: Delta ran the MERGE into {target.path} but the "
            f"session recorded no commit version ({delta_log.LAST_COMMIT_CONF}), so the job cannot "
            "tell the commit from a skip. The window's changes are in the table; a rerun finds "
            "them there. Remedy: run the merge with the Delta Lake the provider pins "
            f"({DELTA_PACKAGE}), on the Spark Connect server too."
        )
    if commit is None:  # Delta skipped the write: another run committed the window first
        return TableResult(step.table, target.path, TableStatus.ALREADY_APPLIED, mode)
    progress(step.seq, step.table, "committed")
    return _result(step, target.path, commit, changes)


def _read_step(
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
    for earlier in lookback.context_windows(manifest, table, found[0], load):
        tm = earlier.manifest.tables[table]
        rows = read_window(spark, earlier.manifest, tm, window_columns(tm, target))
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
        out = [
            col(A.OP),
            col(A.SHARD),
            col(A.COMMIT_TS),
            (col(A.SEQ) + F.lit(earlier.seq_shift)).alias(A.SEQ),
        ]
        for name in [c for c in staged.columns if c not in (A.OP, A.SHARD, A.COMMIT_TS, A.SEQ)]:
            dtype = staged.schema[name].dataType
            value = col(name) if name in have else F.lit(None)
            out.append(value.cast(dtype).alias(name))
        frames.append(rows.select(*out))
        log.info(
            "window %d table %s: events of window %d count too (%s; since commit second %d)",
            step.seq,
            table,
            earlier.manifest.window_seq,
            earlier.reach.value,
            earlier.since,
        )
    return reduce(DataFrame.unionByName, frames) if frames else None


def _retired_shards(manifest: Manifest, known: dict[int, Manifest | None]) -> Mapping[str, tuple[str, ...]]:
    """Shards this window or its context read that a reshard retired by the window's end, each
    with the shards that took its keys (see :mod:`.apply`)."""
    live = [sg.shard for sg in manifest.end_vgtid.shard_gtids]
    seen = {sg.shard for sg in manifest.start_vgtid.shard_gtids}
    for seq, earlier in known.items():
        if earlier is not None and seq < manifest.window_seq:
            seen.update(sg.shard for sg in earlier.start_vgtid.shard_gtids)
    return keyrange.successors(sorted(seen), live)


def _with_comments(wc: WindowColumns) -> list[Column]:
    return [
        col(c.name).alias(c.name, metadata={"comment": c.comment} if c.comment else {}) for c in wc.columns
    ]


def _merge(
    spark: SparkSession,
    delta: DeltaAccess,
    final: DataFrame,
    path: str,
    keys: list[str],
    step: Step,
    app_id: str,
    size: TableSize | None,
) -> tuple[tuple[str, ...], bool]:
    """Evolve the schema, then MERGE; returns the schema changes and whether Delta ran the MERGE
    (:func:`.apply.merge_into`). ``size``: the table's files and bytes if known (a schema change
    leaves them as they are), else asked."""
    assert step.columns is not None and step.evolution is not None and step.schema is not None
    ev = step.evolution
    if not ev.empty:
        log.info("table %s: %s", step.table, "; ".join(ev.changes))
        apply.evolve_table(spark, path, ev)
    types = write_types(step.columns, step.schema)
    keep = [col(c) for c in final.columns if c.startswith(partial.KEEP)]  # .partial
    rows = apply.persist(final.select(col(OP), *[col(n).cast(t).alias(n) for n, t in types.items()], *keep))
    try:
        size = size if size is not None else delta.table_size(spark, path)
        # One file, or a table small enough to rewrite (so to scan whole): the files the key
        # ranges would skip cost less than the job that computes them.
        rewrite = size.bytes < apply.REWRITE_BELOW_BYTES
        small = size.files <= 1 or rewrite
        prune = None if small else apply.prune_condition(spark, rows, keys[0], types[keys[0]])
        merged = apply.merge_into(
            spark, rows, path, keys, step.schema, app_id, step.seq, prune, rewrite, table=step.table
        )
    finally:
        rows.unpersist()
    return tuple(ev.changes), merged


def _result(step: Step, path: str, commit: delta_log.Commit, changes: tuple[str, ...]) -> TableResult:
    m = {k: int(v) for k, v in commit.metrics.items() if v.lstrip("-").isdigit()}
    if step.action is Action.MERGE:
        inserted, updated = m.get("numTargetRowsInserted", 0), m.get("numTargetRowsUpdated", 0)
        return TableResult(
            step.table,
            path,
            TableStatus.WRITTEN,
            WriteMode.MERGE,
            rows_upserted=inserted + updated,
            rows_inserted=inserted,
            rows_updated=updated,
            rows_deleted=m.get("numTargetRowsDeleted", 0),
            delta_version=commit.version,
            schema_changes=changes,
            files_touched=m.get("numTargetFilesRemoved", 0)
            + m.get("numTargetDeletionVectorsAdded", 0)
            + m.get("numTargetDeletionVectorsUpdated", 0),
        )
    return TableResult(
        step.table,
        path,
        TableStatus.WRITTEN,
        WriteMode.REPLACE,
        rows_upserted=m.get("numOutputRows", 0),
        rows_inserted=m.get("numOutputRows", 0),
        delta_version=commit.version,
    )


def use_s3_settings(s3: S3Settings) -> None:
    """fsspec's defaults for ``s3://`` and ``s3a://`` in this process (manifests, checksums)."""
    import fsspec.config

    fsspec.config.conf.setdefault("s3", {}).update(s3.storage_options())
