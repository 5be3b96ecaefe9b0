"""One (window, table) step of a table in a target mode other than a plain mirror.

:mod:`.run` reads the window (and its look-back context) as for a mirror and hands the step
here; the writes are :mod:`.shapes`' and :mod:`.history`'s. Each is one Delta commit carrying
the window's transaction id; a schema change or a Change Data Feed switch before it is a commit
of its own that a rerun repeats as a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession

from airflow_provider_vitess.merge.job import apply, conflicts, history, lookback, resnapshot, shapes
from airflow_provider_vitess.merge.job.delta_access import DeltaAccess
from airflow_provider_vitess.merge.job.schema import needs_column_mapping, write_types
from airflow_provider_vitess.merge.job.steps import Action, Step, TableSize, TableState
from airflow_provider_vitess.merge.job.window_rows import OP, UPSERT, col, last_per_key
from airflow_provider_vitess.merge.modes import TargetMode
from airflow_provider_vitess.merge.plan import TableTarget
from airflow_provider_vitess.staging.manifest import Manifest


@dataclass(frozen=True)
class ShapedStep:
    """What :mod:`.run` knows of the step: the target, the window, the table's state."""

    target: TableTarget
    step: Step
    app_id: str
    manifest: Manifest
    exists: bool  # the Delta table exists before the step
    properties: Mapping[str, str]  # its properties (Change Data Feed)
    column_mapping: bool
    size: TableSize | None
    files: int  # for a replace
    snapshot: bool  # the window is a snapshot of the table (its copy), not a catch-up

    @classmethod
    def of(
        cls,
        target: TableTarget,
        step: Step,
        app_id: str,
        manifest: Manifest,
        state: TableState | None,
        column_mapping: bool,
        size: TableSize | None,
        rows_per_file: int,
        replace_tables: Sequence[str],
    ) -> ShapedStep:
        tm = manifest.tables.get(step.table)
        names = step.schema.fieldNames() if step.schema is not None else []
        return cls(
            target,
            step,
            app_id,
            manifest,
            exists=state is not None and state.exists,
            properties={} if state is None else state.properties,
            column_mapping=column_mapping or needs_column_mapping(names),
            size=size,
            files=apply.files_for(tm.rows if tm is not None else 0, rows_per_file),
            snapshot=step.table in replace_tables,
        )


def truncate(spark: SparkSession, s: ShapedStep) -> None:
    """A replacing window without rows: an empty table (a changelog keeps its rows: it appends
    nothing, in a commit that records the window; one started afresh, ``Step.afresh``, is
    emptied)."""
    assert s.step.schema is not None
    shape, keys = s.target.shape, list(s.target.key_columns)
    if s.step.past is not None:  # history, soft_delete: the past stays, every key ended
        _rewrite(spark, s, None)
        return
    empty = shapes.empty_rows(spark, s.step.schema, shape)
    if shape.mode is TargetMode.CHANGELOG and not s.step.afresh:
        shapes.append(
            empty, s.target.path, s.app_id, s.step.seq, None if s.exists else shapes.properties(shape), False
        )
        return
    apply.write_replace(
        empty,
        s.target.path,
        keys,
        s.app_id,
        s.step.seq,
        files=1,
        column_mapping=False,
        properties=shapes.properties(shape),
    )


def _replace(s: ShapedStep, rows: DataFrame) -> None:
    """The step's table replaced by ``rows`` (one commit carrying the window), with the mode's
    table properties."""
    apply.write_replace(
        rows,
        s.target.path,
        list(s.target.key_columns),
        s.app_id,
        s.step.seq,
        files=s.files,
        column_mapping=s.column_mapping,
        properties=shapes.properties(s.target.shape),
    )


def _rewrite(spark: SparkSession, s: ShapedStep, copy: DataFrame | None) -> None:
    """A re-snapshot of a table whose mode keeps its past (:mod:`.resnapshot`), one commit."""
    step, target = s.step, s.target
    assert step.schema is not None and step.past is not None
    at = resnapshot.copy_second(s.manifest)
    keys = list(target.key_columns)
    rows = resnapshot.rows(
        spark, target.path, copy, keys, step.schema, step.past, target.shape, step.seq, step.table, at
    )
    _replace(s, rows)


