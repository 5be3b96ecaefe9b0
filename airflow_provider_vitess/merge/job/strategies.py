"""What each target mode writes for one (window, table) step: its rows and how they are written.

A mode (:mod:`...modes`) is a small strategy: given the step and the window's staged rows
(:mod:`.window_rows`), it answers a :class:`Write`: rows to replace the table with, to append,
or to MERGE with the statement it renders (:mod:`.merge_sql`). The rest of a step, the same for
every mode (schema changes and their guard, size and key ranges, the write, the commit it made),
is :mod:`.window_step`'s.

* :class:`Keyed`: one row per key: a mirror (plain, or with metadata columns) and
  ``soft_delete`` (:mod:`.shapes`);
* :class:`History`: versions of each key (:mod:`.history`);
* :class:`Changelog`: every change, appended (:mod:`.shapes`).

A re-snapshot of a ``history`` or ``soft_delete`` table that exists keeps its past
(:mod:`.resnapshot`); a snapshot's copy is a replace, a changelog's an append (the log keeps
what it had) unless it starts afresh (``Step.afresh``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import (
    conflicts,
    history,
    lookback,
    merge_sql,
    partial,
    resnapshot,
    shapes,
)
from airflow_provider_vitess.merge.job.formats.base import Statement, TableFormat
from airflow_provider_vitess.merge.job.schema import needs_column_mapping
from airflow_provider_vitess.merge.job.steps import Step, TableState
from airflow_provider_vitess.merge.job.window_rows import OP, UPSERT, col, last_per_key, with_comments
from airflow_provider_vitess.merge.modes import TABLE_FEATURES, TYPE_WIDENING, TargetMode
from airflow_provider_vitess.merge.plan import TableTarget
from airflow_provider_vitess.staging.manifest import Manifest

Retired = Mapping[str, Sequence[str]]
(TYPE_WIDENING_PROPERTY,) = TABLE_FEATURES[TYPE_WIDENING]  # the property that says a table has it


class WriteKind(str, enum.Enum):
    REPLACE = "replace"  # create or overwrite the table
    APPEND = "append"
    MERGE = "merge"


@dataclass(frozen=True)
class Write:
    """A mode's answer: ``rows`` and how they go into the table, as one commit carrying the
    window's transaction id. ``properties``: a replace's table properties; an append's when it
    creates the table (None: it exists). ``statement``: a MERGE's, ``view_prefix`` names its view."""

    kind: WriteKind
    rows: DataFrame
    files: int = 1
    column_mapping: bool = False
    properties: Mapping[str, str] | None = None
    statement: Statement | None = None
    view_prefix: str = "vitess_merge_"


@dataclass(frozen=True)
class StepContext:
    """What a mode knows of the step: the target, the window, the table's state."""

    spark: SparkSession
    fmt: TableFormat
    target: TableTarget
    step: Step
    app_id: str
    manifest: Manifest
    exists: bool  # the Delta table exists before the step
    properties: Mapping[str, str]  # its properties (Change Data Feed, features: modes.SHAPE_PROPERTIES)
    column_mapping: bool
    files: int  # for a replace
    snapshot: bool  # the window is a snapshot of the table (its copy), not a catch-up

    @classmethod
    def of(
        cls,
        spark: SparkSession,
        fmt: TableFormat,
        target: TableTarget,
        step: Step,
        app_id: str,
        manifest: Manifest,
        state: TableState | None,
        column_mapping: bool,
        rows_per_file: int,
        replace_tables: Sequence[str],
    ) -> StepContext:
        tm = manifest.tables.get(step.table)
        names = step.schema.fieldNames() if step.schema is not None else []
        return cls(
            spark,
            fmt,
            target,
            step,
            app_id,
            manifest,
            exists=state is not None and state.exists,
            properties={} if state is None else state.properties,
            column_mapping=column_mapping or needs_column_mapping(names),
            files=files_for(tm.rows if tm is not None else 0, rows_per_file),
            snapshot=step.table in replace_tables,
        )

    @property
    def keys(self) -> list[str]:
        return list(self.target.key_columns)

    @property
    def widens_in_place(self) -> bool:
        """A widened column is widened in place: the table has Delta's type widening, or it is
        chosen for the table (``table_features``); else the table is rewritten
        (:meth:`.formats.TableFormat.evolve`)."""
        have = self.properties.get(TYPE_WIDENING_PROPERTY, "false").lower() == "true"
        return have or TYPE_WIDENING in self.target.shape.features

    @property
    def data(self) -> list[str]:
        assert self.step.columns is not None
        return [c.name for c in self.step.columns.columns]

    @property
    def schema(self) -> T.StructType:
        assert self.step.schema is not None
        return self.step.schema


