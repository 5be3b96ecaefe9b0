"""Runs one DAG run with ``dag.test()`` in this process (started by ``AirflowEnv.run_dag``).

Usage: python -m tests.support.run_dag RESULT_FILE DAG_ID CONF_JSON [LOGICAL_DATE [resume]]
       python -m tests.support.run_dag serve   (DAG runs one after another: :func:`serve`)
Writes ``{"state": ..., "tasks": {task_id: state}, ...}`` to RESULT_FILE at the end: a file, not
stdout, where a log line of another thread (OpenLineage's client at exit) can land on the same
line (CI, session 20).

``VITESS_TEST_FAULTS`` (JSON, ``capture_child.install_faults``'s faults) injects faults into the
tasks this process runs: a SIGKILL at a drawn point kills this process (``dag.test()`` runs the
tasks in it, as a worker would), and leaves no result file.

``resume`` (with the LOGICAL_DATE of a run made before): the run is not made again. As Airflow's
scheduler does with a task whose process died (its heartbeat timeout), its running task
instances are failed; then the failed task instances and their downstream tasks are cleared
(each mapped task instance alone: the others of its task keep their state, as a clear of that
map index in the UI does), and the run is driven to its end the way ``dag.test()`` drives one.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock


def _resume(dag: Any, logical_date: datetime) -> Any:
    """Fails the run's running task instances, clears the failed ones and their downstream, and
    returns ``dag.test()``'s patches that drive the existing run instead of a new one."""
    from airflow.models import dagrun as dagrun_module
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import clear_task_instances
    from airflow.serialization.definitions.dag import SerializedDAG
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.logical_date == logical_date)
        )
        assert run is not None, f"no run of {dag.dag_id} at {logical_date} to resume"
        instances = run.get_task_instances(session=session)
        for ti in instances:
            if ti.state == TaskInstanceState.RUNNING:  # its process was killed
                ti.state = TaskInstanceState.FAILED
        failed = [ti for ti in instances if ti.state == TaskInstanceState.FAILED]
        downstream = {
            d for ti in failed for d in dag.get_task(ti.task_id).get_flat_relative_ids(upstream=False)
        }
        chosen = [ti for ti in instances if ti in failed or ti.task_id in downstream]
        assert chosen, f"nothing to resume: {[(ti.task_id, ti.map_index, ti.state) for ti in instances]}"
        clear_task_instances(chosen, session, dag_run_state=DagRunState.QUEUED)
        run_id = run.run_id

    def existing(*, dag: Any, session: Any, **_: Any) -> Any:
        found = session.scalar(select(DagRun).where(DagRun.run_id == run_id, DagRun.dag_id == dag.dag_id))
        found.state = DagRunState.RUNNING
        found.dag = dag  # as a run dag.test() creates has it
        session.commit()
        return found

    return [
        mock.patch.object(dagrun_module, "get_or_create_dagrun", existing),
        mock.patch.object(SerializedDAG, "clear_dags", lambda *a, **k: None),
    ]


def _quick_idle_polls() -> Any:
    """``dag.test()`` sleeps a second whenever its run has unfinished task instances and none to
    run: a failed or skipped task's downstream become ``upstream_failed``/``skipped`` one level
    per pass of its own loop, so a run idles a second per level (3 s of a 10 s run whose first
    task fails). Nothing else changes those states in this process, so its sleeps are cut to a
    tenth; every other sleep (the provider's, Airflow's elsewhere) is left as it is."""
    real = time.sleep

    def sleep(seconds: float) -> None:
        code = sys._getframe(1).f_code
        if code.co_name == "test" and code.co_filename.endswith(os.path.join("sdk", "definitions", "dag.py")):
            seconds = min(seconds, 0.1)
        real(seconds)

    return mock.patch.object(time, "sleep", sleep)


def run_one(
    result_file: Path,
    dag_id: str,
    conf: dict[str, Any],
    logical_date: datetime | None = None,
    resume: bool = False,
    faults: str | None = None,
) -> None:
    """One DAG run through ``dag.test()``; its summary to ``result_file``. ``faults``:
    ``VITESS_TEST_FAULTS``, installed once the DAGs are parsed."""
    from airflow_provider_vitess.utils.airflow_compat import dag_bag
    from tests.support.capture_child import install_faults

    bag = dag_bag()  # parsed again for each run: a test may have written its DAG files since
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    dag = bag.get_dag(dag_id)
    if dag is None:
        raise SystemExit(f"no DAG {dag_id!r} in {sorted(bag.dag_ids)}")
    if faults:
        install_faults(json.loads(faults))
    patches = _resume(dag, logical_date) if resume and logical_date else []
    kwargs = {"logical_date": logical_date} if logical_date else {}
    for p in patches:
        p.start()
    try:
        run = dag.test(run_conf=conf, **kwargs)
    finally:
        for p in patches:
            p.stop()
    instances = run.get_task_instances()
    tasks = {ti.task_id: str(ti.state) for ti in instances}
    # A mapped task's instances (capture_parallelism): each map index's state.
    mapped: dict[str, dict[int, str]] = {}
    for ti in instances:
        if getattr(ti, "map_index", -1) >= 0:
            mapped.setdefault(ti.task_id, {})[ti.map_index] = str(ti.state)
    result = {"state": str(run.state), "run_id": run.run_id, "tasks": tasks, "mapped": mapped}
    result_file.write_text(json.dumps(result))


def serve() -> None:
    """DAG runs one after another in this process, each asked for by a JSON line on standard
    input (``result_file``, ``dag_id``, ``conf``, ``logical_date``, ``log_file``), each answered
    with a line on the descriptor ``dag_runner`` passed, once its result is written. A run's
    output (this process's descriptors 1 and 2, which Airflow's logging and every child process
    write to) goes to its ``log_file``.
    Airflow and the provider are imported, and Airflow's in-process execution API built, once:
    a new process pays ~8 s of CPU for them before its first task starts."""
    from tests.support.dag_runner import ANSWER_FD_VARIABLE

    fd = int(os.environ.pop(ANSWER_FD_VARIABLE))
    os.set_inheritable(fd, False)  # a task's child process (spark-submit) must not hold it open
    answer = os.fdopen(fd, "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        with open(request["log_file"], "w") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                date = request.get("logical_date")
                run_one(
                    Path(request["result_file"]),
                    request["dag_id"],
                    request["conf"],
                    datetime.fromisoformat(date) if date else None,
                )
            except (Exception, SystemExit):  # the run's failure, in its log; the next run goes on
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        # What the run's tasks left open (connections, streams) goes with its DAG now, as it
        # would with the process of a run of its own.
        gc.collect()
        answer.write("done\n")


def main(argv: list[str]) -> None:
    _quick_idle_polls().start()
    if argv == ["serve"]:
        serve()
        return
    result_file, dag_id, conf = Path(argv[0]), argv[1], json.loads(argv[2])
    logical_date = datetime.fromisoformat(argv[3]) if len(argv) > 3 else None
    resume = len(argv) > 4 and argv[4] == "resume"
    run_one(result_file, dag_id, conf, logical_date, resume, os.environ.get("VITESS_TEST_FAULTS"))


if __name__ == "__main__":
    main(sys.argv[1:])
