"""The merge itself: apply a plan's staged windows to its Delta tables, each window once.

:func:`merge` runs in the Spark driver: spark-submit's (:mod:`.main`, the file the operator
submits) or, over Spark Connect, the task's own process (:mod:`.connect`). The tables are
reached only through their format (:mod:`.formats`: Delta, whose state is read one way on a
classic session and another over Spark Connect, chosen inside it), picked once per merge.

Before writing anything: load every window's manifest (a missing one is an error naming it),
verify each staged part's size and sha256 (a damaged one is an error naming the file), read the
state of each Delta table the windows write (staged rows, or replaced: a table they do not
touch is not read), check it is what the sync last wrote (:meth:`.formats.TableFormat.check`), and plan every
(window, table) step (:mod:`.steps`), so an incompatible schema change fails the run before its
first commit. Then the tables, several at once (:mod:`.sessions`), each window by window in seq
order, one step each (:mod:`.window_step`, the same path in every target mode): skip what the
table's transaction version already covers, else write what the table's mode makes of the
window (:mod:`.strategies`) as one commit marked with (``plan.txn_app_id(table)``, the window's
seq), which the format skips when the table holds it (Delta: its transaction id): a rerun after
a crash, at any point, commits nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog, of_plan
from airflow_provider_vitess.merge.job import shapes, window_step
from airflow_provider_vitess.merge.job.formats import TableFormat, for_session
from airflow_provider_vitess.merge.job.marks import read_id
from airflow_provider_vitess.merge.job.sessions import TableSessions
from airflow_provider_vitess.merge.job.steps import Step, TableState, plan_steps, touched_tables
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError
from airflow_provider_vitess.merge.report import MergeReport, TableResult, TableStatus, WindowResult
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging import Manifest, load_manifest, verify
from airflow_provider_vitess.staging.files import MANIFEST_NAME

log = logging.getLogger("vitess_merge")
DEFAULT_ROWS_PER_FILE = 1_000_000
Progress = window_step.Progress


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
    table_format: TableFormat | None = None,
    iceberg_catalog: IcebergCatalog | None = None,
) -> MergeReport:
    """Apply ``plan``'s windows to its Delta tables (module docstring); the report says what.

    Only the tables the windows write (:func:`~.steps.touched_tables`) are read, checked and
    merged; the others are NO_CHANGES without a look at their Delta table. Tables are
    independent, so their states are read and their steps run (in window order) up to
    ``parallelism`` tables at once, each on its own session (:class:`.sessions.TableSessions`;
    ``new_session`` makes them, default ``spark.newSession``). ``timings`` receives the seconds
    of each phase (``manifests``, ``states``, ``table <name>``, ``tables``), for the
    benchmark's breakdown. ``table_format``: the tables' format (:mod:`.formats`), chosen here
    for the kind of ``spark`` unless the caller gives it; ``iceberg_catalog``: the plan's JDBC
    catalog with its credentials, when the caller has them (else they are read from this
    process's environment, where the operator's spark-submit put them)."""
    started = time.monotonic()
    fmt = table_format or for_session(
        spark, plan.table_format, of_plan(plan.iceberg_catalog, os.environ, iceberg_catalog)
    )
    timed = timings if timings is not None else {}
    manifests = load_windows(plan)
    timed["manifests"] = time.monotonic() - started
    pool = TableSessions(spark, new_session, parallelism, activate=fmt.activate)

    def read_state(session: SparkSession, table: str) -> TableState:
        target = plan.targets[table]
        return fmt.state(
            session, target.path, plan.txn_app_id(table), restores_after=target.last_delta_version
        )

    # What the sync last wrote is checked for each table before this run writes it; a table
    # the windows do not write is left as it is, and checked when a window writes it.
    states = pool.map(read_state, {t: t for t in touched_tables(plan, manifests)})
    fmt.check(plan, states, {m.window_seq: read_id(m) for m in manifests})
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
            result = window_step.run_step(
                session,
                fmt,
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
                and result.table_version is None
                and state is not None
            ):
                # Held by a commit of an earlier run: the table's version now stands for it.
                result = dataclasses.replace(
                    result, table_version=state.version, snapshot_id=state.snapshot_id
                )
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


def use_s3_settings(s3: S3Settings) -> None:
    """fsspec's defaults for ``s3://`` and ``s3a://`` in this process (manifests, checksums)."""
    import fsspec.config

    fsspec.config.conf.setdefault("s3", {}).update(s3.storage_options())
