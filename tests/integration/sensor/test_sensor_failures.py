"""The DAG factory's changes sensor through a real ``airflow triggerer``: only "no change within
the sensor's timeout" skips the rest of the run; refused credentials and an unreachable vtgate
fail the task with a clear message, and the wrong password never reaches the logs. And an error
no retry can fix (a table the keyspace does not have) fails its task at once, retries unused.

(Before: the factory's sensor had ``soft_fail=True``, which Airflow applies to every failure of
a deferred sensor, so each of these ended SKIPPED, looking like "no changes" forever.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import BIN, AirflowEnv, make_airflow_env
from tests.support.changes_sensor import DRIVER, SYNC_ID, WATCHED, commit_position, current
from tests.support.databases import free_port
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

WRONG_PASSWORD = "not-the-password-7f3a"
DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

# The factory's own sensor task, alone: its upstream capture tasks are not what is tested here.
dag = vitess_sync_dag(
    {dag_id!r},
    keyspace="customer",
    tables=[{table!r}],
    sync_id={sync_id!r},
    staging_location="/nowhere/staging",
    target_location="/nowhere/delta",
    vitess_conn_id={conn_id!r},
    sensor_timeout=12,
    schedule=None,
    default_args={{"retries": 0}},
).partial_subset(["wait_for_changes"], include_upstream=False, include_downstream=False)
"""
UNKNOWN_TABLE_DAG = """
from datetime import timedelta

from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "unknown_table",
    keyspace="customer",
    tables=["no_such_table_here"],
    staging_location="/nowhere/staging",
    target_location="/nowhere/delta",
    schedule=None,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
)
"""
CASES = {"bad_password": "vitess_bad_password", "unreachable": "vitess_unreachable", "idle": "vitess_default"}


@pytest.fixture(scope="module")
def triggered(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowEnv]:
    """An Airflow home with one DAG per case and a real triggerer running for the module."""
    airflow = make_airflow_env(tmp_path_factory.mktemp("af-sensor-failures"), vitess)
    bad = dict(zip(("name", "value"), connection_uri_env(CASES["bad_password"], vitess), strict=True))
    value = json.loads(bad["value"])
    value["password"] = WRONG_PASSWORD
    airflow.env[bad["name"]] = json.dumps(value)
    name, unreachable = connection_uri_env(CASES["unreachable"], vitess)
    value = json.loads(unreachable)
    value["port"] = free_port()  # nothing listens there
    airflow.env[name] = json.dumps(value)
    airflow.write_dag("unknown_table", UNKNOWN_TABLE_DAG)
    for case, conn_id in CASES.items():
        airflow.write_dag(
            case, DAG_FILE.format(dag_id=f"sensor_{case}", table=WATCHED, sync_id=SYNC_ID, conn_id=conn_id)
        )
    (airflow.home / "driver.py").write_text(textwrap.dedent(DRIVER))
    log = airflow.home / "triggerer.log"
    triggerer = subprocess.Popen(
        [str(BIN / "airflow"), "triggerer"],
        env=airflow.env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield airflow
    finally:
        os.killpg(triggerer.pid, signal.SIGTERM)
        try:
            triggerer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(triggerer.pid, signal.SIGKILL)
            triggerer.wait()


def run_case(airflow: AirflowEnv, source: VitessHook, case: str) -> tuple[str | None, str]:
    """Commits the current position, runs the case's DAG (its trigger in the real triggerer);
    returns the sensor task's final state and every log Airflow wrote for the run."""
    commit_position(f"sqlite:///{airflow.home / 'vitess_sync.db'}", current(source))
    dag_id = f"sensor_{case}"
    out = airflow.home / f"{case}.log"
    with out.open("w") as sink:
        proc = subprocess.run(
            [
                sys.executable,
                str(airflow.home / "driver.py"),
                "triggerer",
                str(airflow.dags / f"{case}.py"),
                dag_id,
            ],
            env=airflow.env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=900,  # a guard only: seconds on a quiet machine
            check=False,
        )
    db = sqlite3.connect(f"file:{airflow.home}/airflow.db?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute(
            "SELECT state, trigger_id FROM task_instance WHERE dag_id = ? AND task_id = 'wait_for_changes'",
            (dag_id,),
        ).fetchall()
    finally:
        db.close()
    logs = "".join(p.read_text(errors="replace") for p in (airflow.home / "logs").rglob("*") if p.is_file())
    logs += out.read_text() + (airflow.home / "triggerer.log").read_text()
    assert proc.returncode == 0, out.read_text()[-4000:]
    return (rows[0][0] if rows else None), logs


@pytest.mark.usefixtures("conn_env")
def test_wrong_credentials_fail_the_sensor_and_never_reach_the_logs(
    triggered: AirflowEnv,
    hook: VitessHook,
) -> None:
    state, logs = run_case(triggered, hook, "bad_password")
    assert state == "failed", logs[-4000:]
    assert "PERMISSION_DENIED: auth failure" in logs
    assert "check the user and password of connection 'vitess_bad_password'" in logs
    assert "Trigger fired event" in logs  # it ran in the triggerer, not inline
    assert WRONG_PASSWORD not in logs


@pytest.mark.usefixtures("conn_env")
def test_an_unreachable_vtgate_fails_the_sensor(triggered: AirflowEnv, hook: VitessHook) -> None:
    state, logs = run_case(triggered, hook, "unreachable")
    assert state == "failed", logs[-4000:]
    # Not answering within the connection's timeout, or still connecting at the sensor's deadline
    # (whichever comes first): either way an error, never "no change".
    assert re.search(
        r"vtgate( gRPC at 127\.0\.0\.1:\d+)? did not answer (within|until the sensor's timeout)", logs
    )


@pytest.mark.usefixtures("conn_env")
def test_no_change_within_the_timeout_skips(triggered: AirflowEnv, hook: VitessHook) -> None:
    state, logs = run_case(triggered, hook, "idle")
    assert state == "skipped", logs[-4000:]
    assert "nothing to do, the rest of this run is skipped" in logs


def test_an_error_no_retry_can_fix_fails_at_once_without_retries(triggered: AirflowEnv) -> None:
    result = triggered.run_dag("unknown_table", timeout=900)
    assert result["tasks"]["snapshot"] == "failed", result["log"][-4000:]
    db = sqlite3.connect(f"file:{triggered.home}/airflow.db?mode=ro", uri=True, timeout=10)
    try:
        (tries,) = db.execute(
            "SELECT try_number FROM task_instance WHERE dag_id = 'unknown_table' AND task_id = 'snapshot'"
        ).fetchone()
    finally:
        db.close()
    assert tries == 1, "a permanent error must not be retried"
    assert "UnknownTableError: " in result["log"] and "no_such_table_here" in result["log"]
    assert "(a permanent error: the task is not retried)" in result["log"]
