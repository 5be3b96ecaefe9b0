"""The sync DAG from ``vitess_sync_dag`` run through Airflow itself (``dag.test()``): the first
run snapshots, later runs catch up, a failed merge is rerun safely, a re-snapshot replaces only
its table, and bad input fails the first task with a clear message. Real Vitess, Spark, Delta.

The merges run on the suite's Spark Connect server (no JVM start per merge task), except the
failed merge's test: its runs go through spark-submit (the operator's default, which ``make demo``
also runs), wrapped to fail after the job committed. ``make test-compat`` sets
``VITESS_TEST_SPARK_SUBMIT`` to each Spark line's spark-submit: every merge then goes through it."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_UNLESS_SUBMIT, AirflowEnv, assert_succeeded, make_airflow_env
from tests.support.customer_workload import run_workload
from tests.support.delta_check import assert_delta_equals_source, delta_txns
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

TABLES = ("customer", "corder")
SYNC = "dag_test_sync"
ID_BASE = 6_000_000

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

for dag_id, sync, tables, keyspace in [
    ("dag_test_sync", "dag_test_sync", ["customer", "corder"], "customer"),
    ("dag_test_bad_table", "dag_test_bad_table", ["customer", "no_such_table"], "customer"),
    ("dag_test_bad_keyspace", "dag_test_bad_keyspace", ["customer"], "no_such_keyspace"),
    ("dag_test_same_sync", "dag_test_sync", ["customer", "corder"], "customer"),
]:
    globals()[dag_id] = vitess_sync_dag(
        dag_id,
        sync_id=sync,
        keyspace=keyspace,
        tables=tables,
        staging_location="{lake}/staging",
        target_location="{lake}/delta",
        schedule=None,
        sensor_timeout=20,
        default_args={{"retries": 0}},
        merge_kwargs={merge_kwargs},
    )
"""

