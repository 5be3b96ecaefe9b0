"""What changes around a running sync, through the DAG factory and Airflow itself: its table list
(a table added, removed, put back), its staged files (lost before their merge) and its checkpoint
store (replaced by an empty one, then copied). Real Vitess, Spark, Delta; tables of its own in
the unsharded ``commerce`` keyspace, so it runs beside the modules that share the cluster's.
The tests run in order: each goes on from the sync the one before left."""

from __future__ import annotations

import itertools
import json
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import (
    CONNECT_UNLESS_SUBMIT,
    AirflowEnv,
    assert_succeeded,
    make_airflow_env,
)
from tests.support.delta_check import assert_delta_equals_source, delta_txns
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

STAYS, COMES_AND_GOES = "tablelist_stays", "tablelist_comes_and_goes"
SYNC = "table_list_sync"

DAGS = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

for dag_id, tables, store in [
    ("table_list_one", ["{stays}"], None),
    ("table_list_two", ["{stays}", "{goes}"], None),
    # The same sync after its checkpoint store was replaced by an empty one.
    ("table_list_new_store", ["{stays}", "{goes}"], "new_store"),
]:
    globals()[dag_id] = vitess_sync_dag(
        dag_id,
        sync_id="{sync}",
        keyspace="commerce",
        tables=tables,
        checkpoint_conn_id=store,
        staging_location="{lake}/staging",
        target_location="{lake}/delta",
        schedule=None,
        sensor_timeout=20,
        default_args={{"retries": 0}},
        merge_kwargs={merge_kwargs},
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
def airflow(
    vitess: LocalVitess, lake: Path, tmp_path_factory: pytest.TempPathFactory, spark_connect: str
) -> AirflowEnv:
    # Merges on Spark Connect (a spark-submit per merge task made this module the suite's slowest);
    # the test that injects a failing spark-submit gets spark-submit for that run.
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess, spark_connect=spark_connect)
    source = DAGS.format(
        stays=STAYS, goes=COMES_AND_GOES, sync=SYNC, lake=lake, merge_kwargs=CONNECT_UNLESS_SUBMIT
    )
    env.write_dag("table_list_dags", source)
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


def _store(airflow: AirflowEnv) -> CheckpointStore:
    return CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")


BOTH = (STAYS, COMES_AND_GOES)


