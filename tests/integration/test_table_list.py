"""A sync's table list changed between runs, through the DAG factory and Airflow itself: a new
table is copied on its own by the next run's snapshot task while the other keeps streaming; a
table that left keeps its Delta table as it was; when it comes back, the changes it missed are
there. Real Vitess, Spark, Delta; tables of its own in the unsharded ``commerce`` keyspace."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.conftest import LocalVitess, connection_uri_env
from tests.integration.airflow_env import AirflowEnv, make_airflow_env
from tests.integration.delta_check import assert_delta_equals_source, delta_txns

pytestmark = pytest.mark.integration

STAYS, COMES_AND_GOES = "tablelist_stays", "tablelist_comes_and_goes"
SYNC = "table_list_sync"

DAGS = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

for dag_id, tables in [("table_list_one", ["{stays}"]), ("table_list_two", ["{stays}", "{goes}"])]:
    globals()[dag_id] = vitess_sync_dag(
        dag_id,
        sync_id="{sync}",
        keyspace="commerce",
        tables=tables,
        staging_location="{lake}/staging",
        target_location="{lake}/delta",
        schedule=None,
        sensor_timeout=20,
        default_args={{"retries": 0}},
        spark_conf={{"spark.jars.ivy": os.environ["VITESS_SPARK_IVY"], "spark.sql.shuffle.partitions": "4"}},
    )
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_table_list", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_table_list")
        yield from _tables(hook)


def _tables(hook: VitessHook) -> Iterator[VitessHook]:
    body = "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))"
    with hook.connect_sql() as conn, conn.begin():
        for table in (STAYS, COMES_AND_GOES):
            conn.execute(sqlalchemy.text(f"CREATE TABLE IF NOT EXISTS commerce.{table} {body}"))
            conn.execute(sqlalchemy.text(f"DELETE FROM commerce.{table}"))
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="module")
def airflow(vitess: LocalVitess, lake: Path, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess)
    env.write_dag("table_list_dags", DAGS.format(stays=STAYS, goes=COMES_AND_GOES, sync=SYNC, lake=lake))
    return env


_ids = itertools.count(1)


def _workload(hook: VitessHook) -> None:
    """Inserts, an update and a delete in both tables."""
    with hook.connect_sql() as conn, conn.begin():
        for table in (STAYS, COMES_AND_GOES):
            ids = [next(_ids) for _ in range(5)]
            conn.execute(
                sqlalchemy.text(f"INSERT INTO commerce.{table} VALUES (:id, :note)"),
                [{"id": i, "note": f"row {i}"} for i in ids],
            )
            conn.execute(
                sqlalchemy.text(f"UPDATE commerce.{table} SET note = 'updated' WHERE id = :id"),
                {"id": ids[0]},
            )
            conn.execute(sqlalchemy.text(f"DELETE FROM commerce.{table} WHERE id = :id"), {"id": ids[1]})


def _ok(result: dict[str, object], *tasks: str) -> None:
    states = result["tasks"]
    assert isinstance(states, dict)
    bad = {t: states.get(t) for t in tasks if states.get(t) != "success"}
    assert not bad, f"tasks not successful: {bad}; all: {states}\n{str(result['log'])[-5000:]}"


def test_a_table_added_to_a_running_sync_or_back_after_leaving_it_is_snapshotted_on_its_own(
    airflow: AirflowEnv, hook: VitessHook, lake: Path
) -> None:
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    both = (STAYS, COMES_AND_GOES)
    _workload(hook)
    _ok(airflow.run_dag("table_list_one"), "snapshot", "merge_snapshot")
    assert not (lake / "delta" / COMES_AND_GOES).exists()

    _workload(hook)
    added = airflow.run_dag("table_list_two")
    _ok(added, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert f"re-snapshot of {COMES_AND_GOES}" in str(added["log"])
    assert_delta_equals_source(hook, "commerce", both, lake / "delta")

    _workload(hook)  # the table that leaves changes while it is out of the sync
    left = airflow.run_dag("table_list_one")
    _ok(left, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert f"table '{COMES_AND_GOES}' left the sync's tables; its Delta table stays as of window" in str(
        left["log"]
    )
    assert store.sync_config(SYNC)["removed_tables"] == {COMES_AND_GOES: store.committed(SYNC)[1] - 1}
    before = max(v for _, _, v in delta_txns(lake / "delta" / COMES_AND_GOES))
    assert_delta_equals_source(hook, "commerce", (STAYS,), lake / "delta")

    back = airflow.run_dag("table_list_two")
    _ok(back, "snapshot", "merge_snapshot")
    assert f"re-snapshot of {COMES_AND_GOES}" in str(back["log"])
    assert max(v for _, _, v in delta_txns(lake / "delta" / COMES_AND_GOES)) > before
    assert_delta_equals_source(hook, "commerce", both, lake / "delta")
    assert store.sync_config(SYNC)["removed_tables"] == {}
