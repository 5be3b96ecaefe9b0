"""Issue 41 item 2 on the fleet: a worker SIGKILLed in the middle of a catch-up group, and in
the middle of a grouped snapshot's copy.

Every process of the worker (the Celery worker, its pool, the task's supervisor and process, its
log server) is killed at once while its group reads from vtgate, as when a host dies, and its
disk goes with it: its HOME, TMPDIR and spill directory are wiped before the retry. Airflow
fails the task once it stops heartbeating and retries it on the other worker, which reads the
group again (a catch-up from the committed position, a copy from its group's last checkpoint)
and stages its part anew under the group's lock. Then Delta == ``SELECT *`` through vtgate, and
each window is once in the Delta log. Real Vitess, Airflow, Celery, Redis, PostgreSQL, S3 server
and Spark Connect.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy
from pyspark.sql import SparkSession

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.fleet.conftest import Fleet, assert_synced, fleet_script, kill_host
from tests.support.group_workload import Workload, create_orders, insert_filler, shards_of_customers

pytestmark = pytest.mark.integration

TABLE = "fleet_kill_orders"
CUSTOMERS = range(1, 13)
FILLER_BASE = 700_000
FILLER_ROWS = 24_000  # inserted and updated: ~24,000 row events per group, ~0.5 s of reading
# The killed try's group lock is taken over once it has had no heartbeat for 2 minutes
# (capture/run.py's TASK_STALE_AFTER); the fleet fails the try after 20 s without heartbeat
# ([scheduler] task_instance_heartbeat_timeout), so its retry waits the rest: an earlier retry
# fails on the lock (what the first run on the fleet did, with a 1 s delay).
RETRY_DELAY = 115


@pytest.fixture
def worker_back(fleet: Fleet) -> Iterator[list[str]]:
    """The hosts a test killed are started again after it (``dev/fleet.sh worker N``)."""
    killed: list[str] = []
    yield killed
    for host in killed:
        done = fleet_script("worker", host.removeprefix("worker-"), timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]


def _attempt_log(
    fleet: Fleet, dag_id: str, run_id: str, task_id: str, host: str, map_index: int, attempt: int
) -> Path:
    logs = fleet.api.state / host / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    return logs / f"task_id={task_id}" / f"map_index={map_index}" / f"attempt={attempt}.log"


def wipe_disk(fleet: Fleet, host: str) -> None:
    """What a dead host's disk held is gone: its HOME, TMPDIR and spill directory (dev/fleet.sh's
    per-worker directories; its Airflow home with the task logs and the deployed DAGs stays, for
    the assertions and for the worker the test starts again afterwards)."""
    for name in ("home", "tmp", "spill"):
        shutil.rmtree(fleet.api.state / host / name)
        (fleet.api.state / host / name).mkdir()


@dataclass(frozen=True)
class Kill:
    host: str
    map_index: int
    pids: list[int]


def kill_a_reading_group(fleet: Fleet, dag_id: str, run_id: str, task_id: str, killed: list[str]) -> Kill:
    """Waits for a group of ``task_id`` to start reading from vtgate, then kills its host and
    wipes its disk; the host is added to ``killed`` (started again after the test)."""
    api, deadline = fleet.api, time.monotonic() + 240
    victim = None
    while victim is None:
        groups = api.groups(dag_id, run_id, task_id)
        victim = next((ti for ti in groups if ti["state"] == "running" and ti["hostname"]), None)
        assert time.monotonic() < deadline, f"no group ran within 240 s: {api.task_states(dag_id, run_id)}"
        time.sleep(0.2)
    host, index = victim["hostname"], victim["map_index"]
    # Its read takes about half a second: watch its log on its worker's disk, not the API.
    log = _attempt_log(fleet, dag_id, run_id, task_id, host, index, 1)
    while "Connecting to vtgate gRPC" not in _text(log):
        assert time.monotonic() < deadline, f"group {index} never read: {_text(log)[-2000:]}"
        time.sleep(0.01)
    killed.append(host)
    pids = kill_host(fleet, host)
    assert len(pids) >= 3, f"{host}: only {pids} killed"  # worker, pool, supervisor, task, log server
    assert "staged" not in _text(log), (
        f"group {index} had staged its part before the kill: {_text(log)[-2000:]}"
    )
    wipe_disk(fleet, host)
    return Kill(host, index, pids)


def assert_retried_on_the_other(fleet: Fleet, dag_id: str, run_id: str, task_id: str, kill: Kill) -> None:
    """The killed group's try 1 ran on the killed host, its try 2 (the last) on the other host,
    which staged the group's part."""
    api = fleet.api
    tries = api.api(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{kill.map_index}/tries"
    )["task_instances"]
    by_try = {t["try_number"]: (t["hostname"], t["state"]) for t in tries}
    other = next(h for h in ("worker-1", "worker-2") if h != kill.host)
    assert by_try[1][0] == kill.host and by_try[2] == (other, "success") and len(by_try) == 2, by_try
    retry_log = _text(_attempt_log(fleet, dag_id, run_id, task_id, other, kill.map_index, 2))
    assert f"group {kill.map_index} (" in retry_log and "staged" in retry_log, retry_log[-3000:]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_worker_killed_mid_group_is_retried_on_the_other_and_delta_equals_the_source(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path, worker_back: list[str]
) -> None:
    began = time.monotonic()
    api = fleet.api
    dag_id = f"fleet_kill_{secrets.token_hex(3)}"
    table = f"customer.{TABLE}"
    create_orders(hook, table, CUSTOMERS)
    shard_of = shards_of_customers(hook, table)
    fleet.deploy_sync(dag_id, TABLE, tmp_path, retries=1, retry_delay=RETRY_DELAY)
    first = api.run(dag_id)  # the snapshot
    assert first["state"] == "success", api.explain_run(dag_id, first["dag_run_id"])

    Workload(hook, 42, shard_of, table, CUSTOMERS).round(40, "kill")
    for start in range(FILLER_BASE, FILLER_BASE + FILLER_ROWS, 4000):
        insert_filler(hook, table, CUSTOMERS, start, 4000, "kill filler")

    run_id = api.trigger(dag_id)["dag_run_id"]
    kill = kill_a_reading_group(fleet, dag_id, run_id, "catch_up", worker_back)
    run = api.wait_for_run(dag_id, run_id, timeout=300)
    assert run["state"] == "success", api.explain_run(dag_id, run_id)
    assert_retried_on_the_other(fleet, dag_id, run_id, "catch_up", kill)

    # The window the run merged: both groups' parts staged (the killed one's by its retry).
    store = CheckpointStore(fleet.store_url)
    merged = api.merged(dag_id, run_id)
    parts = store.window_groups(dag_id, merged)
    assert [(g.shards, g.state) for g in parts] == [
        (("-80",), WindowState.STAGED),
        (("80-",), WindowState.STAGED),
    ]
    assert sum(g.stats["rows"] for g in parts) >= 2 * FILLER_ROWS, [g.stats for g in parts]
    assert_synced(fleet, spark, hook, dag_id, TABLE, must_hold=merged)
    api.pause(dag_id)
    took = time.monotonic() - began
    print(
        f"kill test: {took:.1f} s; killed {kill.host} ({len(kill.pids)} processes) mid-group {kill.map_index}"
    )


