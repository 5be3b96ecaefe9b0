"""The merge job's plan of steps: already applied, replace, merge with evolution, nothing; errors first."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.schema import MergeSchemaError
from airflow_provider_vitess.merge.job.steps import Action, TableState, plan_steps
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError, TableTarget, WindowToMerge
from airflow_provider_vitess.staging.manifest import (
    COLUMN_CHOICE_CHANGED,
    ColumnSchema,
)
from tests.support.manifests import EXTRA, ID, ID64, NAME, NAME_INT, Q, col, manifest, table, w


def plan(*windows: WindowToMerge) -> MergePlan:
    targets = {t: TableTarget(t, f"/delta/{t}", ("id",), ("id",)) for t in ("a", "b")}
    return MergePlan("s", windows, targets)


NEW = TableState(exists=False)


def existing(txn: int | None, *fields: tuple[str, T.DataType]) -> TableState:
    return TableState(True, T.StructType([T.StructField(n, t) for n, t in fields]), txn)


def test_first_window_creates_later_windows_merge_and_missing_tables_have_no_changes() -> None:
    p = plan(w(1, "a", "b"), w(2), w(3))
    ms = [
        manifest(1, table("a", (ID, NAME)), table("b", (ID,))),
        manifest(2, table("a", (ID, NAME), (ID64, NAME, EXTRA))),
        manifest(3, table("a", (ID64, NAME, EXTRA), rows=False)),
    ]
    steps = plan_steps(p, ms, {"a": NEW, "b": NEW})
    assert [(s.seq, s.table, s.action) for s in steps] == [
        (1, "a", Action.REPLACE),
        (1, "b", Action.REPLACE),
        (2, "a", Action.MERGE),
        (2, "b", Action.NO_CHANGES),
        (3, "a", Action.NO_CHANGES),
        (3, "b", Action.NO_CHANGES),
    ]
    merge = steps[2]
    assert merge.evolution is not None and merge.schema is not None
    assert merge.evolution.changes == ["add column extra date", "widen column id int -> bigint"]
    assert merge.schema.fieldNames() == ["id", "name", "extra"]


def test_windows_the_table_already_holds_are_skipped_and_not_checked() -> None:
    p = plan(w(4), w(5), w(6))
    bad = table("a", (ID, NAME_INT))  # incompatible, but already applied: no error
    ms = [manifest(4, bad), manifest(5, bad), manifest(6, table("a", (ID, NAME)))]
    state = existing(5, ("id", T.IntegerType()), ("name", T.StringType()))
    steps = plan_steps(p, ms, {"a": state, "b": NEW})
    assert [s.action for s in steps if s.table == "a"] == [
        Action.ALREADY_APPLIED,
        Action.ALREADY_APPLIED,
        Action.MERGE,
    ]


def test_a_bad_later_window_fails_the_plan_before_any_step() -> None:
    p = plan(w(1), w(2))
    ms = [manifest(1, table("a", (ID, NAME))), manifest(2, table("a", (ID, NAME_INT)))]
    state = existing(None, ("id", T.IntegerType()), ("name", T.StringType()))
    with pytest.raises(MergeSchemaError, match="table 'a' column 'name'"):
        plan_steps(p, ms, {"a": state, "b": NEW})


def test_replace_resets_the_schema_and_an_empty_snapshot_truncates() -> None:
    p = plan(w(7, "a", "b"), w(8))
    ms = [manifest(7, table("a", (ID, NAME_INT), rows=False)), manifest(8, table("a", (ID, NAME_INT)))]
    state = existing(3, ("id", T.IntegerType()), ("name", T.StringType()))
    steps = plan_steps(p, ms, {"a": state, "b": existing(3, ("id", T.IntegerType()))})
    assert [(s.seq, s.table, s.action) for s in steps] == [
        (7, "a", Action.REPLACE),  # a schema and no rows: the table becomes empty, with the new type
        (7, "b", Action.TRUNCATE),  # nothing staged at all for a replaced table
        (8, "a", Action.MERGE),
        (8, "b", Action.NO_CHANGES),
    ]
    assert steps[0].schema is not None and steps[0].schema["name"].dataType == T.IntegerType()


def test_manifests_must_match_the_plan() -> None:
    with pytest.raises(MergePlanError, match="window order"):
        plan_steps(plan(w(1), w(2)), [manifest(2), manifest(1)], {"a": NEW, "b": NEW})


def test_a_dropped_column_is_dropped_by_the_first_window_without_it_and_a_rerun_plans_the_same() -> None:
    p = plan(w(2), w(3), w(4))
    ms = [
        manifest(2, table("a", (ID, NAME, EXTRA), (ID, NAME))),  # rows before and after the DROP
        manifest(3, table("a", (ID, NAME))),
        manifest(4, table("a", (ID, NAME))),
    ]
    before = existing(1, ("id", T.IntegerType()), ("name", T.StringType()), ("extra", T.DateType()))
    steps = [s for s in plan_steps(p, ms, {"a": before, "b": NEW}) if s.table == "a"]
    assert [s.action for s in steps] == [Action.MERGE] * 3
    evolutions = [s.evolution for s in steps]
    assert all(e is not None for e in evolutions)
    assert [e.drop for e in evolutions if e is not None] == [(), ("extra",), ()]
    assert [s.schema.fieldNames() for s in steps if s.schema is not None] == [
        ["id", "name", "extra"],
        ["id", "name"],
        ["id", "name"],
    ]
    # A rerun after the DROP's commit and before window 3's MERGE: the table has no "extra" and
    # txn version 2; the plan drops nothing more and ends at the same schema.
    dropped = TableState(
        True,
        T.StructType([T.StructField("id", T.IntegerType()), T.StructField("name", T.StringType())]),
        2,
        column_mapping=True,
    )
    rerun = [s for s in plan_steps(p, ms, {"a": dropped, "b": NEW}) if s.table == "a"]
    assert [s.action for s in rerun] == [Action.ALREADY_APPLIED, Action.MERGE, Action.MERGE]
    assert all(s.evolution is not None and s.evolution.empty for s in rerun[1:])
    assert rerun[-1].schema == steps[-1].schema


def test_a_changelog_resnapshot_appends_unless_the_column_choice_changed() -> None:
    """A changelog's re-snapshot appends its copy to the log; one the capture marks as taken for
    a changed column choice starts the log afresh (a REPLACE or TRUNCATE with ``afresh``), with
    the copy's schema (a newly hashed INT column: a string)."""
    shape = TargetShape(TargetMode.CHANGELOG, metadata=True)
    targets = {t: TableTarget(t, f"/delta/{t}", ("id",), ("id",), shape=shape) for t in ("a", "b")}
    hashed = col("name", Q.VARCHAR, "char(64)")
    state = existing(3, ("id", T.IntegerType()), ("name", T.IntegerType()))
    copy = manifest(7, table("a", (ID, hashed)), table("b", (ID, hashed), rows=False))
    for marked, afresh in (((), False), (("a", "b"), True)):
        m = dataclasses.replace(copy, stats={COLUMN_CHOICE_CHANGED: list(marked)})
        steps = plan_steps(MergePlan("s", (w(7, "a", "b"),), targets), [m], {"a": state, "b": state})
        assert [(s.table, s.action, s.afresh) for s in steps] == [
            ("a", Action.REPLACE, afresh),
            ("b", Action.REPLACE, afresh),
        ]
        assert steps[0].schema is not None and steps[0].schema["name"].dataType == T.StringType()
    empty = dataclasses.replace(manifest(7), stats={COLUMN_CHOICE_CHANGED: ["a"]})
    steps = plan_steps(MergePlan("s", (w(7, "a"),), targets), [empty], {"a": state, "b": state})
    assert [(s.table, s.action, s.afresh) for s in steps] == [
        ("a", Action.TRUNCATE, True),
        ("b", Action.NO_CHANGES, False),
    ]


