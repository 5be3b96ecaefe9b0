"""Runs one merge task's work in a process of its own, so the soak can SIGKILL it.

Usage: python -m tests.support.merge_child <spec json>
The spec JSON holds the store URL, sync id, Delta root and lock staleness. It does what
``VitessMergeOperator.execute`` does below Airflow: ``MergeRunner.run`` under the sync's lock,
with the plan handed to ``spark-submit`` of the provider's job file (``merge/job/main.py``, the file
the operator submits), its report read back from ``--report-file``. The job's stdout (its
progress lines) is passed through, so a caller can kill at a chosen step. Run it in a new
session: a kill of its process group takes spark-submit's JVM and Python worker with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.merge.spark_conf import QUICK_JIT, spark_submit_args
from tests.support.local import pyspark_home, spark_env

SPARK_HOME = pyspark_home()


def job_file() -> str:
    spec = importlib.util.find_spec("airflow_provider_vitess.merge.job.main")
    assert spec is not None and spec.origin is not None
    return spec.origin


def submit(plan: MergePlan) -> MergeReport | None:
    conf = {"spark.pyspark.python": sys.executable, "spark.driver.extraJavaOptions": QUICK_JIT}
    with tempfile.TemporaryDirectory(prefix="soak-merge-") as tmp:
        report = Path(tmp) / "report.json"
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            "local[2]",
            *spark_submit_args(local=True, extra=conf),
            job_file(),
            "--plan-json",
            plan.to_json(),
            "--report-file",
            str(report),
        ]
        code = subprocess.call(command, env=spark_env(), stdout=sys.stdout, stderr=sys.stderr)
        if code != 0:
            raise RuntimeError(f"spark-submit exited {code}: {report.read_text() if report.exists() else ''}")
        return MergeReport.from_json(report.read_text()) if report.exists() else None


def main() -> None:
    raw = json.loads(sys.argv[1])
    runner = MergeRunner(
        CheckpointStore(raw["store_url"]),
        raw["sync_id"],
        raw["target"],
        holder=f"merge pid {os.getpid()}",
        lock_stale_after=timedelta(seconds=raw.get("lock_stale_seconds", 120)),
    )
    outcome = runner.run(submit)
    print(json.dumps({"seq": outcome.seq, "message": outcome.message}), flush=True)


if __name__ == "__main__":
    main()
