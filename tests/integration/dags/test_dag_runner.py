"""The tests' warm DAG runner (``tests/support/dag_runner.py``): a home's runs in one process,
each parsing the DAG files as they are then, each with its own log, a failed run not ending the
process. Real Airflow (``dag.test()``), no Vitess: DAGs of plain Python tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.airflow_env import AirflowEnv, make_airflow_env
from tests.support.dag_runner import runner_for
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

DAG = """
from airflow.sdk import DAG, task

with DAG("{dag_id}", schedule=None) as dag:

    @task
    def first():
        print("{marker}")
        return {value}

    @task
    def second(value):
        if value < 0:
            raise ValueError("a negative value")
        return value

    second(first())
"""


@pytest.fixture
def airflow(tmp_path: Path, vitess: LocalVitess) -> AirflowEnv:
    return make_airflow_env(tmp_path, vitess)


def test_a_homes_runs_share_one_process_and_each_sees_the_dag_files_of_its_time(airflow: AirflowEnv) -> None:
    airflow.write_dag("plain", DAG.format(dag_id="plain", marker="first version", value=1))
    first = airflow.run_dag("plain")
    assert first["tasks"] == {"first": "success", "second": "success"}, first["tasks"]
    pid = runner_for(airflow.home, airflow.env).process.pid

    airflow.write_dag("plain", DAG.format(dag_id="plain", marker="second version", value=-1))
    failed = airflow.run_dag("plain")
    assert failed["tasks"] == {"first": "success", "second": "failed"}, failed["tasks"]
    assert "a negative value" in failed["log"] and "second version" in failed["log"]
    assert "first version" not in failed["log"], "a run's log holds that run's output only"

    with pytest.raises(AssertionError) as missing:
        airflow.run_dag("no_such_dag")
    assert "left no result" in str(missing.value) and "no_such_dag" in str(missing.value)

    airflow.write_dag("plain", DAG.format(dag_id="plain", marker="third version", value=3))
    again = airflow.run_dag("plain")
    assert again["tasks"] == {"first": "success", "second": "success"}, again["tasks"]
    assert runner_for(airflow.home, airflow.env).process.pid == pid, "every run in the one process"
