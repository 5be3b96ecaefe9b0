"""Issue 41 on the fleet of ``dev/fleet.sh``: the CeleryExecutor and two Celery workers that share
no directory, staging and Delta on S3, the checkpoint store on PostgreSQL, merges on Spark
Connect with S3A. Real Vitess, Airflow, Celery, Redis, PostgreSQL, S3 server and Spark.

- A grouped sync (``capture_parallelism=2``), triggered through the api-server's REST API: the
  snapshot, then a workload, then a catch-up. The runs succeed, the catch-up's two group tasks
  ran on the two workers (``ti.hostname``), Delta == ``SELECT *`` through vtgate, and each window
  is once in the Delta log.
- A sync left on the per-machine SQLite store is refused at its first task on the fleet (issue
  41 item 3), and no worker is left with a store of its own.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging.files import open_location
from tests.fleet.conftest import Fleet, assert_synced, select_count
from tests.support.group_workload import Workload, create_orders, insert_filler, shards_of_customers

pytestmark = pytest.mark.integration

TABLE = "fleet_group_orders"
CUSTOMERS = range(1, 13)
FILLER_BASE = 600_000


def test_a_grouped_sync_runs_its_groups_on_both_workers_through_s3_and_postgresql(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path
) -> None:
    began = time.monotonic()
    api, bucket = fleet.api, fleet.bucket
    dag_id = f"fleet_grouped_{secrets.token_hex(3)}"
    table = f"customer.{TABLE}"
    create_orders(hook, table, CUSTOMERS)
    shard_of = shards_of_customers(hook, table)
    assert sorted(set(shard_of.values())) == ["-80", "80-"]
    fleet.deploy_sync(dag_id, TABLE, tmp_path, meet=True)

    first = api.run(dag_id)  # the snapshot (and a first, nearly empty, grouped window)
    assert first["state"] == "success", api.explain_run(dag_id, first["dag_run_id"])
    states = api.task_states(dag_id, first["dag_run_id"])
    assert (states["snapshot"], states["merge_snapshot"], states["merge"]) == ("success",) * 3, states

    wl = Workload(hook, 41, shard_of, table, CUSTOMERS)
    wl.round(40, "fleet")
    insert_filler(hook, table, CUSTOMERS, FILLER_BASE, 1000, "fleet filler")
    second = api.run(dag_id)  # the catch-up, read by the two groups
    run_id = second["dag_run_id"]
    assert second["state"] == "success", api.explain_run(dag_id, run_id)

    # The two groups ran on the two workers: each worker's own name, recorded by Airflow.
    a, b = api.groups(dag_id, run_id)
    assert (a["map_index"], a["state"], b["map_index"], b["state"]) == (0, "success", 1, "success"), (a, b)
    assert {a["hostname"], b["hostname"]} == {"worker-1", "worker-2"}, (a["hostname"], b["hostname"])
    assert a["start_date"] < b["end_date"] and b["start_date"] < a["end_date"], f"not at once: {a} / {b}"
    # Each wrote its task log on its own disk only.
    for ti in (a, b):
        own = fleet.api.state / ti["hostname"] / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        assert list(own.glob(f"task_id=catch_up/map_index={ti['map_index']}/attempt=*.log")), own

    # The checkpoint store on PostgreSQL: the catch-up's window, staged by both groups, committed.
    store = CheckpointStore(fleet.store_url)
    merged = api.merged(dag_id, run_id)
    groups = store.window_groups(dag_id, merged)
    assert [(g.shards, g.state) for g in groups] == [
        (("-80",), WindowState.STAGED),
        (("80-",), WindowState.STAGED),
    ]
    assert all(g.stats["rows"] >= 200 for g in groups), [g.stats for g in groups]
    assert str(store.window(dag_id, merged).manifest_path).startswith(f"s3a://{bucket}/staging/{dag_id}/")
    assert store.window(dag_id, merged).state is WindowState.COMMITTED

    # Delta on S3 == SELECT * through vtgate; every window with changes once in its Delta log.
    assert_synced(fleet, spark, hook, dag_id, TABLE, must_hold=merged)
    assert select_count(hook, table) >= len(CUSTOMERS) + 1000
    assert store.open_window(dag_id) is None
    api.pause(dag_id)
    print(f"grouped fleet test: {time.monotonic() - began:.1f} s; groups on {a['hostname']}, {b['hostname']}")


def test_a_sync_on_the_sqlite_default_store_is_refused_on_the_fleet(fleet: Fleet, tmp_path: Path) -> None:
    """Issue 41 item 3 on a real fleet: the checkpoint store left at its per-machine SQLite
    default fails the run's first task, naming the setting; no worker made a store of its own."""
    api, bucket = fleet.api, fleet.bucket
    dag_id = f"fleet_sqlite_{secrets.token_hex(3)}"
    fleet.deploy_sync(dag_id, TABLE, tmp_path, store="")
    run = api.run(dag_id)
    assert run["state"] == "failed"
    tis = api.task_instances(dag_id, run["dag_run_id"])
    failed = [ti for ti in tis if ti["state"] == "failed"]
    assert len(failed) == 1 and failed[0]["hostname"] in ("worker-1", "worker-2"), failed
    assert {ti["state"] for ti in tis} - {"failed"} <= {"upstream_failed", "skipped", None}, tis
    log = api.task_log(dag_id, run["dag_run_id"], failed[0]["task_id"], failed[0]["try_number"])
    assert "SingleHostSettingsError" in log and "runs under CeleryExecutor" in log, log[-3000:]
    assert "its checkpoint store is a SQLite file" in log and "checkpoint_conn_id" in log, log[-3000:]
    assert "staging_location" not in log.split("SingleHostSettingsError", 1)[1][:2000], "S3 was called local"
    for host in fleet.api.hosts:
        assert not list((fleet.api.state / host).rglob("vitess_sync.db")), f"{host} made a SQLite store"
    fs, _ = open_location(f"s3a://{bucket}", fleet.s3.storage_options())
    assert not fs.exists(f"{bucket}/staging/{dag_id}"), "the refused run staged files"
    api.pause(dag_id)
