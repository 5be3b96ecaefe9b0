"""Acceptance: a backfill created through Airflow's REST API (``POST /api/v2/backfills`` against
a real ``airflow api-server`` started by the test) over 3 past intervals completes and leaves the
target equal to the source.

The sync DAG comes from ``vitess_sync_dag``; the scheduler, dag-processor, triggerer (the changes
sensor defers) and LocalExecutor run it, as in a deployment. A sync's position lives in the
checkpoint store, not in the run's logical date, so each backfill run catches up from the
committed position to *now* or finds nothing to do: the checkpoint must only move forward, and
Delta must hold each window once. Real Vitess, Spark and Delta.

The same services (started once for the module: ~20-45 s) also run a sync read by two shard
groups (``capture_parallelism=2``): its two ``catch_up`` task instances of a window must run at
the same time in two worker processes, which ``dag.test()`` (one task after the other) never shows.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from tests.support.airflow_env import ASSET_CONSUMER_DAG, CONNECT_MERGE, FRESHNESS_DAG, make_airflow_env
from tests.support.airflow_services import AirflowServices, airflow_services
from tests.support.customer_workload import run_workload
from tests.support.delta_check import assert_delta_equals_source, delta_txns
from tests.support.group_workload import Workload, create_orders, insert_filler, shards_of_customers
from tests.support.group_workload import execute as group_execute
from tests.support.local import LocalVitess, connection_uri_env

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
    merge_kwargs={merge_kwargs},
)
"""


# A sync read by two shard groups (one per shard of ``customer``), run by the scheduler: its
# runs are triggered by the test, one at a time; no sensor, so a run goes straight to its window.
# Its DAG file's pre_execute hook (``tests.support.group_meeting``) holds each ``catch_up`` until
# the other group has started: whether two queued tasks overlap is otherwise up to the load.
GROUPED_DAG_ID = GROUPED_SYNC = "grouped_local_executor_sync"
GROUPED_TABLE = "lx_group_orders"
GROUPED_CUSTOMERS = range(1, 13)
FILLER_BASE = 500_000  # order ids of the filler rows (each group's window has real work)
GROUPED_DAG_FILE = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from tests.support.group_meeting import meeting

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="customer",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    capture_parallelism=2,
    wait_for_changes=False,
    default_args={{"retries": 0, "pre_execute": meeting(2)}},
    merge_kwargs={merge_kwargs},
)
"""


# A sync with a freshness objective every catch-up breaches (issue 38 item 3), and a consumer DAG
# on its table's Asset, run by the scheduler: the breached merge succeeds, its asset event runs the
# consumer, and the DAG's deadline (the factory's, from freshness_sla) does not stop the scheduler.
FRESH_DAG_ID = FRESH_SYNC = "fresh_sched_sync"
FRESH_TABLE = "fresh_sched_orders"


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


@pytest.fixture
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_backfill_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_backfill_test")


@pytest.fixture(scope="module")
def today() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module")
def services(
    vitess: LocalVitess, spark_connect: str, tmp_path_factory: pytest.TempPathFactory, today: datetime
) -> Iterator[tuple[AirflowServices, Path]]:
    """One installation for the module's tests (starting the services costs ~30 s): each test
    has a DAG of its own, paused until it unpauses it."""
    root = tmp_path_factory.mktemp("airflow_services")
    lake = root / "lake"
    env = make_airflow_env(root, vitess, spark_connect=spark_connect)
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
    env.write_dag(
        GROUPED_DAG_ID,
        GROUPED_DAG_FILE.format(
            dag_id=GROUPED_DAG_ID, table=GROUPED_TABLE, lake=lake / "grouped", merge_kwargs=CONNECT_MERGE
        ),
    )
    fresh = FRESHNESS_DAG.format(
        dag_id=FRESH_DAG_ID,
        table=FRESH_TABLE,
        lake=lake / "fresh",
        sensor_timeout=300,
        sla=0.01,
        merge_kwargs=CONNECT_MERGE,
    )
    env.write_dag(FRESH_DAG_ID, fresh)
    env.write_dag(f"on_{FRESH_TABLE}", ASSET_CONSUMER_DAG.format(table=FRESH_TABLE, lake=lake / "fresh"))
    # Two mapped group tasks of a window run at once only if the executor and the DAG allow it.
    with airflow_services(env, extra_env={"AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4"}) as running:
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


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _run_grouped(api: AirflowServices, after_plan: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """One run of the grouped DAG, triggered through the REST API; ``after_plan`` runs once the
    window's stop is taken (its plan task succeeded). The finished run."""
    run_id = api.trigger(GROUPED_DAG_ID)["dag_run_id"]
    deadline = time.monotonic() + 240
    while api.task_states(GROUPED_DAG_ID, run_id).get("plan_catch_up") != "success":
        api.check_alive()
        planning = api.api("GET", f"/api/v2/dags/{GROUPED_DAG_ID}/dagRuns/{run_id}")
        assert planning["state"] != "failed", api.explain_run(GROUPED_DAG_ID, run_id)
        assert time.monotonic() < deadline, f"no plan after 240 s: {api.task_states(GROUPED_DAG_ID, run_id)}"
        time.sleep(0.3)
    after_plan()
    while True:
        run: dict[str, Any] = api.api("GET", f"/api/v2/dags/{GROUPED_DAG_ID}/dagRuns/{run_id}")
        if run["state"] in ("success", "failed"):
            break
        api.check_alive()
        assert time.monotonic() < deadline, (
            f"run not done after 240 s: {api.task_states(GROUPED_DAG_ID, run_id)}"
        )
        time.sleep(0.5)
    assert run["state"] == "success", api.explain_run(GROUPED_DAG_ID, run_id)
    return run