class Keyed:
    """One row per key: a mirror and ``soft_delete`` (:mod:`.shapes`). A plain mirror's rows
    carry no metadata, and its table's Change Data Feed setting is left as the user has it."""

    def __init__(self, meta: bool) -> None:
        self.meta = meta  # the deciding event's commit second and change ride along
        self.manages_cdf = meta

    def truncate(self, s: StepContext) -> Write:
        """A replacing window without rows: an empty table (a history or soft_delete table that
        exists keeps its past, every key ended)."""
        if s.step.past is not None:
            return _rewrite(s, None)
        empty = shapes.empty_rows(s.spark, s.schema, s.target.shape)
        return Write(WriteKind.REPLACE, empty, properties=shapes.properties(s.target.shape))

    def replace(self, s: StepContext, staged: DataFrame) -> Write:
        covered = conflicts.covered(s.manifest, staged)
        last = last_per_key(
            staged, s.keys, s.data, table=s.step.table, covered=covered, replace=True, meta=self.meta
        )
        if s.step.past is not None:  # a re-snapshot of a soft_delete table: the past stays
            return _rewrite(s, last.where(col(OP) == UPSERT))
        assert s.step.columns is not None
        return _replace(
            s, shapes.replace_rows(last, with_comments(s.step.columns), s.target.shape, s.step.seq)
        )

    def merge(
        self,
        s: StepContext,
        staged: DataFrame,
        earlier: DataFrame | None,
        retired: Retired | None,
        types: Mapping[str, T.DataType],
    ) -> Write:
        covered = conflicts.covered(s.manifest, staged)
        last = last_per_key(
            staged, s.keys, s.data, earlier, retired, table=s.step.table, covered=covered, meta=self.meta
        )
        shape, keys, schema, table = s.target.shape, s.keys, s.schema, s.step.table
        soft = shape.mode is TargetMode.SOFT_DELETE

        def statement(target: str, view: str, columns: Sequence[str], prune: str | None) -> str:
            keep = [n for n in schema.fieldNames() if partial.KEEP + n in columns]
            return merge_sql.keyed(target, view, keys, schema, shape.columns(), keep, prune, table, soft)

        rows = shapes.merge_rows(last, types, shape, s.step.seq)
        return Write(WriteKind.MERGE, rows, statement=statement)


class History(Keyed):
    """Versions of each key (:mod:`.history`)."""

    def __init__(self) -> None:
        super().__init__(meta=True)

    def replace(self, s: StepContext, staged: DataFrame) -> Write:
        if s.step.past is not None or s.snapshot:
            return super().replace(s, staged)
        # A catch-up window creating the table: its versions, the current ones.
        covered = conflicts.covered(s.manifest, staged)
        seq, shape = s.step.seq, s.target.shape
        versions = history.versions(staged, None, s.keys, s.data, shape, seq, s.step.table, covered)
        rows = versions.where(col(history.ACTION) == history.INSERT).drop(history.ACTION, history.HEAL_TS)
        return _replace(s, rows)

    def merge(
        self,
        s: StepContext,
        staged: DataFrame,
        earlier: DataFrame | None,
        retired: Retired | None,
        types: Mapping[str, T.DataType],
    ) -> Write:
        covered = conflicts.covered(s.manifest, staged)
        shape, keys, schema = s.target.shape, s.keys, s.schema
        rows = history.versions(
            staged, earlier, keys, s.data, shape, s.step.seq, s.step.table, covered, retired
        )

        def statement(target: str, view: str, columns: Sequence[str], prune: str | None) -> str:
            return history.merge_statement(target, view, keys, schema, shape, columns, prune)

        return Write(WriteKind.MERGE, rows, statement=statement, view_prefix="vitess_history_")


