"""Issue 41 item 1 on the fleet: merges on a Spark standalone cluster (``dev/fleet.sh`` starts a
master and a worker), through spark-submit from the Celery worker that runs the merge task (client
mode: the driver there, the executors on the cluster) and through the Spark Connect server, whose
executors are the cluster's too. A grouped sync through spark-submit: its snapshot and catch-up
merges run as applications of the cluster, Delta on S3 == ``SELECT *``, each window once; the
Connect server is an application of the same cluster.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.fleet.conftest import STORE, Fleet, assert_synced
from tests.support.group_workload import Workload, create_orders, shards_of_customers

pytestmark = pytest.mark.integration

CUSTOMERS = range(1, 13)

# The fleet's grouped sync, its merges through spark-submit to the cluster (the `spark_fleet`
# connection): one core of the cluster's two, the Connect server holding the other.
SUBMIT_DAG = """
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
    capture_parallelism=2,
    wait_for_changes=False,
    spark_conn_id="spark_fleet",
    spark_conf={{"spark.cores.max": "1", "spark.executor.memory": "1g"}},
    default_args={{"retries": 0}},
)
"""


def _cluster(fleet: Fleet) -> dict[str, Any]:
    with urllib.request.urlopen(f"{fleet.values['FLEET_SPARK_MASTER_UI']}/json/", timeout=10) as answer:
        state: dict[str, Any] = json.loads(answer.read())
    return state


def test_a_grouped_sync_merges_on_the_spark_cluster_through_spark_submit(
    fleet: Fleet, hook: VitessHook, spark: SparkSession, tmp_path: Path
) -> None:
    began = time.monotonic()
    api = fleet.api
    dag_id, table = f"fleet_submit_{secrets.token_hex(3)}", "fleet_submit_orders"
    create_orders(hook, f"customer.{table}", CUSTOMERS)
    shard_of = shards_of_customers(hook, f"customer.{table}")
    api.deploy(
        dag_id, SUBMIT_DAG.format(dag_id=dag_id, table=table, bucket=fleet.bucket, store=STORE), tmp_path
    )
    api.wait_for_dag(dag_id)
    api.unpause(dag_id)
    # The Connect server (the spark fixture reads Delta through it) is an application of the cluster.
    assert any(app["name"] == "Spark Connect server" for app in _cluster(fleet)["activeapps"]), _cluster(
        fleet
    )
    done_before = {app["id"] for app in _cluster(fleet)["completedapps"]}

    first = api.run(dag_id, timeout=600)  # the snapshot (the first merge resolves its jars)
    assert first["state"] == "success", api.explain_run(dag_id, first["dag_run_id"])
    Workload(hook, 5, shard_of, f"customer.{table}", CUSTOMERS).round(40, "submit")
    second = api.run(dag_id, timeout=600)
    assert second["state"] == "success", api.explain_run(dag_id, second["dag_run_id"])

    merges = [
        app
        for app in _cluster(fleet)["completedapps"]
        if app["id"] not in done_before and dag_id in app["name"] and app["name"].startswith("vitess-merge")
    ]
    # merge_snapshot, and each run's merge (the first run's catch-up may stage a window too).
    assert len(merges) >= 2 and all(app["state"] == "FINISHED" for app in merges), _cluster(fleet)
    assert_synced(fleet, spark, hook, dag_id, table, must_hold=api.merged(dag_id, second["dag_run_id"]))
    api.pause(dag_id)
    print(
        f"spark-submit on the cluster: {time.monotonic() - began:.1f} s; "
        f"applications {[a['id'] for a in merges]}"
    )