def _groups_of(api: AirflowServices, run_id: str) -> list[dict[str, Any]]:
    """The run's mapped ``catch_up`` task instances (one per group), by map index."""
    tis = [ti for ti in api.task_instances(GROUPED_DAG_ID, run_id) if ti["task_id"] == "catch_up"]
    return sorted(tis, key=lambda ti: ti["map_index"])


def test_grouped_sync_reads_its_groups_at_once_in_separate_workers(
    services: tuple[AirflowServices, Path], hook: VitessHook
) -> None:
    """Issue 31: ``capture_parallelism=2`` under the real scheduler and LocalExecutor (parallelism
    4): the two groups of a window run at the same time in two worker processes, each under its
    own group lock; the merge assembles the window; Delta == the source after every run, every
    window applied once. The workload moves rows between the shards (= between the groups), in
    one transaction and split by a window's stop, both ways."""
    api, lake = services
    began = time.monotonic()
    assert int(api.airflow.env["AIRFLOW__CORE__PARALLELISM"]) >= 2
    assert int(api.airflow.env["AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG"]) >= 2
    table, delta = f"customer.{GROUPED_TABLE}", lake / "grouped" / "delta"
    create_orders(hook, table, GROUPED_CUSTOMERS)
    shard_of = shards_of_customers(hook, table)
    assert sorted(set(shard_of.values())) == ["-80", "80-"] and len(shard_of) == len(GROUPED_CUSTOMERS)
    api.wait_for_dag(GROUPED_DAG_ID)
    api.unpause(GROUPED_DAG_ID)

    first = _run_grouped(api)  # the snapshot, and a first (nearly empty) grouped window
    states = api.task_states(GROUPED_DAG_ID, first["dag_run_id"])
    assert (states["snapshot"], states["merge_snapshot"], states["merge"]) == ("success",) * 3, states
    assert_delta_equals_source(hook, "customer", [GROUPED_TABLE], delta)

    store = CheckpointStore(f"sqlite:///{api.airflow.home / 'vitess_sync.db'}")
    wl = Workload(hook, 31, shard_of, table, GROUPED_CUSTOMERS)
    overlaps: list[str] = []
    seqs: list[int] = []
    for n in range(2):
        wl.round(40, f"lx{n}")  # moves in one transaction among them (either half first)
        insert_filler(hook, table, GROUPED_CUSTOMERS, FILLER_BASE + 10_000 * n, 400, f"filler {n}")
        finish = wl.split_moves(f"lx{n}")  # DELETE-first halves now, INSERT-first ones after the stop
        run = _run_grouped(api, after_plan=finish)
        run_id = run["dag_run_id"]
        merged = api.api(
            "GET",
            f"/api/v2/dags/{GROUPED_DAG_ID}/dagRuns/{run_id}/taskInstances/merge/xcomEntries/return_value",
        )["value"]
        seq = merged["merged"]
        groups = store.window_groups(GROUPED_SYNC, seq)
        assert [(g.shards, g.state) for g in groups] == [
            (("-80",), WindowState.STAGED),
            (("80-",), WindowState.STAGED),
        ]
        assert all(g.stats["rows"] >= 200 for g in groups), [g.stats for g in groups]
        # Each part recorded under its own taking of its group's lock (the token names its files).
        writers = [str(g.manifest_path).rsplit("/", 1)[-1] for g in groups]
        assert writers[0].startswith("_group-000-g000-") and writers[1].startswith("_group-001-g001-")
        assert writers[0][16:] != writers[1][16:], writers
        seqs.append(seq)
        assert store.window(GROUPED_SYNC, seq).state is WindowState.COMMITTED

        # (a) the window's two groups ran at the same time, in two processes.
        a, b = _groups_of(api, run_id)
        assert (a["map_index"], b["map_index"], a["state"], b["state"]) == (0, 1, "success", "success")
        starts, ends = (
            (_when(a["start_date"]), _when(b["start_date"])),
            (_when(a["end_date"]), _when(b["end_date"])),
        )
        assert starts[0] < ends[1] and starts[1] < ends[0], f"the groups did not overlap: {a} / {b}"
        assert a["pid"] and b["pid"] and (a["hostname"], a["pid"]) != (b["hostname"], b["pid"]), (a, b)
        overlap = min(ends) - max(starts)
        overlaps.append(
            f"window {seq}: group 0 {a['start_date']}..{a['end_date']} pid {a['pid']}, "
            f"group 1 {b['start_date']}..{b['end_date']} pid {b['pid']}; "
            f"overlap {overlap.total_seconds():.1f} s"
        )
        # (b) Delta == the source.
        assert_delta_equals_source(hook, "customer", [GROUPED_TABLE], delta)

    # (c) every window with changes once in the Delta log; no window twice, none unknown.
    _, committed = store.committed(GROUPED_SYNC)
    applied = Counter(
        v
        for app, v, _ in delta_txns(delta / GROUPED_TABLE)
        if app.endswith(f":{GROUPED_SYNC}:{GROUPED_TABLE}")
    )
    assert applied and max(applied.values()) == 1, f"a window was applied twice: {applied}"
    with_changes = {
        seq for seq in range(1, committed + 1) if (store.window(GROUPED_SYNC, seq).stats or {}).get("rows")
    }
    assert set(seqs) <= with_changes and len(set(seqs)) == 2, (seqs, with_changes)
    assert with_changes <= set(applied) <= set(range(1, committed + 1)), (applied, with_changes, committed)
    assert store.open_window(GROUPED_SYNC) is None
    api.pause(GROUPED_DAG_ID)
    print("\n".join(overlaps) + f"\ngrouped test: {time.monotonic() - began:.1f} s")


