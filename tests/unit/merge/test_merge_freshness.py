"""The merge operator and its freshness objective: past it, the task still succeeds (its window
is committed and its asset events must reach the consumers), warns, and says ``breached``; a
snapshot window never breaches it (issue 38, item 3)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

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


def _execute(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    behind: float,
    sla: float | None,
    kind: WindowKind = WindowKind.CATCHUP,
) -> Any:
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    as_of = datetime.now(timezone.utc) - timedelta(seconds=behind)
    outcome = MergeOutcome(3, 3, kind, COMMITTED, None, "committed window(s) 3", as_of=as_of)
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
    assert (result["freshness_sla"], result["breached"]) == (60, False)
    assert datetime.fromisoformat(result["as_of"]) < datetime.now(timezone.utc)
    unbounded = _execute(monkeypatch, tmp_path, behind=500, sla=None)
    assert unbounded["seconds_behind"] >= 500 and unbounded["breached"] is False


def test_past_the_objective_the_task_succeeds_warns_and_says_breached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _execute(monkeypatch, tmp_path, behind=90, sla=60)
    assert (result["merged"], result["breached"], result["freshness_sla"]) == (3, True, 60)
    assert result["seconds_behind"] >= 90
    (warning,) = _warnings(capsys)  # the task's log (structlog, to the captured output)
    assert "sync 's': freshness objective breached: its data is as of " in warning
    assert "past its freshness_sla of 60 s (window 3 is committed, its asset events emitted)" in warning


def test_a_snapshot_window_never_breaches_the_objective(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _execute(monkeypatch, tmp_path, behind=900, sla=60, kind=WindowKind.SNAPSHOT)
    assert (result["kind"], result["breached"], result["seconds_behind"] >= 900) == ("snapshot", False, True)
    assert _warnings(capsys) == []


def _warnings(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert any("sync 's': committed window(s) 3" in line for line in lines), lines  # the log is here
    return [line for line in lines if "[warning" in line and "outside of the Task Runner" not in line]
