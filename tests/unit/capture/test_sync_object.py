"""The sync object (``capture/sync.py``): its refusals name their field, it round-trips through
JSON, and the DAG factory builds the same DAG from it as from the keyword form."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from airflow_provider_vitess.capture.sync import (
    CaptureSettings,
    ChangeWait,
    ReadBudget,
    SparkConnect,
    SparkSubmit,
    TableSpec,
    TargetDefaults,
    VitessSync,
    domain_error,
)
from airflow_provider_vitess.capture.sync_keywords import sync_from_keywords
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from airflow_provider_vitess.exceptions import (
    ColumnChoiceError,
    KeyChoiceError,
    SyncSettingsError,
    TargetModeError,
    VitessProviderError,
)

BASE: dict[str, Any] = {"keyspace": "k", "staging_location": "/s", "target_location": "/t"}


@pytest.mark.parametrize(
    ("settings", "error", "said"),
    [
        ({"tables": [{"name": "corder", "hash_columns": ["a", "a"]}]}, ColumnChoiceError,
         r"^tables\[corder\]\.hash_columns: hash_columns\['corder'\] names column\(s\) a more than once"),
        ({"tables": [{"name": "corder", "hash_columns": ["a"]}]}, ColumnChoiceError,
         r"^tables\[corder\]\.hash_columns: hash_columns need hash_salt_conn_id, an Airflow connection"),
        ({"tables": [{"name": "corder", "include_columns": ["a"], "exclude_columns": ["b"]}]},
         ColumnChoiceError, r"^tables\[corder\]\.exclude_columns: table 'corder' has both include_columns"),
        ({"tables": [{"name": "corder", "include_columns": "a", "hash_columns": "b"}],
          "hash_salt_conn_id": "salt"}, ColumnChoiceError,
         r"^tables\[corder\]\.hash_columns: table 'corder': hash_columns \['b'\] are not read"),
        ({"tables": [{"name": "corder", "include_columns": []}]}, ColumnChoiceError,
         r"^tables\[corder\]\.include_columns: include_columns\['corder'\] is empty: name the columns"),
        ({"tables": [{"name": "corder", "key_overrides": {"source_unique": ["a"]}}]}, KeyChoiceError,
         r"^tables\[corder\]\.key_overrides: unknown key override\(s\) source_unique; known:"),
        ({"tables": [{"name": "corder", "zero_date_policy": "zero"}]}, VitessProviderError,
         r"^tables\[corder\]\.zero_date_policy 'zero' is not one of 'null', 'epoch', 'error'"),
        ({"tables": [{"name": "corder", "mode": "scd2"}]}, TargetModeError,
         r"^tables\[corder\]\.mode: target mode 'scd2' is not one of"),
        ({"tables": [{"name": "corder", "table_features": ["x"]}]}, TargetModeError,
         r"^tables\[corder\]\.table_features: unknown table feature\(s\) \['x'\]; allowed:"),
        ({"tables": ["a", "a"]}, SyncSettingsError, r"^tables: table\(s\) \['a'\] given more than once"),
        ({"tables": []}, SyncSettingsError, r"^tables: no tables given; name at least one"),
        ({"tables": "a", "sync_id": "bad id"}, VitessProviderError,
         r"^sync_id 'bad id' must be 1-128 letters"),
        ({"tables": "a", "capture_parallelism": 0}, ValueError, r"^capture_parallelism must be 1 or more"),
        ({"tables": "a", "capture_parallelism": ["-80", "c0-"]}, ValueError,
         r"^capture_parallelism's key ranges \['-80', 'c0-'\] do not tile the keyspace"),
        ({"tables": "a", "target": {"mode": "x"}}, TargetModeError, r"^target\.mode: target mode 'x' is not"),
        ({"tables": "a", "target": {"metadata_prefix": "1x"}}, TargetModeError,
         r"^target\.metadata_prefix '1x' is not a column name prefix"),
        ({"tables": "a", "capture": {"zero_date_policy": "never"}}, VitessProviderError,
         r"^capture\.zero_date_policy 'never' is not one of"),
        ({"tables": "a", "wait": {"on_changes": True, "deferrable": False}}, SyncSettingsError,
         r"^wait\.on_changes: on_changes=True waits for changes with the deferrable sensor"),
        ({"tables": "a", "former_tables": [{"name": "b", "hash_columns": ["x"]}]}, SyncSettingsError,
         r"^former_tables\[b\]: \['hash_columns'\] are capture settings of a table the sync no longer"),
        ({"tables": "a", "former_tables": [{"name": "a", "mode": "history"}]}, SyncSettingsError,
         r"^former_tables\[a\]: the table is among the sync's tables"),
    ],
)  # fmt: skip
def test_each_refusal_names_its_field_with_the_rules_own_error(
    settings: dict[str, Any], error: type[Exception], said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        VitessSync(**BASE, **settings)
    inner = domain_error(caught.value)
    assert isinstance(inner, error)
    assert caught.value.error_count() == 1
    with pytest.raises(error, match=said):
        raise inner
    # The ValidationError says it too (the field first), and never prints the settings given.
    assert said.lstrip("^").split(":")[0].replace("\\", "") in str(caught.value)
    assert "input_value" not in str(caught.value)


def test_type_errors_and_unknown_settings_are_pydantics_naming_the_field() -> None:
    not_bool = r"tables\.0\.metadata_columns\n  Input should be a valid boolean"
    with pytest.raises(ValidationError, match=not_bool):
        VitessSync(**BASE, tables=[{"name": "a", "metadata_columns": "yes"}])
    extra = r"merge\.spark_connect\.packages\n  Extra inputs are not permitted"
    with pytest.raises(ValidationError, match=extra):
        VitessSync(**BASE, tables="a", merge={"backend": "spark_connect", "packages": "x"})
    with pytest.raises(ValidationError, match=r"tables\.0\.hash_column\n  Extra inputs are not permitted"):
        VitessSync(**BASE, tables=[{"name": "a", "hash_column": ["x"]}])


def test_a_keyword_mapping_naming_a_table_not_in_the_sync_is_refused_naming_it() -> None:
    kw = {**BASE, "tables": ["corder"]}
    with pytest.raises(ColumnChoiceError, match=r"hash_columns names table\(s\) \['ordr'\], not among"):
        sync_from_keywords(**kw, hash_columns={"ordr": ["x"]}, hash_salt_conn_id="salt")
    with pytest.raises(VitessProviderError, match=r"zero_date_policies names \['ordr'\], not among"):
        sync_from_keywords(**kw, zero_date_policies={"ordr": "error"})
    with pytest.raises(SyncSettingsError, match=r"key_overrides names \['ordr'\], not among the sync's"):
        sync_from_keywords(**kw, key_overrides={"ordr": {"source_unique_key_columns": ["id"]}})
    with pytest.raises(SyncSettingsError, match=r"key_columns names \['ordr'\], not among"):
        vitess_sync_dag("d", **kw, key_columns={"ordr": ["id"]})
    # A targets entry of another table: a table that left the sync, its windows still merged.
    sync = sync_from_keywords(**kw, targets={"gone": {"path": "/elsewhere"}})
    assert sync.former_tables == (TableSpec(name="gone", path="/elsewhere"),)
    assert sync.targets() == {"gone": {"path": "/elsewhere"}}


FULL = VitessSync(
    keyspace="customer",
    tables=[
        "customer",
        TableSpec(
            name="corder",
            key_overrides={"source_unique_key_columns": ["order_id"]},
            hash_columns=["email"],
            exclude_columns=["notes"],
            zero_date_policy="epoch",
            mode="history",
            renames={"sku": "product"},
            table_features=["type_widening"],
        ),
    ],
    former_tables=[{"name": "legacy", "path": "/lake/legacy"}],
    staging_location="s3a://lake/staging",
    target_location="s3a://lake/delta",
    sync_id="orders",
    hash_salt_conn_id="salt",
    budget=ReadBudget(max_events=1000, max_seconds=60),
    wait=ChangeWait(on_changes=True, lag_threshold=500),
    target=TargetDefaults(mode="soft_delete", change_data_feed=True),
    capture=CaptureSettings(
        spill_dir="/big", copy_stall_timeout=7200, storage_options={"anon": False}, minimize_skew=True
    ),
    merge=SparkConnect(conn_id="connect", conf={"spark.sql.shuffle.partitions": "4"}),
    capture_parallelism=["-80", "80-"],
    freshness_sla=600,
)


def test_the_object_round_trips_through_json() -> None:
    dumped = FULL.model_dump(mode="json")
    assert VitessSync.model_validate(dumped) == FULL
    assert VitessSync.model_validate_json(FULL.model_dump_json()) == FULL
    assert dumped["merge"] == {
        "backend": "spark_connect",
        "conn_id": "connect",
        "conf": {"spark.sql.shuffle.partitions": "4"},
    }
    assert dumped["tables"][1]["hash_columns"] == ["email"]
    with pytest.raises(ValidationError, match="frozen"):
        FULL.keyspace = "other"  # type: ignore[misc]


def test_the_per_table_mappings_are_derived_from_the_tables() -> None:
    capture = FULL.capture_arguments("orders")
    assert capture["hash_columns"] == {"corder": ["email"]}
    assert capture["exclude_columns"] == {"corder": ["notes"]}
    assert capture["include_columns"] == {}
    assert capture["zero_date_policies"] == {"corder": "epoch"}
    assert capture["key_overrides"] == {"corder": {"source_unique_key_columns": ["order_id"]}}
    assert FULL.targets() == {
        "corder": {"mode": "history", "renames": {"sku": "product"}, "table_features": ["type_widening"]},
        "legacy": {"path": "/lake/legacy"},
    }


def _task_state(dag: Any) -> dict[str, Any]:
    """Each task's class, the arguments it was built with (a mapped task's partial and expand
    arguments), and its neighbours."""
    out = {}
    for task_id, task in dag.task_dict.items():
        if hasattr(task, "partial_kwargs"):
            given = {**_own(task.partial_kwargs), "expand": repr(task.expand_input)}
        else:
            given = _own(task._BaseOperator__init_kwargs)
        out[task_id] = (type(task).__name__, given, sorted(task.upstream_task_ids))
    return out


def _own(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The DAG and task group are the DAG's own objects (they point back at every task).
    return {k: v for k, v in kwargs.items() if k not in ("dag", "task_group")}


KEYWORD_CALLS: list[dict[str, Any]] = [
    {"tables": "customer, corder"},
    {
        "tables": ["customer", "corder"],
        "sync_id": "orders",
        "key_columns": {"customer": ["id"]},
        "include_columns": {"customer": ["id", "name"]},
        "hash_columns": {"customer": ["name"]},
        "hash_salt_conn_id": "salt",
        "zero_date_policy": "error",
        "zero_date_policies": {"corder": "null"},
        "max_events": 500,
        "target_mode": "history",
        "targets": {"corder": {"mode": "changelog", "path": "/x/corder"}},
        "spark_conf": {"spark.sql.shuffle.partitions": "4"},
        "merge_kwargs": {"spark_binary": "/bin/spark-submit", "executor_memory": "2g"},
        "freshness_sla": 300,
    },
    {
        "tables": ["corder"],
        "capture_parallelism": 2,
        "wait_for_changes": False,
        "merge_kwargs": {"spark_connect_conn_id": "spark_connect_default"},
        "change_data_feed": True,
        "table_features": ["deletion_vectors"],
    },
    {"tables": ["corder"], "on_changes": True, "lag_threshold": 100, "sensor_timeout": 30},
]


@pytest.mark.parametrize("keywords", KEYWORD_CALLS)
def test_the_keyword_form_and_the_object_build_the_same_dag(keywords: dict[str, Any]) -> None:
    by_keywords = vitess_sync_dag("d", **BASE, **keywords)
    sync = sync_from_keywords(**BASE, **keywords)
    by_object = vitess_sync_dag("d", sync=sync)
    by_json = vitess_sync_dag("d", sync=sync.model_dump(mode="json"))
    assert set(by_keywords.task_dict) == set(by_object.task_dict)
    assert _task_state(by_keywords) == _task_state(by_object) == _task_state(by_json)
    assert by_keywords.schedule == by_object.schedule


def test_settings_the_keyword_form_could_not_reach_reach_the_tasks() -> None:
    dag = vitess_sync_dag("d", sync=FULL)
    tasks: dict[str, Any] = dag.task_dict
    assert type(dag.timetable).__name__ == "ContinuousTimetable"  # on_changes
    copy = tasks["snapshot"].partial_kwargs
    assert (copy["spill_dir"], copy["copy_stall_timeout"]) == ("/big", 7200)
    assert copy["storage_options"] == {"anon": False}
    read = tasks["catch_up"].partial_kwargs
    assert (read["minimize_skew"], read["max_events"], read["max_seconds"]) == (True, 1000, 60)
    merge = tasks["merge"]
    assert merge.spark_connect_conn_id == "connect"
    assert merge.connect_conf == {"spark.sql.shuffle.partitions": "4"}
    assert merge.targets["legacy"] == {"path": "/lake/legacy"}
    sensor = tasks["wait_for_changes"]
    assert (sensor.timeout, sensor.lag_threshold) == (3600.0, 500)
    jars = SparkSubmit(arguments={"jars": "a.jar"})
    submit = vitess_sync_dag("d2", sync=FULL.model_copy(update={"merge": jars}))
    assert getattr(submit.get_task("merge"), "jars") == "a.jar"  # noqa: B009


def test_the_object_and_keywords_together_are_refused() -> None:
    with pytest.raises(TypeError, match=r"give the sync as sync= or as keywords, not both: \['max_events'\]"):
        vitess_sync_dag("d", sync=FULL, max_events=5)
