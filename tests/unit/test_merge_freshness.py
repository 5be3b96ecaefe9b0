"""The merge operator and its freshness objective: past it, the task fails after its commit."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowFailException

from airflow_provider_vitess.checkpoints import WindowKind
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

COMMITTED = Vgtid((ShardGtid("ks", "0", "MariaDB/0-1-7"),))


class _Ti:
    dag_id, run_id, task_id, try_number = "d", "r", "merge", 1

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _execute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, behind: float, sla: float | None) -> Any:
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    as_of = datetime.now(timezone.utc) - timedelta(seconds=behind)
    outcome = MergeOutcome(3, 3, WindowKind.CATCHUP, COMMITTED, None, "committed window(s) 3", as_of=as_of)
    monkeypatch.setattr(MergeRunner, "run", lambda self, submit: outcome)
    op = VitessMergeOperator(
        task_id="merge", sync_id="s", target_location=str(tmp_path), conn_id="spark_x", freshness_sla=sla
    )
    ti = _Ti()
    result = op.execute({"ti": ti})
    assert ti.pushed["committed_vgtid"] == COMMITTED.to_json()
    return result


def test_within_the_objective_the_task_returns_the_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = _execute(monkeypatch, tmp_path, behind=5, sla=60)
    assert result["merged"] == 3 and 5 <= result["seconds_behind"] < 60
    assert datetime.fromisoformat(result["as_of"]) < datetime.now(timezone.utc)
    assert _execute(monkeypatch, tmp_path, behind=500, sla=None)["seconds_behind"] >= 500


def test_past_the_objective_the_task_fails_after_the_commit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(
        AirflowFailException, match=r"FreshnessBreachError: sync 's': .* past its freshness_sla of 60"
    ):
        _execute(monkeypatch, tmp_path, behind=90, sla=60)