class Changelog:
    """Every change, appended (:func:`.shapes.changelog_rows`); a snapshot's copy is appended
    too (``snapshot`` rows), or replaces the log when it starts afresh (``Step.afresh``) or
    after a type change, with the log's past cast to the new type (``Step.past``)."""

    manages_cdf = True

    def truncate(self, s: StepContext) -> Write:
        empty = shapes.empty_rows(s.spark, s.schema, s.target.shape)
        if s.step.afresh:
            return Write(WriteKind.REPLACE, empty, properties=shapes.properties(s.target.shape))
        return Write(WriteKind.APPEND, empty, properties=_create(s))

    def replace(self, s: StepContext, staged: DataFrame) -> Write:
        ends = lookback.copy_ends(s.manifest)  # a grouped snapshot's (order.key_order)
        seq, shape = s.step.seq, s.target.shape
        rows = shapes.changelog_rows(staged, s.keys, s.schema, shape, seq, s.snapshot, copies_at=ends)
        if s.step.afresh:  # a changed column choice: the copy's rows, in its schema, are the log
            return _replace(s, rows)
        if s.step.past is not None:  # a changed type: the log's past cast to it (.resnapshot)
            old = s.fmt.read(s.spark, s.target.path)
            past = resnapshot.log_rows(old, s.schema, s.step.past, shape, s.step.table)
            return _replace(s, past.unionByName(rows))
        # The copy's new columns (Step.evolution) are added to the log before the append.
        return Write(WriteKind.APPEND, rows, column_mapping=s.column_mapping, properties=_create(s))

    def merge(
        self,
        s: StepContext,
        staged: DataFrame,
        earlier: DataFrame | None,
        retired: Retired | None,
        types: Mapping[str, T.DataType],
    ) -> Write:
        seq, shape = s.step.seq, s.target.shape
        rows = shapes.changelog_rows(staged, s.keys, s.schema, shape, seq, snapshot=False, retired=retired)
        return Write(WriteKind.APPEND, rows)


Strategy = Keyed | Changelog


def for_target(target: TableTarget) -> Strategy:
    """The strategy of ``target``'s mode."""
    shape = target.shape
    if shape.mode is TargetMode.HISTORY:
        return History()
    if shape.mode is TargetMode.CHANGELOG:
        return Changelog()
    return Keyed(meta=not shape.plain)


def files_for(rows: int, rows_per_file: int) -> int:
    """How many files a replace of ``rows`` rows writes."""
    return max(1, math.ceil(rows / max(1, rows_per_file)))


def _create(s: StepContext) -> Mapping[str, str] | None:
    """An append's table properties when it creates the table; None when the table exists."""
    return None if s.exists else shapes.properties(s.target.shape)


def _replace(s: StepContext, rows: DataFrame) -> Write:
    """The table replaced by ``rows``, with the mode's table properties."""
    props = shapes.properties(s.target.shape)
    return Write(WriteKind.REPLACE, rows, files=s.files, column_mapping=s.column_mapping, properties=props)


def _rewrite(s: StepContext, copy: DataFrame | None) -> Write:
    """A re-snapshot of a table whose mode keeps its past (:mod:`.resnapshot`)."""
    step, target = s.step, s.target
    assert step.past is not None
    at = resnapshot.copy_second(s.manifest)
    old = s.fmt.read(s.spark, target.path)
    rows = resnapshot.rows(old, copy, s.keys, s.schema, step.past, target.shape, step.seq, step.table, at)
    return _replace(s, rows)
