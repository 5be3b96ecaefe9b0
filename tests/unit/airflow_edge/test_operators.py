"""The operators' pure parts and the DAG factory's shape (no server needed)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.dag_factory import RESNAPSHOT_PARAM, vitess_sync_dag
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.runner import build_plan
from airflow_provider_vitess.operators._sync import as_tables, store_url, sync_spec
from airflow_provider_vitess.operators.capture import VitessSnapshotOperator
from airflow_provider_vitess.operators.follow import VitessFollowOperator
from airflow_provider_vitess.vgtid import Vgtid


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ([], ()),
        (["a", "b"], ("a", "b")),
        ("a, b", ("a", "b")),
        ('["a", "b"]', ("a", "b")),
        ("", ()),
    ],
)
def test_tables_come_as_lists_or_rendered_text(value: object, expected: tuple[str, ...]) -> None:
    assert as_tables(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("sync_id", ["", "has space", "../escape", "x" * 129])
def test_a_sync_id_that_cannot_name_a_directory_is_refused(sync_id: str) -> None:
    with pytest.raises(VitessProviderError, match="sync_id"):
        sync_spec(sync_id=sync_id, keyspace="ks", tables=("t",), staging_location="/tmp/s")


def test_the_store_url_comes_from_an_airflow_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_META_PG",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db",
                "port": 5432,
                "login": "u",
                "password": "p@ss",
                "schema": "m",
            }
        ),
    )
    assert store_url("meta_pg") == "postgresql+psycopg://u:p%40ss@db:5432/m"
    monkeypatch.setenv("AIRFLOW_HOME", "/srv/af")
    assert store_url(None) == "sqlite:////srv/af/vitess_sync.db"


def test_the_merge_plan_uses_the_recorded_key_and_replaces_only_the_snapshotted_tables(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    keys = {
        "customer": KeyChoice(
            "customer", ("customer_id",), ("customer_id",), "PRIMARY", "primary key", ("customer_id",)
        ),
        "corder": KeyChoice("corder", ("order_id",), ("id",), "PRIMARY", "renamed", ("order_id",)),
    }
    store.ensure_sync(
        "s1", "customer", ["customer", "corder"], {"keys": {t: k.to_dict() for t, k in keys.items()}}
    )
    start = Vgtid.for_keyspace("customer", "")
    seq = store.plan_window("s1", WindowKind.SNAPSHOT, start)
    store.update_progress("s1", seq, "customer", rows_copied=0)
    store.mark_staged("s1", seq, start, "/stage/s1/window=0000000001/_manifest.json")

    plan = build_plan(store, "s1", store.window("s1", seq), "s3a://lake/delta/")
    assert MergePlan.from_json(plan.to_json()) == plan
    assert [(w.seq, w.replace_tables) for w in plan.windows] == [(1, ("customer",))]
    assert plan.targets["customer"].path == "s3a://lake/delta/customer"
    order = plan.targets["corder"]
    assert (order.key_columns, order.key_from_source, dict(order.renames)) == (
        ("id",),
        ("order_id",),
        {"order_id": "id"},
    )


def test_the_factory_builds_snapshot_merge_sense_catch_up_merge() -> None:
    dag = vitess_sync_dag(
        "sync_x",
        keyspace="customer",
        tables=["customer", "corder"],
        staging_location="/s",
        target_location="/t",
    )
    order = ["snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge"]
    for upstream, downstream in itertools.pairwise(order):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    assert dag.max_active_runs == 1
    assert dag.params[RESNAPSHOT_PARAM] == []
    schema = dag.params.get_param(RESNAPSHOT_PARAM).schema
    assert schema["items"]["enum"] == ["customer", "corder"]
    snapshot = dag.get_task("snapshot")
    assert isinstance(snapshot, VitessSnapshotOperator)
    assert snapshot.resnapshot_tables == "{{ params.resnapshot_tables }}"


def test_on_changes_runs_continuously_behind_a_long_deferred_wait() -> None:
    dag = vitess_sync_dag(
        "sync_c", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t", on_changes=True
    )
    assert type(dag.timetable).__name__ == "ContinuousTimetable" and dag.max_active_runs == 1
    sensor = dag.get_task("wait_for_changes")
    assert sensor.deferrable is True and sensor.timeout == 3600.0  # type: ignore[union-attr]
    assert dag.get_task("catch_up").max_seconds is None, "a continuous run reads until caught up"  # type: ignore[union-attr]
    clocked = vitess_sync_dag(
        "sync_d", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t"
    )
    assert clocked.get_task("wait_for_changes").timeout == 60.0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="on_changes=True waits for changes with the deferrable sensor"):
        vitess_sync_dag(
            "sync_e", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
            on_changes=True, wait_for_changes=False,
        )  # fmt: skip


def test_follow_seconds_puts_one_task_that_catches_up_and_merges_behind_the_sensor() -> None:
    dag = vitess_sync_dag(
        "sync_f", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
        on_changes=True, follow_seconds=300, max_events=50,
    )  # fmt: skip
    assert set(dag.task_dict) == {"snapshot", "merge_snapshot", "wait_for_changes", "follow"}
    follow = dag.get_task("follow")
    assert isinstance(follow, VitessFollowOperator)
    assert [t.task_id for t in follow.upstream_list] == ["wait_for_changes"] and not follow.downstream_list
    assert follow.bounds.seconds == 300.0 and follow.bounds.idle_seconds == 60.0
    assert follow.sync_id == "sync_f" and follow.target_location == "/t"
    assert follow.catch_up["max_events"] == 50 and follow.catch_up["tables"] == ["t"]
    assert follow.catch_up["staging_location"] == "/s" and follow.catch_up["max_seconds"] is None
    with pytest.raises(ValueError, match="set on_changes=True too"):
        vitess_sync_dag(
            "sync_h", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
            follow_seconds=300,
        )  # fmt: skip
    with pytest.raises(ValueError, match="the follow task reads in one process; drop capture_parallelism"):
        vitess_sync_dag(
            "sync_i", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
            on_changes=True, follow_seconds=300, capture_parallelism=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="follow_seconds"):
        vitess_sync_dag(
            "sync_j", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
            on_changes=True, follow_seconds=0,
        )  # fmt: skip


@pytest.mark.parametrize("split", [2, ["80-", "-80"]])
def test_the_factory_maps_the_catch_up_over_the_groups_of_a_split(split: int | list[str]) -> None:
    dag = vitess_sync_dag(
        "sync_g",
        keyspace="ks",
        tables=["t"],
        staging_location="/s",
        target_location="/t",
        capture_parallelism=split,
    )
    plan = dag.get_task("plan_catch_up")
    assert plan.capture_parallelism == (2 if split == 2 else ("80-", "-80"))  # type: ignore[union-attr]
    assert dag.get_task("catch_up").upstream_task_ids == {"plan_catch_up"}
    one = vitess_sync_dag("sync_1", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t")
    assert "plan_catch_up" not in one.task_ids


def test_the_factory_refuses_key_ranges_that_do_not_tile_the_keyspace() -> None:
    with pytest.raises(
        ValueError, match=r"DAG 'sync_h': capture_parallelism's key ranges \['-80', 'c0-'\] do not"
    ):
        vitess_sync_dag(
            "sync_h", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
            capture_parallelism=["-80", "c0-"],
        )  # fmt: skip


@pytest.mark.parametrize(
    ("tables", "expected"), [("customer", ["customer"]), ("customer, corder", ["customer", "corder"])]
)
def test_the_factory_takes_one_table_name_as_one_table(tables: str, expected: list[str]) -> None:
    dag = vitess_sync_dag(
        "sync_s", keyspace="customer", tables=tables, staging_location="/s", target_location="/t"
    )
    for task_id in ("snapshot", "catch_up", "wait_for_changes"):
        assert list(dag.get_task(task_id).tables) == expected, task_id  # type: ignore[union-attr]
    for task_id in ("merge_snapshot", "merge"):  # each Delta table an outlet
        assert list(dag.get_task(task_id).table_uris) == expected, task_id  # type: ignore[union-attr]
    assert dag.params.get_param(RESNAPSHOT_PARAM).schema["items"]["enum"] == expected


def test_the_factory_refuses_an_empty_table_list() -> None:
    with pytest.raises(ValueError, match="no tables"):
        vitess_sync_dag("sync_y", keyspace="k", tables=[], staging_location="/s", target_location="/t")
