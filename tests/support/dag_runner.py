"""A process that stays up and runs an Airflow home's DAG runs one after another
(``python -m tests.support.run_dag serve``), for :meth:`AirflowEnv.run_dag
<tests.support.airflow_env.AirflowEnv.run_dag>`.

A new ``dag.test()`` process spends ~8 s of CPU before its first task starts: importing Airflow
and the provider, and building Airflow's in-process execution API with a router per API version
(a two-task DAG of no-op tasks: 9.0 s through ``airflow dags test``, 3.7 s of it the first task's
start; session 34). The suite makes about a hundred DAG runs. A warm process pays that once per
Airflow home and environment. Runs with injected faults (which kill the process) or that resume
a killed run still get a process of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.local import REPO

# Warm processes kept at once per pytest worker (each holds ~0.5 GB): a test's home and one
# variant of its environment; the least recently used one stops first.
KEPT = 2
ANSWER_FD_VARIABLE = "VITESS_TEST_RUNNER_ANSWER_FD"


class DagRunner:
    """One warm ``run_dag serve`` process for one Airflow home and environment."""

    def __init__(self, home: Path, env: Mapping[str, str]) -> None:
        read, write = os.pipe()
        self._answers = read
        self._idle_log = open(home / "dag-runner.log", "ab")  # noqa: SIM115 (lives with the process)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.run_dag", "serve"],
            env={**env, ANSWER_FD_VARIABLE: str(write)},
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=self._idle_log,
            stderr=subprocess.STDOUT,
            pass_fds=(write,),
            text=True,
        )
        os.close(write)
        self._stopped = False

    def run(self, request: Mapping[str, Any], timeout: float) -> bool:
        """Asks for one run; True once it answered, False if the process died first (its log
        then says why). Raises :class:`subprocess.TimeoutExpired` (the process stopped) after
        ``timeout`` seconds."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(dict(request)) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return False
        ready, _, _ = select.select([self._answers], [], [], timeout)
        if not ready:  # as subprocess.run's timeout does: the process running the tasks goes
            self.process.kill()
            self.stop()
            raise subprocess.TimeoutExpired(self.process.args, timeout)
        return os.read(self._answers, 64).startswith(b"done")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()  # its loop ends after the run under way
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._answers)
        self._idle_log.close()


_RUNNERS: OrderedDict[tuple[str, str], DagRunner] = OrderedDict()


def runner_for(home: Path, env: Mapping[str, str]) -> DagRunner:
    """The warm process of ``home`` and ``env``, started if none runs."""
    key = (str(home), json.dumps(sorted(env.items())))
    runner = _RUNNERS.pop(key, None)
    if runner is not None and not runner.alive():
        runner.stop()
        runner = None
    if runner is None:
        while len(_RUNNERS) >= KEPT:
            _RUNNERS.popitem(last=False)[1].stop()
        runner = DagRunner(home, env)
    _RUNNERS[key] = runner
    return runner


def forget(runner: DagRunner) -> None:
    """Stops a runner that failed (died, or timed out) and drops it."""
    for key, kept in list(_RUNNERS.items()):
        if kept is runner:
            del _RUNNERS[key]
    runner.stop()  # a dead one's pipe and log are closed too


@atexit.register
def _stop_all() -> None:
    while _RUNNERS:
        _RUNNERS.popitem()[1].stop()
