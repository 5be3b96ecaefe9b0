"""Target modes' options, their checks and the shape a Delta table records (no Spark job)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pyspark.sql import types as T

from airflow_provider_vitess.exceptions import TargetModeChangedError, TargetModeError, is_permanent
from airflow_provider_vitess.merge.job.integrity import check_targets
from airflow_provider_vitess.merge.job.shapes import meta_fields
from airflow_provider_vitess.merge.job.steps import TableState, data_schema, plan_steps
from airflow_provider_vitess.merge.modes import (
    ModeOptions,
    TargetMode,
    TargetShape,
    collisions,
    recorded_shape,
    resolve_shapes,
    shape_marker,
)
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget
from tests.support.manifests import ID, NAME, manifest, table, w


def test_defaults_and_overrides_per_table() -> None:
    shapes = resolve_shapes(
        ["a", "b", "c"],
        {"b": {"mode": "history"}, "c": {"mode": "changelog", "metadata_columns": False, "path": "/x"}},
        target_mode="soft_delete",
        metadata_prefix="_cdc_",
    )
    assert shapes["a"] == TargetShape(TargetMode.SOFT_DELETE, True, "_cdc_")
    assert shapes["b"] == TargetShape(TargetMode.HISTORY, True, "_cdc_")
    assert shapes["c"] == TargetShape(TargetMode.CHANGELOG, False, "_cdc_")
    # Metadata columns: opt-in for mirror.
    assert resolve_shapes(["a"], None)["a"] == TargetShape()
    assert resolve_shapes(["a"], None, metadata_columns=True)["a"].columns() == (
        "_vitess_op",
        "_vitess_commit_ts",
        "_vitess_window_seq",
        "_vitess_synced_at",
    )
    # A changelog's own columns are there without the common ones.
    assert TargetShape(TargetMode.CHANGELOG).columns() == (
        "_vitess_op",
        "_vitess_commit_ts",
        "_vitess_window_seq",
        "_vitess_shard",
        "_vitess_order",
    )


@pytest.mark.parametrize(
    ("kwargs", "targets", "said"),
    [
        (
            {"target_mode": "scd2"},
            None,
            "target_mode: target mode 'scd2' is not one of 'mirror', 'soft_delete'",
        ),
        ({}, {"a": {"mode": "audit"}}, "targets['a']['mode']: target mode 'audit' is not one of"),
        ({}, {"a": {"modes": "history"}}, "targets['a'] has unknown key(s) ['modes']"),
        ({}, {"a": {"metadata_columns": "yes"}}, "targets['a']['metadata_columns'] must be true or false"),
        ({"metadata_prefix": "1x"}, None, "metadata_prefix '1x' is not a column name prefix"),
        ({"metadata_prefix": "a-b"}, None, "metadata_prefix 'a-b' is not a column name prefix"),
    ],
)
def test_bad_options_are_refused_naming_them(kwargs: dict, targets: dict | None, said: str) -> None:
    with pytest.raises(TargetModeError) as err:
        resolve_shapes(["a"], targets, **kwargs)
    assert said in str(err.value)
    assert is_permanent(err.value)


def test_the_operator_and_factory_refuse_bad_options_when_the_dag_is_parsed() -> None:
    from airflow_provider_vitess.dag_factory import vitess_sync_dag

    with pytest.raises(TargetModeError, match="target mode 'scd2' is not one of"):
        vitess_sync_dag(
            "d", keyspace="k", tables=["a"], staging_location="/s", target_location="/t", target_mode="scd2"
        )
    dag = vitess_sync_dag(
        "d", keyspace="k", tables=["a", "b"], staging_location="/s", target_location="/t",
        target_mode="history", targets={"b": {"mode": "changelog"}}, change_data_feed=True,
    )  # fmt: skip
    merge = dag.get_task("merge")
    assert getattr(merge, "modes") == ModeOptions("history", None, "_vitess_", True)  # noqa: B009
    assert getattr(merge, "targets") == {"b": {"mode": "changelog"}}  # noqa: B009


def test_the_shape_is_recorded_in_the_first_metadata_column_and_read_back() -> None:
    shape = TargetShape(TargetMode.HISTORY, True, "_v_")
    schema = T.StructType([T.StructField("id", T.LongType()), *meta_fields(shape)])
    assert recorded_shape(shape_marker(schema)) == shape
    # Through JSON, as Delta keeps the schema.
    again = T.StructType.fromJson(json.loads(schema.json()))
    assert recorded_shape(shape_marker(again)) == shape
    assert shape_marker(T.StructType([T.StructField("id", T.LongType())])) == {}
    assert data_schema(schema, shape).fieldNames() == ["id"]


def _plan(shape: TargetShape) -> MergePlan:
    return MergePlan("s", (w(2),), {"a": TableTarget("a", "/delta/a", ("id",), ("id",), shape=shape)})


def test_a_mode_change_is_refused_before_anything_is_written() -> None:
    built = TargetShape(TargetMode.HISTORY, True)
    schema = T.StructType([T.StructField("id", T.IntegerType()), *meta_fields(built)])
    state = TableState(exists=True, schema=schema, txn_version=1, version=3)
    check_targets(_plan(built), {"a": state})  # the same shape: fine
    check_targets(_plan(TargetShape(TargetMode.HISTORY, True, change_data_feed=True)), {"a": state})
    with pytest.raises(TargetModeChangedError) as err:
        check_targets(_plan(TargetShape(TargetMode.CHANGELOG)), {"a": state})
    said = str(err.value)
    assert "was built in mode 'history' (metadata columns _vitess_*)" in said
    assert "asks for mode 'changelog' (no metadata columns)" in said
    assert "nothing was written" in said and '{"resnapshot_tables": ["a"]}' in said
    assert is_permanent(err.value)
    # A table built before target modes existed is a plain mirror.
    plain = TableState(
        exists=True, schema=T.StructType([T.StructField("id", T.IntegerType())]), txn_version=1
    )
    with pytest.raises(TargetModeChangedError, match="built in mode 'mirror'"):
        check_targets(_plan(TargetShape(TargetMode.SOFT_DELETE, True)), {"a": plain})


def test_a_source_column_named_like_a_metadata_column_is_refused() -> None:
    shape = TargetShape(TargetMode.SOFT_DELETE, True)
    assert collisions(shape, ["id", "_VITESS_deleted", "_vitess_op", "x"]) == [
        "_VITESS_deleted",
        "_vitess_op",
    ]
    clash = dataclasses.replace(NAME, name="_vitess_deleted")
    with pytest.raises(TargetModeError, match=r"source column\(s\) \['_vitess_deleted'\] have the names"):
        plan_steps(
            _plan(shape), [manifest(2, table("a", (ID, NAME, clash)))], {"a": TableState(exists=False)}
        )


def test_history_and_changelog_keep_a_dropped_column() -> None:
    for mode, kept in (
        (TargetMode.HISTORY, True),
        (TargetMode.CHANGELOG, True),
        (TargetMode.SOFT_DELETE, False),
    ):
        shape = TargetShape(mode, True)
        schema = T.StructType(
            [T.StructField("id", T.IntegerType()), T.StructField("name", T.StringType()), *meta_fields(shape)]
        )
        state = TableState(exists=True, schema=schema, txn_version=1)
        (step,) = plan_steps(_plan(shape), [manifest(2, table("a", (ID,)))], {"a": state})
        assert step.evolution is not None and step.schema is not None
        assert ("name" in step.schema.fieldNames()) is kept, mode
        assert (step.evolution.drop == ()) is kept
        assert not any(n.startswith("_vitess_") for n in step.schema.fieldNames())
