"""Assets and OpenLineage of a sync DAG run through Airflow (``dag.test()``), real Vitess, Spark,
Delta, and the OpenLineage provider writing to its file transport.

One sequence serves both (each merge is a spark-submit): run 1 snapshots both tables; the
consumer DAGs (one per table's Asset) are added; only ``customer`` changes; run 2 catches up.
Then: each table has one asset event per window that changed it, with the window's extra; only
the consumer of ``customer`` is queued by Airflow after run 2; that consumer's ``inlet_events``
carry the extra; the COMPLETE events name exactly the source tables and Delta tables.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_MERGE, AirflowEnv, make_airflow_env
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

DAG_ID = SYNC = "lineage_sync"
KEYSPACE = "customer"
TABLES = ("customer", "corder")
ID_BASE = 9_500_000
ADDED = (ID_BASE + 10, ID_BASE + 11)  # customers run 2 inserts

SYNC_DAG = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="{keyspace}",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    sensor_timeout=8,
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""

# One consumer per table, scheduled on its Asset; it prints the extra of the latest event.
CONSUMER_DAG = """
import json
from airflow.sdk import DAG, Asset, task

for table in {tables!r}:
    asset = Asset("file://{lake}/delta/" + table)
    with DAG("on_" + table, schedule=[asset]) as dag:

        @task(inlets=[asset])
        def read(inlet_events=None, asset=asset):
            print("INLET_EXTRA " + json.dumps(dict(inlet_events[asset][-1].extra)))

        read()
    globals()["on_" + table] = dag
"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_lineage_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_lineage_test")


@pytest.fixture(scope="module")
def airflow(
    vitess: LocalVitess, spark_connect: str, lake: Path, tmp_path_factory: pytest.TempPathFactory
) -> AirflowEnv:
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess, spark_connect=spark_connect)
    events = env.home / "openlineage.jsonl"
    env.env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
        {"type": "file", "log_file_path": str(events), "append": True}
    )
    env.env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "lineage_test"
    # Airflow queues asset-triggered runs of unpaused DAGs only (the consumers below).
    env.env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
    env.write_dag(
        "lineage_sync",
        SYNC_DAG.format(
            dag_id=DAG_ID, keyspace=KEYSPACE, tables=list(TABLES), lake=lake, merge_kwargs=CONNECT_MERGE
        ),
    )
    return env


def _sql(hook: VitessHook, *statements: tuple[str, dict[str, Any]]) -> None:
    with hook.connect_sql() as conn, conn.begin():
        for text, params in statements:
            conn.execute(sqlalchemy.text(text), params)


