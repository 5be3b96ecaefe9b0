"""Acceptance: a backfill created through Airflow's REST API (``POST /api/v2/backfills`` against
a real ``airflow api-server`` started by the test) over 3 past intervals completes and leaves the
target equal to the source.

The sync DAG comes from ``vitess_sync_dag``; the scheduler, dag-processor, triggerer (the changes
sensor defers) and LocalExecutor run it, as in a deployment. A sync's position lives in the
checkpoint store, not in the run's logical date, so each backfill run catches up from the
committed position to *now* or finds nothing to do: the checkpoint must only move forward, and
Delta must hold each window once. Real Vitess, Spark and Delta.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from tests.conftest import LocalVitess, connection_uri_env
from tests.integration.airflow_env import CONNECT_MERGE, make_airflow_env
from tests.integration.airflow_services import AirflowServices, airflow_services
from tests.integration.customer_workload import run_workload
from tests.integration.delta_check import assert_delta_equals_source, delta_txns

pytestmark = pytest.mark.integration

DAG_ID = SYNC = "backfill_api_sync"
TABLES = ("customer", "corder")
ID_BASE = 8_000_000

# Daily runs; the DAG ends yesterday, so the scheduler never starts a run of its own while the
# test drives it (a scheduled run would count apart from the backfill's max_active_runs: see
# ``test_backfill_runs_complete_and_target_equals_source``).
DAG_FILE = """
import os
from datetime import datetime, timezone
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from airflow_provider_vitess.merge.spark_conf import LOCAL_CONF

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="customer",
    tables=["customer", "corder"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule="@daily",
    start_date=datetime.fromisoformat("{start}"),
    end_date=datetime.fromisoformat("{end}"),
    sensor_timeout=6,
    default_args={{"retries": 0}},
    # Small-machine settings (a few partitions, no UI): the merge's fixed costs dominate here.
    spark_conf={{**LOCAL_CONF, "spark.jars.ivy": os.environ["VITESS_SPARK_IVY"]}},
    merge_kwargs={merge_kwargs},
)
"""


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


@pytest.fixture
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_backfill_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_backfill_test")


@pytest.fixture
def today() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def services(
    vitess: LocalVitess, spark_connect: str, tmp_path: Path, today: datetime
) -> Iterator[tuple[AirflowServices, Path]]:
    lake = tmp_path / "lake"
    env = make_airflow_env(tmp_path, vitess, spark_connect=spark_connect)
    env.write_dag(
        DAG_ID,
        DAG_FILE.format(
            dag_id=DAG_ID,
            lake=lake,
            start=(today - timedelta(days=10)).isoformat(),
            end=(today - timedelta(days=1)).isoformat(),
            merge_kwargs=CONNECT_MERGE,
        ),
    )
    with airflow_services(env) as running:
        yield running, lake


def _workload(hook: VitessHook, seed: int) -> None:
    run_workload(hook, seed, id_base=ID_BASE, customers=30, orders=60, rounds=50, tag="backfill")


def _xcom(api: AirflowServices, run_id: str, task_id: str, key: str = "return_value") -> Any:
    return api.api(
        "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
    )["value"]


def _assert_run_ok(api: AirflowServices, run: dict[str, Any]) -> dict[str, str | None]:
    """The run succeeded; the sensor and what follows it may be skipped, but only together."""
    states = api.task_states(DAG_ID, run["dag_run_id"])
    expected = {"snapshot": "success", "merge_snapshot": "success"}
    if states.get("wait_for_changes") == "skipped":
        expected.update(catch_up="skipped", merge="skipped")
    else:
        expected.update(wait_for_changes="success", catch_up="success", merge="success")
    wrong = {t: states.get(t) for t, s in expected.items() if states.get(t) != s}
    assert run["state"] == "success" and not wrong, (
        f"run {run['dag_run_id']} {run['state']}: unexpected task states {wrong}\n"
        + api.explain_run(DAG_ID, run["dag_run_id"])
    )
    return states


def test_backfill_runs_complete_and_target_equals_source(
    services: tuple[AirflowServices, Path], hook: VitessHook, today: datetime
) -> None:
    api, lake = services
    phases, mark = {"services up": round(api.startup_seconds, 1)}, [time.monotonic()]

    def phase(name: str) -> None:  # where the time goes, printed at the end (pytest -rP shows it)
        now = time.monotonic()
        phases[name], mark[0] = round(now - mark[0], 1), now

    assert api.request("GET", "/api/v2/dags", auth=False).status_code == 401, "the API must ask for a token"
    api.wait_for_dag(DAG_ID)
    phase("DAG parsed")
    api.unpause(DAG_ID)

    # The first run snapshots (a manual run, through the same REST API).
    first = api.trigger(DAG_ID, logical_date=_iso(today - timedelta(days=1)))
    [done] = api.wait_for_runs(DAG_ID, 1, timeout=240)
    assert done["dag_run_id"] == first["dag_run_id"]
    _assert_run_ok(api, done)
    phase("snapshot run")
    store = CheckpointStore(f"sqlite:///{api.airflow.home / 'vitess_sync.db'}")
    assert store.window(SYNC, 1).kind.value == "snapshot"
    # (Its sensor may also have seen changes, from other writers to these tables, and caught up.)
    snapshot_vgtid, snapshot_seq = store.committed(SYNC)
    assert snapshot_vgtid is not None and snapshot_seq >= 1

    _workload(hook, seed=11)

    body = {
        "dag_id": DAG_ID,
        "from_date": _iso(today - timedelta(days=4)),
        "to_date": _iso(today - timedelta(days=2)),
        "reprocess_behavior": "none",
        "max_active_runs": 1,  # the backfill's own limit: the DAG's max_active_runs does not cover it
        "run_backwards": False,
        "dag_run_conf": {},
    }
    planned = api.api("POST", "/api/v2/backfills/dry_run", body)["backfills"]
    expected_dates = [_iso(today - timedelta(days=d)) for d in (4, 3, 2)]
    assert [p["logical_date"] for p in planned] == expected_dates, planned
    backfill = api.api("POST", "/api/v2/backfills", body)
    assert backfill["dag_id"] == DAG_ID and backfill["max_active_runs"] == 1, backfill

    runs = api.wait_for_runs(DAG_ID, 3, timeout=420, run_type="backfill")
    phase("backfill runs")
    runs.sort(key=lambda r: r["logical_date"])
    assert [r["logical_date"] for r in runs] == expected_dates
    states = [_assert_run_ok(api, run) for run in runs]
    assert any(s["catch_up"] == "success" for s in states), f"no backfill run caught up: {states}"
    for before, after in itertools.pairwise(runs):
        assert before["end_date"] <= after["start_date"], f"backfill runs overlapped: {before} / {after}"

    # The checkpoint only moved forward: each run started from where the previous one committed.
    committed = [(snapshot_seq, snapshot_vgtid)]
    for run, run_states in zip(runs, states, strict=True):
        started_at = _xcom(api, run["dag_run_id"], "snapshot")
        assert started_at.get("snapshot") == "not needed", started_at
        assert started_at["committed_seq"] == committed[-1][0], (run["dag_run_id"], started_at, committed)
        if run_states["merge"] == "success":
            merged = _xcom(api, run["dag_run_id"], "merge")
            vgtid = Vgtid.from_json(merged["committed_vgtid"])
            assert merged["merged"] > committed[-1][0], (run["dag_run_id"], merged, committed)
            assert vgtid.has_reached(committed[-1][1]), (
                f"the checkpoint went backwards in {run['dag_run_id']}"
            )
            committed.append((merged["merged"], vgtid))
    final_vgtid, final_seq = store.committed(SYNC)
    assert (final_seq, final_vgtid) == committed[-1]
    assert store.open_window(SYNC) is None
    assert all(store.window(SYNC, seq).state is WindowState.COMMITTED for seq, _ in committed)

    # Delta holds each window once: one commit per (sync + table, window seq) transaction id.
    for table in TABLES:
        applied = Counter((app, version) for app, version, _ in delta_txns(lake / "delta" / table))
        assert applied and max(applied.values()) == 1, f"{table}: a window was applied twice: {applied}"
        versions = {version for _, version in applied}
        assert versions <= set(range(1, final_seq + 1)), f"{table}: unknown windows applied: {applied}"
        assert committed[1][0] in versions, f"{table}: the backfill's window is not in Delta: {applied}"
    assert_delta_equals_source(hook, "customer", TABLES, lake / "delta")
    phase("Delta checks")

    finished = api.wait_for_backfill(backfill["id"])
    assert not finished["is_paused"], finished
    print(f"start-up (s): { {k: round(v, 1) for k, v in api.startup_steps.items()} }; phases (s): {phases}")