def _deadlines(api: AirflowServices, dag_id: str, run_id: str) -> int:
    """The Deadline rows Airflow keeps for a run, in its metadata database (read only)."""
    engine = sqlalchemy.create_engine(api.airflow.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sqlalchemy.text(
                        "SELECT COUNT(*) FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
                        "WHERE r.dag_id = :dag AND r.run_id = :run"
                    ),
                    {"dag": dag_id, "run": run_id},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_breached_merge_succeeds_and_its_asset_event_runs_the_consumer_under_the_scheduler(
    services: tuple[AirflowServices, Path], hook: VitessHook
) -> None:
    """Issue 38 item 3, the scheduler's path: a factory DAG with a tiny ``freshness_sla`` (each
    catch-up breaches it) and the deadline the factory sets. The run succeeds, its breached
    merge says so and records the table's asset event, and the consumer scheduled on the Asset
    runs for that event. (Before: the merge failed after its commit, no event, no consumer.)"""
    api, lake = services
    consumer = f"on_{FRESH_TABLE}"
    group_execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{FRESH_TABLE}",
        f"CREATE TABLE commerce.{FRESH_TABLE} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(16))",
        f"INSERT INTO commerce.{FRESH_TABLE} (id, note) VALUES (1, 'a'), (2, 'b')",
    )
    api.wait_for_dag(FRESH_DAG_ID)
    api.wait_for_dag(consumer)
    api.unpause(FRESH_DAG_ID)
    run_id = api.trigger(FRESH_DAG_ID)["dag_run_id"]
    deadline = time.monotonic() + 240
    while (states := api.task_states(FRESH_DAG_ID, run_id)).get("merge_snapshot") != "success":
        api.check_alive()
        assert "failed" not in states.values(), api.explain_run(FRESH_DAG_ID, run_id)
        assert time.monotonic() < deadline, f"no snapshot merged after 240 s: {states}"
        time.sleep(0.5)
    # The scheduler gave the run the factory's deadline (the DAG's class keeps it outside tests).
    assert _deadlines(api, FRESH_DAG_ID, run_id) == 1
    # The consumer is unpaused only now: Airflow queues runs of unpaused DAGs only, so its run
    # below comes from the catch-up's breached merge, not from the snapshot's event.
    api.unpause(consumer)
    assert api.dag_runs(consumer) == []
    group_execute(hook, f"INSERT INTO commerce.{FRESH_TABLE} (id, note) VALUES (3, 'c'), (4, 'd'), (5, 'e')")
    [run] = api.wait_for_runs(FRESH_DAG_ID, 1, timeout=300)
    assert run["state"] == "success", api.explain_run(FRESH_DAG_ID, run_id)
    states = api.task_states(FRESH_DAG_ID, run_id)
    assert (states["wait_for_changes"], states["catch_up"], states["merge"]) == ("success",) * 3, states
    merged = api.api(
        "GET", f"/api/v2/dags/{FRESH_DAG_ID}/dagRuns/{run_id}/taskInstances/merge/xcomEntries/return_value"
    )["value"]
    assert (merged["kind"], merged["breached"], merged["freshness_sla"]) == ("catchup", True, 0.01)
    [table_report] = merged["report"]["windows"][-1]["tables"]
    assert table_report["rows_inserted"] == 3, merged["report"]

    [ran] = api.wait_for_runs(consumer, 1, timeout=120)
    assert ran["state"] == "success" and ran["run_type"] == "asset_triggered", ran
    events = api.api("GET", f"/api/v2/dags/{consumer}/dagRuns/{ran['dag_run_id']}/upstreamAssetEvents")
    # The events since the asset's last consumption: the snapshot's (which queued nothing: the
    # consumer was paused) and the breached merge's, which queued this run.
    extras = sorted((e["extra"] for e in events["asset_events"]), key=lambda x: x["window_seq"])
    assert [(x["sync_id"], x["kind"], x["window_seq"]) for x in extras] == [
        (FRESH_SYNC, "snapshot", 1),
        (FRESH_SYNC, "catchup", merged["merged"]),
    ], extras
    assert (extras[-1]["rows_inserted"], extras[-1]["rows_updated"], extras[-1]["rows_deleted"]) == (3, 0, 0)
    assert_delta_equals_source(hook, "commerce", [FRESH_TABLE], lake / "fresh" / "delta")