# Fails the first spark-submit *after* it ran: the Delta commit is durable but the task fails,
# the worst moment for the checkpoint. The rerun must find the window applied, not apply it again.
FAIL_ONCE = """#!/bin/sh
"{spark_submit}" "$@"
status=$?
if [ ! -e "{marker}" ]; then touch "{marker}"; echo "injected failure after spark-submit" >&2; exit 3; fi
exit $status
"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="module")
def airflow(
    vitess: LocalVitess, lake: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AirflowEnv:
    # With VITESS_TEST_SPARK_SUBMIT (make test-compat: the Spark line's own spark-submit) every
    # run merges through it, and no Spark Connect server is started.
    connect = None if os.environ.get("VITESS_TEST_SPARK_SUBMIT") else request.getfixturevalue("spark_connect")
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess, spark_connect=connect)
    env.write_dag("vitess_sync_dags", DAG_FILE.format(lake=lake, merge_kwargs=CONNECT_UNLESS_SUBMIT))
    return env


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_dag_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_dag_test")


def _store(airflow: AirflowEnv) -> CheckpointStore:
    return CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")


def _workload(hook: VitessHook, seed: int) -> None:
    run_workload(hook, seed, id_base=ID_BASE, customers=40, orders=80, rounds=60, tag="s")


def test_first_run_snapshots_and_later_runs_catch_up_to_the_source(
    airflow: AirflowEnv, hook: VitessHook, lake: Path
) -> None:
    _workload(hook, seed=1)  # rows for the snapshot to copy

    first = airflow.run_dag("dag_test_sync")
    assert_succeeded(first, "snapshot", "merge_snapshot")
    store = _store(airflow)
    _, seq = store.committed(SYNC)
    assert seq >= 1
    assert store.window(SYNC, 1).kind.value == "snapshot"

    _workload(hook, seed=2)
    second = airflow.run_dag("dag_test_sync")
    assert_succeeded(second, "snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge")
    assert "no snapshot needed" in second["log"]
    assert_delta_equals_source(hook, "customer", TABLES, lake / "delta")
    latest, latest_seq = store.committed(SYNC)
    assert latest_seq > seq and latest is not None
    assert store.open_window(SYNC) is None


def test_a_failed_merge_is_rerun_without_moving_the_checkpoint_on_failure(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, tmp_path: Path
) -> None:
    store = _store(airflow)
    _, before = store.committed(SYNC)
    wrapper = tmp_path / "spark-submit-fail-once"
    wrapper.write_text(
        FAIL_ONCE.format(
            spark_submit=Path(airflow.env["PATH"].split(":")[0]) / "spark-submit", marker=tmp_path / "failed"
        )
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    _workload(hook, seed=3)
    failing = AirflowEnv(airflow.home, {**airflow.env, "VITESS_TEST_SPARK_SUBMIT": str(wrapper)})
    date = "2026-06-01T00:00:00+00:00"

    first = failing.run_dag("dag_test_sync", logical_date=date)
    assert first["tasks"]["merge"] == "failed", first["tasks"]
    assert "injected failure after spark-submit" in first["log"]
    window = store.open_window(SYNC)
    assert window is not None and window.state is WindowState.STAGED
    assert store.committed(SYNC)[1] == before, "the checkpoint moved although the merge task failed"

    # dag.test() on the same logical date clears the run's task instances and runs them again.
    rerun = failing.run_dag("dag_test_sync", logical_date=date)
    assert_succeeded(rerun, "snapshot", "merge_snapshot")
    assert store.open_window(SYNC) is None
    assert store.committed(SYNC)[1] == window.seq
    assert_delta_equals_source(hook, "customer", TABLES, lake / "delta")
    for table in TABLES:
        applied = Counter((app, version) for app, version, _ in delta_txns(lake / "delta" / table))
        assert applied, f"{table}: no Delta commit carries a transaction id"
        assert max(applied.values()) == 1, f"{table}: a window was applied twice: {applied}"
        assert any(version == window.seq for _, version in applied), applied
    # The failed try committed to Delta but emitted no event; the rerun emits them, counts unknown.
    for table in TABLES:
        ours = [
            e for e in airflow.asset_events()[f"file://{lake}/delta/{table}"] if e["window_seq"] == window.seq
        ]
        assert [(e["kind"], e["rows_inserted"]) for e in ours] == [("catchup", None)], ours


def test_resnapshot_param_replaces_only_the_chosen_table(
    airflow: AirflowEnv, hook: VitessHook, lake: Path
) -> None:
    versions_before = {t: max(v for _, _, v in delta_txns(lake / "delta" / t)) for t in TABLES}
    events_before = airflow.asset_events()
    result = airflow.run_dag("dag_test_sync", conf={"resnapshot_tables": ["customer"]})
    assert_succeeded(result, "snapshot", "merge_snapshot")
    assert "re-snapshot of customer" in result["log"]
    txns = {t: delta_txns(lake / "delta" / t) for t in TABLES}
    assert max(v for _, _, v in txns["customer"]) > versions_before["customer"]
    assert max(v for _, _, v in txns["corder"]) == versions_before["corder"], "corder was rewritten"
    # Asset events: the re-copied table gets one, named a re-snapshot; corder gets none.
    events = airflow.asset_events()
    customer, corder = (f"file://{lake}/delta/{t}" for t in TABLES)
    new = events[customer][len(events_before[customer]) :]
    assert [(e["kind"], e["mode"]) for e in new][:1] == [("re-snapshot", "replace")], new
    assert len(events[corder]) == len(events_before[corder]), "corder was not re-copied: no event"
    assert_delta_equals_source(hook, "customer", TABLES, lake / "delta")


@pytest.mark.parametrize(
    ("dag_id", "message"),
    [
        ("dag_test_bad_table", "no_such_table"),
        ("dag_test_bad_keyspace", "no_such_keyspace"),
    ],
)
def test_bad_input_fails_the_first_task_with_a_clear_message(
    airflow: AirflowEnv, dag_id: str, message: str
) -> None:
    result = airflow.run_dag(dag_id)
    assert result["tasks"]["snapshot"] == "failed", result["tasks"]
    assert result["tasks"]["merge_snapshot"] == "upstream_failed"
    errors = [line for line in result["log"].splitlines() if message in line and "Error" in line]
    assert errors, f"no error naming {message!r}:\n{result['log'][-4000:]}"


def test_a_second_run_of_the_same_sync_fails_fast_naming_the_running_one(airflow: AirflowEnv) -> None:
    store = _store(airflow)
    with store.lock(SYNC, "dag 'dag_test_sync' run 'manual__running' task 'catch_up'"):
        result = airflow.run_dag("dag_test_same_sync", conf={"resnapshot_tables": ["customer"]})
    assert result["tasks"]["snapshot"] == "failed", result["tasks"]
    assert "manual__running" in result["log"], result["log"][-4000:]