def test_a_changelog_resnapshot_casts_the_log_to_a_changed_type_and_adds_a_new_column() -> None:
    """A copy whose column changed type (INT -> VARCHAR) rewrites the log (``past``: its schema
    before, cast by .resnapshot): an append alone fails on the log's type, run after run. A copy
    with a new column adds it first (an append takes the log's columns as they are); the log's
    dropped column stays. A copy like the log appends with nothing to change."""
    shape = TargetShape(TargetMode.CHANGELOG, metadata=True)
    targets = {"a": TableTarget("a", "/delta/a", ("id",), ("id",), shape=shape)}
    gone = ("gone", T.StringType())
    state = {"a": existing(3, ("id", T.IntegerType()), ("name", T.StringType()), gone)}

    def step(*cols: ColumnSchema) -> Any:
        (only,) = plan_steps(MergePlan("s", (w(7, "a"),), targets), [manifest(7, table("a", cols))], state)
        assert only.action is Action.REPLACE and not only.afresh
        return only

    retyped = step(ID, NAME_INT)
    assert retyped.past == state["a"].schema and retyped.evolution is None
    assert [(f.name, f.dataType) for f in retyped.schema.fields] == [
        ("id", T.IntegerType()),
        ("name", T.IntegerType()),
        gone,
    ]
    added = step(ID, NAME, EXTRA)
    assert added.past is None and added.evolution is not None
    assert added.evolution.changes == ["add column extra date"]
    assert sorted(added.schema.fieldNames()) == ["extra", "gone", "id", "name"]
    same = step(ID, NAME)
    assert same.past is None and same.evolution is not None and same.evolution.empty
    assert same.schema == state["a"].schema
