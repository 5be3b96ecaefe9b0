"""The merge operator's spark-submit command for a plan that names many tables."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge


def _big_plan(tables: int) -> MergePlan:
    """A sync of ``tables`` tables on S3, as the 200-table bench keyspace has (and more)."""
    lake = "s3a://a-company-lakehouse-bucket/warehouse/vitess/production/commerce_keyspace"
    targets = {
        f"table_{i:04d}_with_a_long_name": TableTarget(
            f"table_{i:04d}_with_a_long_name",
            f"{lake}/delta/table_{i:04d}_with_a_long_name",
            ("tenant_id", "entity_id", "created_at"),
            ("tenant_id", "entity_id", "created_at"),
            last_merged_seq=41,
            last_delta_version=40,
        )
        for i in range(tables)
    }
    windows = tuple(
        WindowToMerge(seq, f"{lake}/staging/sync/window={seq:010d}/_manifest.json") for seq in range(42, 62)
    )
    return MergePlan("commerce_sync", windows, targets)


def test_a_plan_past_linuxs_argument_limit_reaches_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    plan = _big_plan(600)
    assert len(plan.to_json()) > 131072  # MAX_ARG_STRLEN: one argument longer is refused (E2BIG)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = VitessMergeOperator(
        task_id="merge", sync_id="commerce_sync", target_location="/tmp/unused", conn_id="spark_x"
    )
    seen: dict[str, Any] = {}

    def execute(self: SparkSubmitOperator, context: Any) -> None:
        command = self._get_hook()._build_spark_submit_command(self.application)
        # The operating system's own check, with a program that accepts any arguments.
        seen["exit"] = subprocess.run(["true", *command[1:]], check=False).returncode
        plan_file = command[command.index("--plan-file") + 1]
        with open(plan_file, encoding="utf-8") as f:
            seen["plan"] = MergePlan.from_json(f.read())

    monkeypatch.setattr(SparkSubmitOperator, "execute", execute)
    monkeypatch.setattr(SparkSubmitMerge, "_jars_from_cache", lambda self, job: None)
    assert op._make_backend().submit(plan, {}) is None  # no report: the job did not run
    assert seen["exit"] == 0
    assert seen["plan"] == plan
    assert "--plan-json" not in (op.application_args or [])