def _count(hook: VitessHook, table: str) -> int:
    with hook.connect_sql() as conn:
        return int(conn.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {KEYSPACE}.{table}")).scalar_one())


def _ok(result: dict[str, Any], *tasks: str) -> None:
    bad = {t: result["tasks"].get(t) for t in tasks if result["tasks"].get(t) != "success"}
    assert not bad, f"tasks not successful: {bad}; all: {result['tasks']}\n{result['log'][-5000:]}"


def _queued(airflow: AirflowEnv) -> set[str]:
    """DAGs Airflow queued for an asset-triggered run (what the scheduler turns into runs)."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        return {r[0] for r in db.execute("SELECT target_dag_id FROM asset_dag_run_queue")}


def _lineage(airflow: AirflowEnv, job: str) -> list[dict[str, Any]]:
    path = airflow.home / "openlineage.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in events if e["job"]["name"] == job and e["eventType"] == "COMPLETE"]


def _names(datasets: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


def test_assets_and_openlineage_of_a_snapshot_then_a_catch_up_of_one_table(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, vitess: LocalVitess
) -> None:
    ids = [ID_BASE + i for i in range(5)]
    _sql(
        hook,
        # Only this test's own ids: the shared tables can hold more rows than a DML may touch
        # through vtgate (10,000) by the time this test runs.
        *[("DELETE FROM customer.customer WHERE customer_id = :c", {"c": c}) for c in [*ids, *ADDED]],
        *[("DELETE FROM customer.corder WHERE order_id = :o", {"o": c}) for c in ids],
        *[
            ("INSERT INTO customer.customer (customer_id, email) VALUES (:c, :e)", {"c": c, "e": f"{c}@x"})
            for c in ids
        ],
        *[
            (
                "INSERT INTO customer.corder (order_id, customer_id, sku, price) VALUES (:o, :c, 'k', 1)",
                {"o": c, "c": c},
            )
            for c in ids
        ],
    )
    counts = {t: _count(hook, t) for t in TABLES}

    first = airflow.run_dag(DAG_ID)
    _ok(first, "snapshot", "merge_snapshot")
    uris = {t: f"file://{lake}/delta/{t}" for t in TABLES}
    after_snapshot = airflow.asset_events()
    for table in TABLES:
        (extra,) = after_snapshot[uris[table]]
        assert extra["sync_id"] == SYNC and extra["window_seq"] == 1 and extra["kind"] == "snapshot"
        assert extra["table"] == table and extra["mode"] == "replace"
        assert (extra["rows_inserted"], extra["rows_updated"], extra["rows_deleted"]) == (counts[table], 0, 0)
        assert extra["committed_vgtid"], extra

    # Consumers appear now, so the queue below shows what run 2 alone caused.
    airflow.write_dag("consumers", CONSUMER_DAG.format(tables=list(TABLES), lake=lake))
    airflow.airflow("dags", "reserialize")
    assert _queued(airflow) == set()

    _sql(
        hook,
        *[
            ("UPDATE customer.customer SET email = :e WHERE customer_id = :c", {"c": c, "e": f"new-{c}@x"})
            for c in ids[:3]
        ],
        *[("INSERT INTO customer.customer (customer_id, email) VALUES (:c, 'n@x')", {"c": c}) for c in ADDED],
        ("DELETE FROM customer.customer WHERE customer_id = :c", {"c": ids[4]}),
    )
    second = airflow.run_dag(DAG_ID)
    _ok(second, "wait_for_changes", "catch_up", "merge")
    events = airflow.asset_events()
    assert len(events[uris["corder"]]) == 1, "a window that did not touch corder emitted an event for it"
    assert len(events[uris["customer"]]) == 2
    extra = events[uris["customer"]][-1]
    assert extra["kind"] == "catchup" and extra["window_seq"] > 1 and extra["mode"] == "merge"
    assert (extra["rows_inserted"], extra["rows_updated"], extra["rows_deleted"]) == (2, 3, 1)
    assert _queued(airflow) == {"on_customer"}

    consumer = airflow.run_dag("on_customer")
    _ok(consumer, "read")
    lines = [x for x in consumer["log"].splitlines() if "INLET_EXTRA " in x]
    assert lines, consumer["log"][-4000:]
    assert json.loads(lines[-1].split("INLET_EXTRA ", 1)[1]) == extra

    # OpenLineage: exact inputs and outputs of each task that read or wrote.
    source = f"vitess://{vitess.host.lower()}:{vitess.grpc_port}"
    both_in = {(source, f"{KEYSPACE}.{t}") for t in TABLES}
    both_out = {("file", f"{lake}/delta/{t}") for t in TABLES}
    snap = _lineage(airflow, f"{DAG_ID}.snapshot")[0]  # run 2's had nothing to read
    assert _names(snap["inputs"]) == both_in and snap["outputs"] == []
    fields = {d["name"]: [f["name"] for f in d["facets"]["schema"]["fields"]] for d in snap["inputs"]}
    assert {"order_id", "customer_id", "price"} <= set(fields[f"{KEYSPACE}.corder"]), fields
    merge_snap = _lineage(airflow, f"{DAG_ID}.merge_snapshot")[0]
    assert _names(merge_snap["inputs"]) == both_in
    assert _names(merge_snap["outputs"]) == both_out
    out = {d["name"]: d for d in merge_snap["outputs"]}[f"{lake}/delta/corder"]
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == counts["corder"]
    lineage = out["facets"]["columnLineage"]["fields"]["price"]["inputFields"]
    assert lineage == [
        {
            "namespace": source,
            "name": f"{KEYSPACE}.corder",
            "field": "price",
            "transformations": [{"type": "DIRECT", "subtype": "IDENTITY"}],
        }
    ]
    (catch_up,) = _lineage(airflow, f"{DAG_ID}.merge")
    assert _names(catch_up["inputs"]) == {(source, f"{KEYSPACE}.customer")}
    assert _names(catch_up["outputs"]) == {("file", f"{lake}/delta/customer")}
    assert catch_up["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 6
