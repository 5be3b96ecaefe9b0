"""A throwaway Airflow installation for tests: its own AIRFLOW_HOME, SQLite metadata database,
dags folder and connections (environment variables), driven through Airflow's own CLI and
``dag.test()`` in subprocesses, the way a user's deployment runs DAGs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_vitess.merge.job.connect import split_token
from tests.support.dag_runner import forget, runner_for
from tests.support.local import REPO, LocalVitess, connection_uri_env, machine_lock

BIN = Path(sys.executable).parent
IVY_CACHE = Path(
    os.environ.get("VITESS_IVY_CACHE", Path.home() / ".cache" / "airflow-provider-vitess" / "ivy")
)


@dataclass
class AirflowEnv:
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def dags(self) -> Path:
        return self.home / "dags"

    def write_dag(self, name: str, source: str) -> Path:
        path = self.dags / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return path

    def airflow(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "airflow"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            cwd=self.home,
        )

    def python(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Runs this Python with the installation's environment (Airflow reads it at import)."""
        return subprocess.run(
            [sys.executable, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=True
        )

    def asset_events(self) -> dict[str, list[dict[str, Any]]]:
        """Asset events in the metadata database (SQLite): ``{asset uri: [extra, ...]}`` in order."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
            ).fetchall()
        out: dict[str, list[dict[str, Any]]] = {}
        for uri, extra in rows:
            out.setdefault(uri, []).append(json.loads(extra))
        return out

    def run_dag(
        self,
        dag_id: str,
        *,
        conf: Mapping[str, Any] | None = None,
        logical_date: str | None = None,
        timeout: float = 900,
        faults: Mapping[str, Any] | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Runs one DAG run through ``dag.test()``; returns its state and each task's state.
        ``faults``: injected into its tasks (``run_dag``); a SIGKILL among them that landed
        returns ``{"killed": True, "log": ...}``. ``resume``: the run of ``logical_date``
        goes on, its failed (or killed) task instances and their downstream cleared and run
        again, the others kept (``run_dag``)."""
        with tempfile.TemporaryDirectory(dir=self.home) as tmp:
            result_file = Path(tmp) / "result.json"
            if faults or resume:
                args = [str(result_file), dag_id, json.dumps(dict(conf or {}))]
                if logical_date:
                    args += [logical_date, "resume"] if resume else [logical_date]
                log, killed = self._run_alone(args, faults, timeout)
                if killed:  # a kill landed: the process running the tasks died
                    return {"killed": True, "log": log}
            else:
                log = self._run_warm(dag_id, conf, logical_date, timeout, result_file)
            if not result_file.exists():
                raise AssertionError(f"dag.test of {dag_id} left no result:\n{log[-12000:]}")
            result: dict[str, Any] = json.loads(result_file.read_text())
        result["log"] = log
        return result

    def _run_alone(
        self, args: list[str], faults: Mapping[str, Any] | None, timeout: float
    ) -> tuple[str, bool]:
        """``run_dag`` in a process of its own (faults kill it; a resume patches Airflow in it):
        its output, and whether an injected kill landed."""
        env = {**self.env, "VITESS_TEST_FAULTS": json.dumps(dict(faults))} if faults else self.env
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.run_dag", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )
        return proc.stdout + proc.stderr, bool(faults) and proc.returncode == -9

    def _run_warm(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None,
        logical_date: str | None,
        timeout: float,
        result_file: Path,
    ) -> str:
        """``run_dag`` in this home's warm process (``dag_runner``): the run's output."""
        log_file = result_file.with_name("run.log")
        runner = runner_for(self.home, self.env)
        request = {
            "result_file": str(result_file),
            "dag_id": dag_id,
            "conf": dict(conf or {}),
            "logical_date": logical_date,
            "log_file": str(log_file),
        }
        try:
            answered = runner.run(request, timeout)
        except subprocess.TimeoutExpired:
            forget(runner)
            raise
        if not answered:  # it died: the next run gets a new one
            forget(runner)
        return log_file.read_text() if log_file.exists() else ""


# A DAG's merges on the Spark Connect server of ``make_airflow_env(spark_connect=...)``: no JVM
# starts per merge task (seconds instead of a spark-submit's half minute), through the merge
# operator's Connect path and a real ``spark_connect`` Airflow connection.
CONNECT_MERGE = '{"spark_connect_conn_id": "spark_connect_default"}'
# The same, unless the run's environment names a spark-submit of its own in
# ``VITESS_TEST_SPARK_SUBMIT`` (a wrapper that injects a failure around the real one): then that
# run's merges go through spark-submit. A DAG file using it imports ``os``.
# spark-submit's settings go with it (a Connect merge refuses them: they would do nothing there).
CONNECT_UNLESS_SUBMIT = (
    '({"spark_binary": os.environ["VITESS_TEST_SPARK_SUBMIT"], "conf": {"spark.jars.ivy": '
    'os.environ["VITESS_SPARK_IVY"], "spark.sql.shuffle.partitions": "4"}} '
    f'if os.environ.get("VITESS_TEST_SPARK_SUBMIT") else {CONNECT_MERGE})'
)


# A factory DAG of one table with a freshness objective, and a DAG scheduled on that table's
# Asset (its consumer): the freshness tests' pair (test_freshness_objective, test_backfill_api).
FRESHNESS_DAG = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    sensor_timeout={sensor_timeout},
    freshness_sla={sla},
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""
ASSET_CONSUMER_DAG = """
from airflow.sdk import DAG, Asset, task

with DAG("on_{table}", schedule=[Asset("file://{lake}/delta/{table}")]) as dag:

    @task
    def read():
        return "read"

    read()
"""


def make_airflow_env(
    root: Path, cluster: LocalVitess, *, spark_master: str = "local[2]", spark_connect: str | None = None
) -> AirflowEnv:
    """An Airflow home with the connections a sync DAG uses; with ``spark_connect`` (a server's
    ``sc://`` URL) also the ``spark_connect_default`` connection, for merges on Spark Connect
    (``CONNECT_MERGE`` in a DAG's ``merge_kwargs``)."""
    home = root / "airflow"
    (home / "dags").mkdir(parents=True, exist_ok=True)
    IVY_CACHE.mkdir(parents=True, exist_ok=True)
    vitess_name, vitess_value = connection_uri_env("vitess_default", cluster)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTEST"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        vitess_name: vitess_value,
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
        # Delta's jars come from Maven Central once, then from this cache (CI caches it too).
        "VITESS_SPARK_IVY": str(IVY_CACHE),
    }
    if spark_connect is not None:
        # As a user enters it: the server's address, its token as the password.
        url, token = split_token(spark_connect)
        env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
            {"conn_type": "spark_connect", "host": url.rstrip("/"), "password": token}
        )
    airflow_env = AirflowEnv(home, env)
    shutil.copyfile(_migrated_metadata_db(env), home / "airflow.db")
    return airflow_env


