"""What the merge job will do, decided before it writes anything (pure).

For every (window, table) of a plan, in window order: skip it (the Delta table's transaction
version for the sync/table already covers the window), replace the table from the window's rows
(a snapshot window, or a table that does not exist yet), merge the window into it (after adding
or widening columns), or nothing (the window has no rows for the table). Every schema problem
(an incompatible type change, a key that cannot be fed) is found here, for all windows, so a bad
window fails the run before its first commit.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import types as T

from airflow_provider_vitess.exceptions import TargetModeError
from airflow_provider_vitess.merge.job.schema import (
    Evolution,
    WindowColumns,
    can_widen,
    evolve,
    needs_column_mapping,
    window_columns,
)
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape, collisions
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError
from airflow_provider_vitess.staging.manifest import COLUMN_CHOICE_CHANGED, Manifest


class Action(str, enum.Enum):
    ALREADY_APPLIED = "already_applied"
    NO_CHANGES = "no_changes"
    REPLACE = "replace"  # create or overwrite from the window's rows
    TRUNCATE = "truncate"  # a replacing window without a single staged row or schema: empty the table
    MERGE = "merge"


@dataclass(frozen=True)
class TableSize:
    files: int
    bytes: int


@dataclass(frozen=True)
class TableState:
    """A Delta table as found before the run."""

    exists: bool
    schema: T.StructType = field(default_factory=T.StructType)
    txn_version: int | None = None  # latest window seq committed by this sync to the table
    column_mapping: bool = False
    version: int | None = None  # the table's latest Delta version
    snapshot_id: int | None = None  # its commit's id where the format has one (Iceberg's snapshot)
    # Delta versions of RESTORE commits after the version the sync last wrote (target integrity).
    restores: tuple[int, ...] = ()
    # Per window seq of this sync committed after that version, the read its commit holds
    # (:mod:`.marks`): another read of the same seq is not the same window.
    marks: Mapping[int, str] = field(default_factory=dict)
    # Data files and their bytes at ``version``, when known without rebuilding the version's file
    # list (Spark Connect: the version's checksum file, :mod:`.checksum`).
    size: TableSize | None = None
    # The table's properties that record its target mode (``merge.modes``; none: a plain mirror)
    # and Change Data Feed.
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    seq: int
    table: str
    action: Action
    columns: WindowColumns | None = None
    evolution: Evolution | None = None
    schema: T.StructType | None = None  # the Delta schema once the step is done
    # A REPLACE or TRUNCATE of a table whose mode keeps its past (KEEPS_PAST) and that exists,
    # or a REPLACE of a changelog whose copy changed a column's type: its data schema before the
    # step; the step rewrites it with the copy (.resnapshot).
    past: T.StructType | None = None
    # A REPLACE or TRUNCATE of a changelog table that exists, for a changed column choice: the
    # copy's rows replace the log instead of being appended to it (its rows hold what the new
    # choice hides: clear values of a newly hashed column, values of a newly excluded one).
    afresh: bool = False


def touched_tables(plan: MergePlan, manifests: Sequence[Manifest]) -> list[str]:
    """The plan's tables its windows write: staged rows in a window, or replaced by one (a
    snapshot). Every other table's steps are NO_CHANGES whatever its Delta table holds, so a run
    needs no state of it (a window of 2 tables in a sync of 200 reads 2)."""
    out: set[str] = set()
    for window, manifest in zip(plan.windows, manifests, strict=True):
        out.update(window.replace_tables)
        out.update(t for t, tm in manifest.tables.items() if tm.schemas and tm.parts)
    return sorted(out & set(plan.targets))


def plan_steps(
    plan: MergePlan, manifests: Sequence[Manifest], states: Mapping[str, TableState]
) -> list[Step]:
    """Steps in execution order (window seq, then table name); raises before any write.
    ``states``: those of the :func:`touched_tables` (others are not needed)."""
    if [m.window_seq for m in manifests] != [w.seq for w in plan.windows]:
        raise MergePlanError("manifests must be given in the plan's window order")
    touched = touched_tables(plan, manifests)
    if missing := [t for t in touched if t not in states]:
        raise ValueError(f"no Delta table state for the written table(s) {', '.join(missing)}")
    steps: list[Step] = []
    per_table: dict[str, list[Step]] = {}
    for table in sorted(plan.targets):
        if table in touched:
            per_table[table] = _table_steps(plan, manifests, table, states[table])
        else:
            per_table[table] = [Step(w.seq, table, Action.NO_CHANGES) for w in plan.windows]
    for i in range(len(plan.windows)):
        steps += [per_table[t][i] for t in sorted(plan.targets)]
    return steps


def _table_steps(plan: MergePlan, manifests: Sequence[Manifest], table: str, state: TableState) -> list[Step]:
    target = plan.targets[table]
    shape = target.shape
    # The steps' schemas are the source's columns: a target mode's metadata columns are its own.
    schema: T.StructType | None = data_schema(state.schema, shape) if state.exists else None
    mapping = state.column_mapping
    out = []
    for window, manifest in zip(plan.windows, manifests, strict=True):
        seq = window.seq
        if state.txn_version is not None and seq <= state.txn_version:
            out.append(Step(seq, table, Action.ALREADY_APPLIED))
            continue
        tm = manifest.tables.get(table)
        replace = table in window.replace_tables
        # A changed column choice: the past holds what the new choice hides (clear values of a
        # newly hashed or excluded column), so the re-snapshot replaces the table, a changelog too.
        rechosen = table in (manifest.stats.get(COLUMN_CHOICE_CHANGED) or ())
        keeps_past = shape.mode in KEEPS_PAST and schema is not None and not rechosen
        afresh = replace and rechosen and shape.mode is TargetMode.CHANGELOG and schema is not None
        if tm is None or not tm.schemas:
            if replace and schema is not None:
                past = schema if keeps_past else None
                out.append(Step(seq, table, Action.TRUNCATE, schema=schema, past=past, afresh=afresh))
            else:
                out.append(Step(seq, table, Action.NO_CHANGES, schema=schema))
            continue
        if not tm.parts and not replace:
            out.append(Step(seq, table, Action.NO_CHANGES, schema=schema))
            continue
        wc = window_columns(tm, target)
        if clash := collisions(shape, [c.name for c in wc.columns]):
            raise TargetModeError(
                f"table {table!r} (window {seq}): source column(s) {clash} have the names of the "
                f"{shape.mode.value} target's metadata columns; nothing was written. Give the sync "
                f"another metadata_prefix (now {shape.prefix!r})"
            )
        if replace and keeps_past:  # a re-snapshot: the past stays (.resnapshot)
            assert schema is not None
            past, schema = schema, kept_schema(schema, wc, shape.mode)
            mapping = mapping or needs_column_mapping(schema.fieldNames())
            out.append(Step(seq, table, Action.REPLACE, wc, schema=schema, past=past))
            continue
        if replace and shape.mode is TargetMode.CHANGELOG and schema is not None and not rechosen:
            kept = kept_schema(schema, wc, shape.mode)
            if retyped(schema, kept):  # the log's past cast to the copy's types (.resnapshot)
                past, schema = schema, kept
                mapping = mapping or needs_column_mapping(schema.fieldNames())
                out.append(Step(seq, table, Action.REPLACE, wc, schema=schema, past=past))
                continue
            # Appended: the copy's new columns are added to the log first (an append takes the
            # log's columns as they are); a column the copy lacks stays, NULL in its rows.
            evolution = _evolution(table, schema, wc, mapping, shape.mode)
            schema = evolution.result
            mapping = mapping or evolution.column_mapping
            out.append(Step(seq, table, Action.REPLACE, wc, evolution, schema))
            continue
        if replace or schema is None:
            schema = T.StructType([c.struct_field() for c in wc.columns])
            mapping = mapping or needs_column_mapping(schema.fieldNames())
            out.append(Step(seq, table, Action.REPLACE, wc, schema=schema, afresh=afresh))
            continue
        evolution = _evolution(table, schema, wc, mapping, shape.mode)
        schema = evolution.result
        mapping = mapping or evolution.column_mapping
        out.append(Step(seq, table, Action.MERGE, wc, evolution, schema))
    return out


# Modes whose rows record the past: a column the source dropped stays, NULL in later rows.
KEEPS_DROPPED = frozenset({TargetMode.HISTORY, TargetMode.CHANGELOG})
# Modes whose existing table a re-snapshot rewrites with its copy instead of replacing it:
# closed versions and tombstones stay (.resnapshot). A changelog appends the copy (it keeps its
# past anyway). A re-snapshot for a changed column choice replaces all three (Step.afresh).
KEEPS_PAST = frozenset({TargetMode.HISTORY, TargetMode.SOFT_DELETE})


def kept_schema(current: T.StructType, copy: WindowColumns, mode: TargetMode) -> T.StructType:
    """The data schema of a table a re-snapshot rewrites: the copy's columns, each with the
    table's type when that type holds the copy's (a column widened earlier stays wide), else the
    copy's (the past's values are cast to it, losslessly or not at all: .resnapshot); then, in
    ``history`` and ``changelog``, the table's columns the copy lacks (dropped at the source: the
    past keeps them)."""
    have = {f.name: f for f in current.fields}
    fields = []
    for c in copy.columns:
        old = have.get(c.name)
        if old is not None and can_widen(c.type, old.dataType):
            fields.append(T.StructField(c.name, old.dataType, True, old.metadata))
        else:
            fields.append(c.struct_field())
    if mode in KEEPS_DROPPED:
        names = {c.name for c in copy.columns}
        fields += [f for f in current.fields if f.name not in names]
    return T.StructType(fields)


def _evolution(
    table: str, schema: T.StructType, wc: WindowColumns, mapping: bool, mode: TargetMode
) -> Evolution:
    """The changes that make ``schema`` take the window's columns; in a mode that keeps the
    columns the source dropped (:data:`KEEPS_DROPPED`), without the drops."""
    evolution = evolve(table, schema, wc, column_mapping_enabled=mapping)
    if mode in KEEPS_DROPPED and evolution.drop:
        evolution = keep_dropped(evolution, schema, mapping)
    return evolution


def retyped(current: T.StructType, kept: T.StructType) -> bool:
    """Whether a column of ``current`` has another type in ``kept`` (:func:`kept_schema`)."""
    types = {f.name: f.dataType for f in kept.fields}
    return any(f.name in types and types[f.name] != f.dataType for f in current.fields)


def data_schema(schema: T.StructType, shape: TargetShape) -> T.StructType:
    """A Delta table's schema without its target mode's metadata columns."""
    own = set(shape.columns())
    return T.StructType([f for f in schema.fields if f.name not in own])


def keep_dropped(evolution: Evolution, current: T.StructType, column_mapping_enabled: bool) -> Evolution:
    """``evolution`` without its drops: the dropped columns keep their place in the result."""
    kept = [f for f in current.fields if f.name in evolution.drop]
    mapping = not column_mapping_enabled and needs_column_mapping([f.name for f in evolution.add])
    return dataclasses.replace(
        evolution,
        drop=(),
        column_mapping=mapping,
        result=T.StructType([*evolution.result.fields, *kept]),
    )