def test_a_table_added_to_a_running_sync_or_back_after_leaving_it_is_snapshotted_on_its_own(
    airflow: AirflowEnv, hook: VitessHook, lake: Path
) -> None:
    """A new table is copied on its own by the next run's snapshot task while the other keeps
    streaming; a table that left keeps its Delta table as it was; when it comes back, the
    changes it missed are there."""
    store = _store(airflow)
    both = BOTH
    _workload(hook)
    assert_succeeded(airflow.run_dag("table_list_one"), "snapshot", "merge_snapshot")
    assert not (lake / "delta" / COMES_AND_GOES).exists()

    _workload(hook)
    added = airflow.run_dag("table_list_two")
    assert_succeeded(added, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert f"re-snapshot of {COMES_AND_GOES}" in str(added["log"])
    assert_delta_equals_source(hook, "commerce", both, lake / "delta")

    _workload(hook)  # the table that leaves changes while it is out of the sync
    left = airflow.run_dag("table_list_one")
    assert_succeeded(left, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert f"table '{COMES_AND_GOES}' left the sync's tables; its Delta table stays as of window" in str(
        left["log"]
    )
    assert store.sync_config(SYNC)["removed_tables"] == {COMES_AND_GOES: store.committed(SYNC)[1] - 1}
    before = max(v for _, _, v in delta_txns(lake / "delta" / COMES_AND_GOES))
    assert_delta_equals_source(hook, "commerce", (STAYS,), lake / "delta")

    back = airflow.run_dag("table_list_two")
    assert_succeeded(back, "snapshot", "merge_snapshot")
    assert f"re-snapshot of {COMES_AND_GOES}" in str(back["log"])
    assert max(v for _, _, v in delta_txns(lake / "delta" / COMES_AND_GOES)) > before
    assert_delta_equals_source(hook, "commerce", both, lake / "delta")
    assert store.sync_config(SYNC)["removed_tables"] == {}


# Fails every spark-submit before it starts: the window stays STAGED, nothing reaches Delta.
FAIL_BEFORE = """#!/bin/sh
echo "injected failure before spark-submit" >&2
exit 3
"""


def test_a_staged_window_whose_files_are_lost_is_read_again_and_the_next_run_heals(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, tmp_path: Path
) -> None:
    """The next run's first merge (``merge_snapshot``) meets the window: it cannot merge lost
    files however often it is rerun, so it hands the window back to capture; the run after it
    reads those changes again, exact."""
    store = _store(airflow)
    wrapper = tmp_path / "spark-submit-fail"
    wrapper.write_text(FAIL_BEFORE)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    _workload(hook)
    failing = AirflowEnv(airflow.home, {**airflow.env, "VITESS_TEST_SPARK_SUBMIT": str(wrapper)})
    first = failing.run_dag("table_list_two")
    assert first["tasks"]["merge"] == "failed", first["tasks"]
    window = store.open_window(SYNC)
    assert window is not None and window.state is WindowState.STAGED and window.kind.value == "catchup"
    parts = sorted((lake / "staging" / SYNC / f"window={window.seq:010d}").rglob("*.parquet"))
    assert parts, "the window staged no part"
    parts[0].unlink()

    met = airflow.run_dag("table_list_two")
    assert met["tasks"]["merge_snapshot"] == "failed", met["tasks"]
    assert f"catchup window {window.seq} was staged but its part" in met["log"]
    assert "the next catch-up reads its changes again" in met["log"]
    assert store.window(SYNC, window.seq).state is WindowState.FAILED

    healed = airflow.run_dag("table_list_two")
    assert_succeeded(healed, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert store.committed(SYNC)[1] > window.seq
    assert_delta_equals_source(hook, "commerce", BOTH, lake / "delta")


def test_a_replaced_checkpoint_store_is_refused_at_the_first_task_and_a_copied_one_goes_on(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, tmp_path: Path
) -> None:
    """Moving to a new, empty store (as from the SQLite default to PostgreSQL) while the Delta
    tables hold the sync's windows: its snapshot would be numbered from 1 and taken for already
    applied, and every later window refused as ahead of the store. The first task refuses and
    names the remedy; the store copied with ``store_copy`` carries the sync on, exact."""
    old = _store(airflow)
    _, old_seq = old.committed(SYNC)
    assert old_seq >= 2, "the sync has run before"
    new_db = tmp_path / "new_store.db"
    moved = AirflowEnv(
        airflow.home,
        {**airflow.env, "AIRFLOW_CONN_NEW_STORE": json.dumps({"conn_type": "sqlite", "host": str(new_db)})},
    )
    _workload(hook)

    refused = moved.run_dag("table_list_new_store")
    assert refused["tasks"]["snapshot"] == "failed", refused["tasks"]
    assert refused["tasks"]["merge_snapshot"] == "upstream_failed"
    assert "the checkpoint store has never recorded a window of this sync" in refused["log"]
    assert f"holds its window {old_seq}" in refused["log"]
    assert "python -m airflow_provider_vitess.store_copy" in refused["log"]
    new = CheckpointStore(f"sqlite:///{new_db}")
    assert new.committed(SYNC) == (None, 0) and new.open_window(SYNC) is None, "the refusal recorded a window"

    copied = moved.python("-m", "airflow_provider_vitess.store_copy", "--to-conn", "new_store")
    assert "vitess_sync_window: " in copied.stdout, copied.stdout
    assert new.committed(SYNC) == old.committed(SYNC)

    carried_on = moved.run_dag("table_list_new_store")
    assert_succeeded(carried_on, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert "no snapshot needed" in carried_on["log"]
    assert new.committed(SYNC)[1] > old_seq
    assert_delta_equals_source(hook, "commerce", BOTH, lake / "delta")
    for table in BOTH:
        applied = Counter((app, version) for app, version, _ in delta_txns(lake / "delta" / table))
        assert max(applied.values()) == 1, f"{table}: a window was applied twice: {applied}"