SNAPSHOT_TABLE = "fleet_kill_copy"
SNAPSHOT_ROWS = 60_000  # ~30,000 rows a group: its copy takes a few seconds, the kill lands in it


def test_a_worker_killed_mid_copy_of_a_grouped_snapshot_is_retried_on_the_other_and_delta_equals_the_source(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path, worker_back: list[str]
) -> None:
    began = time.monotonic()
    api = fleet.api
    dag_id = f"fleet_copy_kill_{secrets.token_hex(3)}"
    table = f"customer.{SNAPSHOT_TABLE}"
    create_orders(hook, table, CUSTOMERS)
    for start in range(FILLER_BASE, FILLER_BASE + SNAPSHOT_ROWS, 4000):
        insert_filler(hook, table, CUSTOMERS, start, 4000, "copy filler")
    fleet.deploy_sync(dag_id, SNAPSHOT_TABLE, tmp_path, retries=1, retry_delay=RETRY_DELAY)

    run_id = api.trigger(dag_id)["dag_run_id"]  # the snapshot, copied by two groups
    kill = kill_a_reading_group(fleet, dag_id, run_id, "snapshot", worker_back)
    run = api.wait_for_run(dag_id, run_id, timeout=300)
    assert run["state"] == "success", api.explain_run(dag_id, run_id)
    assert_retried_on_the_other(fleet, dag_id, run_id, "snapshot", kill)

    store = CheckpointStore(fleet.store_url)
    merged = int(
        api.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/merge_snapshot/xcomEntries/return_value",
        )["value"]["merged"]
    )
    parts = store.window_groups(dag_id, merged)
    assert [(g.shards, g.state) for g in parts] == [
        (("-80",), WindowState.STAGED),
        (("80-",), WindowState.STAGED),
    ]
    # The status page's progress: each group's count(*) of its shards, summed (the killed
    # group's counted again by its retry, not twice), and every row copied.
    with hook.connect_sql() as conn:
        rows = conn.execute(sqlalchemy.text(f"SELECT count(*) FROM {table}")).scalar_one()
    [progress] = store.progress(dag_id, merged)
    assert (progress.table, progress.rows_known) == (SNAPSHOT_TABLE, rows), progress
    assert progress.rows_copied >= rows, progress
    assert_synced(fleet, spark, hook, dag_id, SNAPSHOT_TABLE, must_hold=merged)
    api.pause(dag_id)
    print(
        f"copy kill test: {time.monotonic() - began:.1f} s; "
        f"killed {kill.host} mid-copy of group {kill.map_index}"
    )