def _migrated_metadata_db(env: Mapping[str, str]) -> Path:
    """An empty metadata database migrated by this installation's Airflow, made once per machine
    and installation: each home gets a copy (``airflow db migrate`` is 4-8 s of the suite per home,
    and ~20 homes)."""
    from importlib.metadata import version

    key = hashlib.sha256(f"{sys.prefix}:{version('apache-airflow')}".encode()).hexdigest()[:16]
    template = Path(tempfile.gettempdir()) / f"airflow-provider-vitess-tests-metadata-{key}.db"
    with machine_lock("airflow-metadata-db"):
        if not template.exists():
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp)
                AirflowEnv(home, {**env, "AIRFLOW_HOME": str(home)}).airflow("db", "migrate")
                (home / "airflow.db").replace(template)  # whole, or not there
    return template


def assert_succeeded(result: dict[str, Any], *tasks: str) -> None:
    """Each of ``tasks`` of a run (``AirflowEnv.run_dag``'s result) ended in success; else the
    states and the log's tail."""
    states = result["tasks"]
    assert isinstance(states, dict)
    bad = {t: states.get(t) for t in tasks if states.get(t) != "success"}
    assert not bad, f"tasks not successful: {bad}; all: {states}\n{str(result['log'])[-5000:]}"


# The real spark-submit, then a failure: the job committed its windows to the tables, the task
# fails before the checkpoint store records them MERGED (a kill after the commits).
_FAIL_AFTER = """#!/bin/sh
"{real}" "$@"
echo "injected failure after spark-submit (exit $?)" >&2
exit 3
"""


def failing_after_submit(real: Path | str, directory: Path) -> Path:
    """A spark-submit (in ``directory``) that runs ``real``, then fails (:data:`_FAIL_AFTER`)."""
    wrapper = directory / "spark-submit-then-fail"
    wrapper.write_text(_FAIL_AFTER.format(real=real))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper
