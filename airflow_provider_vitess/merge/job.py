"""PySpark job: apply staged Vitess change windows to Delta Lake tables, each window once.

Usage (the operator builds this command; ``airflow_provider_vitess.merge.spark_conf`` has the
``--packages``/``--conf`` values)::

    spark-submit --packages io.delta:delta-spark_2.13:4.4.0 \\
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
        spark_jobs/merge_cdc.py (--plan-json JSON | --plan-file PATH) \\
        [--report-file PATH] [--rows-per-file N] [--parallelism N]

The same :func:`merge` also runs in a process of its own against a Spark Connect server, with no
spark-submit (:mod:`airflow_provider_vitess.merge.connect`).

The plan is a :class:`~airflow_provider_vitess.merge.plan.MergePlan` (JSON). The driver's Python
must have this provider and ``delta-spark`` installed (it reads the manifests, verifies the
staged files' checksums and plans the schema changes); executors need only PySpark. The staging
location must be a path or URL that both fsspec and Spark/Hadoop read (a local or shared path,
``s3a://``, ``abfss://``...), with credentials from the environment / Hadoop configuration. For
S3, the usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``; see :mod:`airflow_provider_vitess.object_storage`)
configure both fsspec and S3A: the job sets them on its session, not on the command line.

What a run does, in order, before writing anything: load every window's manifest (a missing one
is an error naming it), verify each staged part's size and sha256 (a damaged one is an error
naming the file), read the schema and the latest transaction version of
``plan.txn_app_id(table)`` of each Delta table the windows write (staged rows, or replaced: a
table they do not touch is not read) and check it is what the sync last wrote, and plan every
(window, table) step, so an incompatible schema change fails the run before its first commit.
Then the tables, several at once (they are independent: each has its own Delta log and
transaction id; :mod:`.sessions`), each window by window in seq order:
skip what the table's transaction version already covers (``already_applied``), else reduce the
window to one change per key (``merge.apply``: each shard's last event, the row exists if a shard
holds it, key changes delete the old key; a merged window also reads a few seconds of earlier
windows, ``merge.context``, for rows moved between shards across a window's stop) and either
replace the table with it (a snapshot window or a new table) or MERGE it in, as one Delta commit
carrying txnAppId = ``plan.txn_app_id(table)`` and txnVersion = the window's seq: a rerun after
a crash, at any point, commits nothing twice.

Output: one stdout line ``VITESS_MERGE_REPORT <json>`` (:class:`~airflow_provider_vitess.merge.
report.MergeReport`), the same JSON in ``--report-file``, and ``VITESS_MERGE_PROGRESS <json>``
lines as each (window, table) starts writing and commits. Exit status 0; 2 for a plan or staged
input the job refuses (message on stderr and as ``VITESS_MERGE_ERROR <json>``); 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_vitess import keyrange
from airflow_provider_vitess.exceptions import UnsupportedDeltaError, VitessProviderError, is_permanent
from airflow_provider_vitess.merge import (
    apply,
    conflicts,
    context,
    delta_features,
    delta_log,
    delta_state,
    partial,
)
from airflow_provider_vitess.merge.connect import MODE_VARIABLES
from airflow_provider_vitess.merge.integrity import check_targets
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError
from airflow_provider_vitess.merge.report import (
    PROGRESS_PREFIX,
    REPORT_PREFIX,
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
)
from airflow_provider_vitess.merge.schema import (
    WindowColumns,
    needs_column_mapping,
    window_columns,
    write_types,
)
from airflow_provider_vitess.merge.sessions import DEFAULT_PARALLELISM, TableSessions
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, spark_conf
from airflow_provider_vitess.merge.steps import (
    Action,
    Step,
    TableSize,
    TableState,
    plan_steps,
    touched_tables,
)
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging import Manifest, load_manifest, verify
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.files import MANIFEST_NAME

log = logging.getLogger("vitess_merge")
ERROR_PREFIX = "VITESS_MERGE_ERROR "
TIMING_PREFIX = "VITESS_MERGE_TIMING "  # seconds per phase, for bench/bench_merge_latency.py
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
) -> MergeReport:
    """Apply ``plan``'s windows to its Delta tables (module docstring); the report says what.

    Only the tables the windows write (:func:`~.steps.touched_tables`) are read, checked and
    merged; the others are NO_CHANGES without a look at their Delta table. Tables are
    independent, so their states are read and their steps run (in window order) up to
    ``parallelism`` tables at once, each on its own session (:class:`.sessions.TableSessions`;
    ``new_session`` makes them, default ``spark.newSession``). ``timings`` receives the seconds
    of each phase (``manifests``, ``states``, ``table <name>``, ``tables``), for the
    benchmark's breakdown."""
    started = time.monotonic()
    timed = timings if timings is not None else {}
    manifests = load_windows(plan)
    timed["manifests"] = time.monotonic() - started
    pool = TableSessions(spark, new_session, parallelism)

    def read_state(session: SparkSession, table: str) -> TableState:
        target = plan.targets[table]
        return delta_state.table_state(
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
            result = _run(session, plan, by_seq[step.seq], step, rows_per_file, report, mapping, known, size)
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
    plan: MergePlan,
    manifest: Manifest,
    step: Step,
    rows_per_file: int,
    progress: Progress,
    column_mapping: bool,
    known: dict[int, Manifest | None],
    size: TableSize | None = None,
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
    if step.action is Action.TRUNCATE:
        assert step.schema is not None
        empty = spark.createDataFrame([], step.schema)
        apply.write_replace(empty, target.path, keys, app_id, step.seq, files=1, column_mapping=False)
    else:
        assert step.columns is not None
        tm = manifest.tables[step.table]
        staged = apply.read_window(spark, manifest, tm, step.columns)
        # A replacing window is a consistent copy by itself; a merged one may need earlier events.
        earlier, retired = None, None
        if step.action is not Action.REPLACE:
            earlier = _context(spark, plan, manifest, step, staged, known)
            retired = _retired_shards(manifest, known)
        final = apply.last_per_key(
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
                rows = final.where(apply.col(apply.OP) == apply.UPSERT).select(*_with_comments(step.columns))
                mapping = column_mapping or needs_column_mapping(rows.columns)
                files = apply.files_for(tm.rows, rows_per_file)
                apply.write_replace(
                    rows, target.path, keys, app_id, step.seq, files=files, column_mapping=mapping
                )
            else:
                changes, merged = _merge(spark, final, target.path, keys, step, app_id, size)
        except Exception as exc:  # a key two shards hold fails inside Spark: say it plainly
            conflicts.raise_if_conflict(exc)
            raise
    commit = delta_log.last_commit(spark, target.path)
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


def _context(
    spark: SparkSession,
    plan: MergePlan,
    manifest: Manifest,
    step: Step,
    staged: DataFrame,
    known: dict[int, Manifest | None],
) -> DataFrame | None:
    """Events of earlier windows that can still decide keys of this one (:mod:`..context`), in
    this window's columns and types, their ``_seq`` below this window's. ``known`` caches the
    manifests read (None: not staged)."""
    assert step.columns is not None
    table, target = step.table, plan.targets[step.table]
    found = context.commit_ts_range(manifest, table)
    if found is None:  # footers without statistics: ask Spark
        row = staged.agg(F.min(apply.col(A.COMMIT_TS))).first()
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
    for earlier in context.context_windows(manifest, table, found[0], load):
        tm = earlier.manifest.tables[table]
        rows = apply.read_window(spark, earlier.manifest, tm, window_columns(tm, target))
        rows = rows.where(apply.col(A.COMMIT_TS) >= earlier.since)
        have = set(rows.columns)
        out = [
            apply.col(A.OP),
            apply.col(A.SHARD),
            apply.col(A.COMMIT_TS),
            (apply.col(A.SEQ) + F.lit(earlier.seq_shift)).alias(A.SEQ),
        ]
        for name in [c for c in staged.columns if c not in (A.OP, A.SHARD, A.COMMIT_TS, A.SEQ)]:
            dtype = staged.schema[name].dataType
            value = apply.col(name) if name in have else F.lit(None)
            out.append(value.cast(dtype).alias(name))
        frames.append(rows.select(*out))
        log.info(
            "window %d table %s: events of window %d since commit second %d count too",
            step.seq,
            table,
            earlier.manifest.window_seq,
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
        apply.col(c.name).alias(c.name, metadata={"comment": c.comment} if c.comment else {})
        for c in wc.columns
    ]


def _merge(
    spark: SparkSession,
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
        delta_features.require_type_widening(spark, step.table, ev.widen)  # before any change
        apply.evolve_table(
            spark, path, ev.add, [(n, b) for n, _, b in ev.widen], ev.column_mapping, drop=ev.drop
        )
    types = write_types(step.columns, step.schema)
    keep = [apply.col(c) for c in final.columns if c.startswith(partial.KEEP)]  # .partial
    rows = apply.persist(
        final.select(apply.col(apply.OP), *[apply.col(n).cast(t).alias(n) for n, t in types.items()], *keep)
    )
    try:
        size = size if size is not None else delta_state.table_size(spark, path)
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


# -- command line ----------------------------------------------------------------------------------


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="merge_cdc.py", description=__doc__.split("\n", 1)[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan-json", help="the MergePlan as JSON text")
    src.add_argument("--plan-file", help="a file (local path or fsspec URL) holding the MergePlan JSON")
    p.add_argument("--report-file", help="also write the report JSON here")
    p.add_argument("--jars-file", help="write the jars Spark was given (spark.jars), for later --jars")
    p.add_argument(
        "--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE, help="rows per file on replace"
    )
    p.add_argument("--parallelism", type=int, help=f"tables merged at once (default {DEFAULT_PARALLELISM})")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def _read_text(path: str) -> str:
    import fsspec

    with fsspec.open(path, "r", encoding="utf-8") as f:
        return str(f.read())


def _write_text(path: str, text: str) -> None:
    import fsspec

    with fsspec.open(path, "w", encoding="utf-8") as f:
        f.write(text)


def session(app_name: str) -> SparkSession:
    """The job's session: spark-submit's settings, plus :func:`spark_conf` for whatever they lack
    (so ``python merge_cdc.py`` works too)."""
    from pyspark import SparkConf

    # A process that opened a Spark Connect session marks its environment for Connect
    # (pyspark.sql.utils.is_remote), and a spark-submit it starts inherits the mark: this
    # session is a classic one, whoever started the job.
    for name in MODE_VARIABLES:
        os.environ.pop(name, None)
    given = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    s3 = S3Settings.from_environment(os.environ)
    for key, value in {**spark_conf(), **(s3.hadoop_conf() if s3 else {})}.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    return builder.getOrCreate()


def _report_error(report_file: str | None, exc: Exception) -> None:
    """The error as ``VITESS_MERGE_ERROR <json>`` and in the report file, with whether a retry
    can fix it: the operator fails a permanent one at once (``exceptions.is_permanent``)."""
    text = json.dumps({"error": str(exc)[:2000], "type": type(exc).__name__, "permanent": is_permanent(exc)})
    print(ERROR_PREFIX + text, flush=True)
    if report_file:
        try:
            _write_text(report_file, text)
        except Exception as write_error:  # the stdout line above still tells
            log.warning("could not write the error to %s: %s", report_file, write_error)


def use_s3_settings(s3: S3Settings) -> None:
    """fsspec's defaults for ``s3://`` and ``s3a://`` in this process (manifests, checksums)."""
    import fsspec.config

    fsspec.config.conf.setdefault("s3", {}).update(s3.storage_options())


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    entered = time.time()  # wall clock: the benchmark subtracts its spawn time (JVM + Python start)
    args = _args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    s3 = S3Settings.from_environment(os.environ)
    if s3 is not None:
        use_s3_settings(s3)
    try:
        if args.plan_json is not None:
            plan = MergePlan.from_json(args.plan_json)
        else:
            plan = MergePlan.from_json(_read_text(args.plan_file), source=f"plan file {args.plan_file}")
        began = time.monotonic()
        spark = spark or session(f"vitess-merge {plan.sync_id}")
        timings = {"session": time.monotonic() - began}
        if args.jars_file:
            _write_text(args.jars_file, spark.sparkContext.getConf().get("spark.jars", ""))

        def emit(seq: int, table: str, phase: str) -> None:
            print(PROGRESS_PREFIX + json.dumps({"seq": seq, "table": table, "phase": phase}), flush=True)

        report = merge(
            spark,
            plan,
            rows_per_file=args.rows_per_file,
            progress=emit,
            timings=timings,
            parallelism=args.parallelism,
        )
    except VitessProviderError as exc:
        print(f"merge failed: {exc}", file=sys.stderr, flush=True)
        _report_error(args.report_file, exc)
        return 2
    except Exception as exc:
        log.exception("merge failed")
        _report_error(args.report_file, exc)
        return 1
    # Which Spark application did it, for the operator's "Spark UI" link (not part of the report).
    app = {"application_id": spark.sparkContext.applicationId, "ui_url": spark.sparkContext.uiWebUrl}
    text = json.dumps({**json.loads(report.to_json()), "spark": app}, sort_keys=True)
    if args.report_file:
        _write_text(args.report_file, text)
    print(REPORT_PREFIX + text, flush=True)
    print(TIMING_PREFIX + json.dumps({"entered": entered, "ended": time.time(), **timings}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
