"""Issue 41 item 2 on the fleet: the broker restarted mid-run, and a triggerer that dies while it
holds a sync's deferred changes sensor.

* The broker (Redis, nothing on disk) is stopped and started again while a catch-up group runs: the
  messages it held are gone with it. The running task goes on (it reports to the api-server, not
  to the broker), the workers and the scheduler reconnect, and a task whose message was lost is
  queued again after ``[scheduler] task_queued_timeout``. The run ends in success, Delta ==
  ``SELECT *``, each window once.
* Two triggerers run (``dev/fleet.sh``): the one holding the sensor's trigger is SIGKILLed, the
  other takes the trigger over once the dead one's heartbeat is stale, fires on the next change,
  and the run catches up and merges: Delta == ``SELECT *``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.fleet.conftest import STORE, Fleet, assert_synced, fleet_script, kill_host
from tests.support.group_workload import Workload, create_orders, insert_filler, shards_of_customers

pytestmark = pytest.mark.integration

CUSTOMERS = range(1, 13)
FILLER_BASE = 800_000

# A one-process sync whose run waits for changes with the deferrable sensor, long enough for a
# triggerer to die and its trigger to move.
SENSOR_DAG = """
from datetime import timedelta
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="customer",
    tables=["{table}"],
    staging_location="s3a://{bucket}/staging",
    target_location="s3a://{bucket}/delta/{dag_id}",
    aws_conn_id="fleet_s3",
    {store}
    schedule=None,
    sensor_timeout=600,
    default_args={{"retries": 0}},
    merge_kwargs={{"spark_connect_conn_id": "spark_connect_default"}},
)
"""


@pytest.fixture
def triggerers_back(fleet: Fleet) -> Iterator[None]:
    """The triggerers a test killed run again after it (``dev/fleet.sh triggerer N``)."""
    yield
    for part in sorted(fleet.api.killed):
        done = fleet_script("triggerer", "2" if part == "triggerer-2" else "1", timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    fleet.api.killed.clear()


def test_a_broker_restarted_mid_run_loses_no_task_and_delta_equals_the_source(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path
) -> None:
    began = time.monotonic()
    api = fleet.api
    dag_id, table = f"fleet_broker_{secrets.token_hex(3)}", "fleet_broker_orders"
    create_orders(hook, f"customer.{table}", CUSTOMERS)
    shard_of = shards_of_customers(hook, f"customer.{table}")
    fleet.deploy_sync(dag_id, table, tmp_path, retries=1, retry_delay=5)
    first = api.run(dag_id)  # the snapshot
    assert first["state"] == "success", api.explain_run(dag_id, first["dag_run_id"])

    Workload(hook, 7, shard_of, f"customer.{table}", CUSTOMERS).round(40, "broker")
    for start in range(FILLER_BASE, FILLER_BASE + 24_000, 4000):
        insert_filler(hook, f"customer.{table}", CUSTOMERS, start, 4000, "broker filler")
    run_id = api.trigger(dag_id)["dag_run_id"]
    deadline = time.monotonic() + 240
    while not any(ti["state"] == "running" for ti in api.groups(dag_id, run_id)):
        assert time.monotonic() < deadline, f"no group ran within 240 s: {api.task_states(dag_id, run_id)}"
        time.sleep(0.2)
    restarted = fleet_script("restart-broker", timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-3000:]

    run = api.wait_for_run(dag_id, run_id, timeout=600)
    assert run["state"] == "success", api.explain_run(dag_id, run_id)
    states = api.task_states(dag_id, run_id)
    assert states["merge"] == "success", states
    assert_synced(fleet, spark, hook, dag_id, table, must_hold=api.merged(dag_id, run_id))
    api.pause(dag_id)
    print(f"broker restart test: {time.monotonic() - began:.1f} s; task states {states}")


def _trigger_host(fleet: Fleet, dag_id: str, run_id: str) -> str | None:
    """The host (``control`` or ``control-2``) of the triggerer running the sensor's trigger, if
    one has it (the trigger's triggerer job, its ``ti.hostname``-style name)."""
    ti: dict[str, Any] = fleet.api.api(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/wait_for_changes"
    )
    trigger = ti.get("trigger") or {}
    if ti["state"] != "deferred" or trigger.get("triggerer_id") is None:
        return None
    job = fleet.api.api("GET", "/api/v2/jobs", params={"job_type": "TriggererJob", "limit": 100})["jobs"]
    hosts = {j["id"]: j["hostname"] for j in job}
    host = hosts.get(trigger["triggerer_id"])
    return str(host) if host else None


def test_a_dead_triggerers_sensor_is_taken_over_by_the_other_and_the_run_syncs(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path, triggerers_back: None
) -> None:
    began = time.monotonic()
    api = fleet.api
    dag_id, table = f"fleet_trig_{secrets.token_hex(3)}", "fleet_trigger_orders"
    create_orders(hook, f"customer.{table}", CUSTOMERS)
    shard_of = shards_of_customers(hook, f"customer.{table}")
    api.deploy(
        dag_id, SENSOR_DAG.format(dag_id=dag_id, table=table, bucket=fleet.bucket, store=STORE), tmp_path
    )
    api.wait_for_dag(dag_id)
    api.unpause(dag_id)

    # The run snapshots, merges, and its sensor defers: no change after the snapshot yet.
    run_id = api.trigger(dag_id)["dag_run_id"]
    deadline = time.monotonic() + 300
    while (holder := _trigger_host(fleet, dag_id, run_id)) is None:
        assert time.monotonic() < deadline, f"the sensor never deferred: {api.task_states(dag_id, run_id)}"
        time.sleep(0.5)
    part = "triggerer" if holder == "control" else "triggerer-2"
    other = "control-2" if holder == "control" else "control"
    api.killed.add(part)
    assert len(kill_host(fleet, part)) >= 1

    # The other triggerer takes the trigger over once the dead one's heartbeat is stale.
    deadline = time.monotonic() + 120
    while _trigger_host(fleet, dag_id, run_id) != other:
        assert time.monotonic() < deadline, (
            f"the trigger stayed with the dead {holder}: {_trigger_host(fleet, dag_id, run_id)}"
        )
        time.sleep(0.5)
    Workload(hook, 11, shard_of, f"customer.{table}", CUSTOMERS).round(30, "after the handover")

    run = api.wait_for_run(dag_id, run_id, timeout=600)
    assert run["state"] == "success", api.explain_run(dag_id, run_id)
    states = api.task_states(dag_id, run_id)
    assert states["wait_for_changes"] == "success" and states["merge"] == "success", states
    assert_synced(fleet, spark, hook, dag_id, table, must_hold=api.merged(dag_id, run_id))
    api.pause(dag_id)
    print(f"triggerer test: {time.monotonic() - began:.1f} s; killed {part}, the trigger went to {other}")