def write(
    spark: SparkSession,
    delta: DeltaAccess,
    s: ShapedStep,
    staged: DataFrame,
    earlier: DataFrame | None,
    retired: Mapping[str, Sequence[str]] | None,
    with_comments: Sequence[Column],
) -> tuple[tuple[str, ...], bool]:
    """The step's write; returns the schema changes and whether Delta ran a MERGE."""
    step, target, shape = s.step, s.target, s.target.shape
    assert step.columns is not None
    keys, data = list(target.key_columns), [c.name for c in step.columns.columns]
    path, seq, table = target.path, step.seq, step.table
    snapshot = s.snapshot
    if step.action is Action.REPLACE:
        create = shapes.properties(shape)
        if shape.mode is TargetMode.CHANGELOG:
            assert step.schema is not None
            ends = lookback.copy_ends(s.manifest)  # a grouped snapshot's (order.key_order)
            rows = shapes.changelog_rows(staged, keys, step.schema, shape, seq, snapshot, copies_at=ends)
            if step.afresh:  # a changed column choice: the copy's rows, in its schema, are the log
                _replace(s, rows)
            else:
                shapes.append(rows, path, s.app_id, seq, None if s.exists else create, s.column_mapping)
            return (), False
        covered = conflicts.covered(s.manifest, staged)
        if step.past is not None:  # a re-snapshot of a history or soft_delete table: the past stays
            final = last_per_key(staged, keys, data, table=table, covered=covered, replace=True, meta=True)
            _rewrite(spark, s, final.where(col(OP) == UPSERT))
            return (), False
        if shape.mode is TargetMode.HISTORY and not snapshot:  # a catch-up creating the table
            versions = history.versions(staged, None, keys, data, shape, seq, table, covered)
            rows = versions.where(col(history.ACTION) == history.INSERT).drop(history.ACTION, history.HEAL_TS)
        else:
            final = last_per_key(
                staged,
                keys,
                data,
                table=table,
                covered=covered,
                replace=True,
                meta=True,
            )
            rows = shapes.replace_rows(final, with_comments, shape, seq)
        _replace(s, rows)
        return (), False
    assert step.evolution is not None and step.schema is not None
    ev = step.evolution
    if not ev.empty:
        apply.evolve_table(spark, path, ev)
    shapes.set_change_data_feed(spark, path, shape, s.properties)
    if shape.mode is TargetMode.CHANGELOG:
        rows = shapes.changelog_rows(staged, keys, step.schema, shape, seq, snapshot=False, retired=retired)
        shapes.append(rows, path, s.app_id, seq, None, False)
        return tuple(ev.changes), False
    types = write_types(step.columns, step.schema)
    covered = conflicts.covered(s.manifest, staged)
    if shape.mode is TargetMode.HISTORY:
        source = history.versions(staged, earlier, keys, data, shape, seq, table, covered, retired)
    else:
        final = last_per_key(
            staged,
            keys,
            data,
            earlier,
            retired,
            table=table,
            covered=covered,
            meta=True,
        )
        source = shapes.merge_rows(final, types, shape, seq)
    rows = apply.persist(source)
    try:
        size = s.size if s.size is not None else delta.table_size(spark, path)
        rewrite = size.bytes < apply.REWRITE_BELOW_BYTES
        small = size.files <= 1 or rewrite
        prune = None if small else apply.prune_condition(spark, rows, keys[0], types[keys[0]])
        if shape.mode is TargetMode.HISTORY:
            merged = history.merge_versions(
                spark, rows, path, keys, step.schema, shape, s.app_id, seq, prune, rewrite
            )
        else:
            merged = shapes.merge_keyed(
                spark, rows, path, keys, step.schema, shape, s.app_id, seq, prune, rewrite, table
            )
    finally:
        rows.unpersist()
    return tuple(ev.changes), merged
