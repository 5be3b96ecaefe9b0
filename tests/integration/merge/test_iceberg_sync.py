"""An Iceberg sync through the DAG factory (``table_format="iceberg"``), run by Airflow
(``dag.test()``), merged by Spark 4.1's spark-submit with Iceberg 1.12 (``tests/support/iceberg_spark.py``),
its tables in a JDBC catalog on a throwaway PostgreSQL (an Airflow ``postgres`` connection, its
credentials reaching the job in its environment only).

One table per target mode, the target-mode tests' workload (moves between shards with either
half first, key changes, a same-second delete and re-insert, large and long transactions) in small
windows: ``pyiceberg`` reads each table, and each mode's oracle holds against ``SELECT *`` through
vtgate and the workload's record. A merge killed after its Iceberg commits is rerun and holds
each window once; a column added at the source meanwhile lands in every table. The consistent cut
the status page's JSON gives, each table's Iceberg SQL at its snapshot, reads in Spark what the
tables hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL, make_url

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.plugins import documents
from tests.support.airflow_env import (
    IVY_CACHE,
    AirflowEnv,
    assert_succeeded,
    failing_after_submit,
    make_airflow_env,
)
from tests.support.databases import start_postgres
from tests.support.iceberg_spark import (
    Catalog,
    canonical_rows,
    current_snapshot_id,
    driver_env,
    iceberg_dicts,
    iceberg_table,
    roll_back,
    spark_rows,
    spark_submit,
    sql_rows,
    windows_held,
)
from tests.support.local import LocalVitess
from tests.support.mode_oracles import (
    P,
    assert_changelog_changes,
    assert_history_states,
    assert_mirror,
    assert_soft_delete,
    source_dicts,
)
from tests.support.modes_workload import ModesWorkload, Record, modes_hook

pytestmark = pytest.mark.integration

MIRROR, SOFT, HIST, LOG = "ice_mirror", "ice_soft", "ice_hist", "ice_log"
TABLES = (MIRROR, SOFT, HIST, LOG)
SYNC = "iceberg_modes"
CATALOG_CONN = "iceberg_catalog"

DAG = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{sync}",
    keyspace="customer",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/iceberg",
    table_format="iceberg",
    iceberg_catalog_conn_id="{catalog_conn}",
    schedule=None,
    wait_for_changes=False,
    max_events=80,
    targets={{
        "{soft}": {{"mode": "soft_delete"}},
        "{hist}": {{"mode": "history"}},
        "{log}": {{"mode": "changelog"}},
    }},
    default_args={{"retries": 0}},
    spark_conn_id="spark_iceberg",
    merge_kwargs={{
        "spark_binary": os.environ.get("ICEBERG_TEST_SPARK_SUBMIT") or "{spark_submit}",
        "env_vars": {env_vars!r},
        "conf": {{"spark.jars.ivy": "{ivy}", "spark.sql.shuffle.partitions": "2"}},
    }},
)
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    with modes_hook(vitess, "vitess_iceberg", TABLES) as hook:
        yield hook


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


SECRET = "catalog-secret-never-logged"  # PostgreSQL's trust auth takes it unchecked


@pytest.fixture(scope="module")
def catalog_db() -> Iterator[URL]:
    """A JDBC catalog's database on a throwaway PostgreSQL."""
    server = start_postgres()
    try:
        yield make_url(server.create_database()).set(password=SECRET)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def catalog(catalog_db: URL) -> Catalog:
    """The catalog as the merge's Spark and ``pyiceberg`` reach it."""
    spark = IcebergCatalog.from_connection(
        conn_id=CATALOG_CONN, conn_type="postgres", host=catalog_db.host, port=catalog_db.port,
        schema=catalog_db.database, login=catalog_db.username, password=SECRET, extra={"catalog": "lake"},
    )  # fmt: skip
    return Catalog(spark, catalog_db.render_as_string(hide_password=False))


@pytest.fixture(scope="module")
def airflow(
    vitess: LocalVitess,
    lake: Path,
    catalog_db: URL,
    tmp_path_factory: pytest.TempPathFactory,
) -> AirflowEnv:
    submit = spark_submit()
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess)
    env.env[f"AIRFLOW_CONN_{CATALOG_CONN.upper()}"] = json.dumps(
        {
            "conn_type": "postgres",
            "host": catalog_db.host,
            "port": catalog_db.port,
            "schema": catalog_db.database,
            "login": catalog_db.username,
            "password": SECRET,
            "extra": {"catalog": "lake"},
        }
    )
    # The cluster's Spark is 4.1 (not the Airflow worker's PySpark): its Delta and Iceberg jars.
    env.env["AIRFLOW_CONN_SPARK_ICEBERG"] = json.dumps(
        {"conn_type": "spark", "host": "local[2]", "extra": {"spark_version": "4.1.3"}}
    )
    source = DAG.format(
        sync=SYNC,
        tables=list(TABLES),
        lake=lake,
        soft=SOFT,
        hist=HIST,
        log=LOG,
        spark_submit=submit,
        catalog_conn=CATALOG_CONN,
        env_vars=driver_env(),
        ivy=IVY_CACHE,
    )
    env.write_dag("iceberg_dags", source)
    return env


@pytest.fixture(scope="module")
def workload(hook: VitessHook) -> ModesWorkload:
    return ModesWorkload(hook, TABLES, seed=41)


def _store(airflow: AirflowEnv) -> CheckpointStore:
    return CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")


@dataclass(frozen=True)
class Lake:
    """Where the sync's tables are, and the catalog that has them."""

    root: Path
    catalog: Catalog

    def path(self, table: str) -> Path:
        return self.root / "iceberg" / table


@pytest.fixture(scope="module")
def tables(lake: Path, catalog: Catalog) -> Lake:
    return Lake(lake, catalog)


def _rows(lake: Lake, table: str) -> list[dict[str, Any]]:
    return iceberg_dicts(lake.path(table), lake.catalog)


def _assert_all(hook: VitessHook, lake: Lake, record: Record) -> None:
    mirror = _rows(lake, MIRROR)
    assert mirror and all(not c.startswith(P) for c in mirror[0]), "a plain mirror has no metadata columns"
    assert_mirror(MIRROR, mirror, source_dicts(hook, "customer", MIRROR))
    gone = {k for k, states in record.states.items() if states[-1] is None}
    assert_soft_delete(SOFT, _rows(lake, SOFT), source_dicts(hook, "customer", SOFT), gone)
    assert_history_states(HIST, _rows(lake, HIST), record)
    assert_changelog_changes(LOG, _rows(lake, LOG), record)
    for table in TABLES:
        held = windows_held(lake.path(table), lake.catalog)
        assert held and all(n == 1 for n in held.values()), (table, held)


def test_each_mode_to_iceberg_through_the_dag_factory(
    airflow: AirflowEnv, hook: VitessHook, tables: Lake, workload: ModesWorkload
) -> None:
    lake = tables
    workload.initial(40)
    assert_succeeded(airflow.run_dag(SYNC), "snapshot", "merge_snapshot", "catch_up", "merge")
    for i in range(3):
        workload.round(big=i == 1)
    run = airflow.run_dag(SYNC)
    assert_succeeded(run, "snapshot", "merge_snapshot", "catch_up", "merge")
    assert _store(airflow).committed(SYNC)[1] >= 4, "small windows: a chain of several"
    _assert_all(hook, lake, workload.record)
    # Spark (4.1, Iceberg's runtime, the JDBC catalog) reads what pyiceberg read.
    by_spark = spark_rows([lake.path(t) for t in TABLES], IVY_CACHE, lake.catalog)
    for table in TABLES:
        assert canonical_rows(by_spark[str(lake.path(table))]) == canonical_rows(_rows(lake, table)), table
    # The catalog has each table by name at the sync's location, format 2, merge-on-read.
    mirror = iceberg_table(lake.path(MIRROR), lake.catalog)
    assert mirror.metadata.location == str(lake.path(MIRROR))
    assert mirror.metadata.format_version == 2 and mirror.properties["write.merge.mode"] == "merge-on-read"
    assert SECRET not in run["log"], "the catalog's password is never logged"
    # Each table's Asset is its location; its newest event names the snapshot the table is at.
    events = airflow.asset_events()
    for table in TABLES:
        newest = events[f"file://{lake.path(table)}"][-1]
        snapshot = current_snapshot_id(lake.path(table), lake.catalog)
        assert (newest["table_format"], newest["snapshot_id"], newest["catalog"]) == (
            "iceberg",
            snapshot,
            "lake",
        )
    _assert_the_cut_reads_the_tables(airflow, lake)


def _assert_the_cut_reads_the_tables(airflow: AirflowEnv, lake: Lake) -> None:
    """The consistent cut at the committed position as the status page's JSON API gives it (the
    document it serves): each table's Iceberg snapshot, its table's current one (the sync is its
    only writer), and SQL that, run in Spark 4.1 as a user runs it, reads what the table holds:
    the table by its name in the JDBC catalog."""
    status = documents.sync_status(_store(airflow), "default", SYNC, datetime.now(timezone.utc))
    assert status is not None
    cut = json.loads(status.model_dump_json())["cut"]
    assert cut is not None and set(cut["tables"]) == set(TABLES), cut
    queries = {}
    for table, at in cut["tables"].items():
        location = lake.path(table)
        snapshot = current_snapshot_id(location, lake.catalog)
        assert (at["table_format"], at["snapshot_id"], at["catalog"]) == ("iceberg", snapshot, "lake"), at
        assert at["sql"] == f"SELECT * FROM `lake`.`iceberg`.`{table}` VERSION AS OF {at['snapshot_id']}", at
        queries[location] = at["sql"]
    by_cut = sql_rows(queries, IVY_CACHE, lake.catalog)
    for table in TABLES:
        assert canonical_rows(by_cut[str(lake.path(table))]) == canonical_rows(_rows(lake, table)), table


def test_a_merge_killed_after_its_iceberg_commits_is_rerun_and_holds_each_window_once(
    airflow: AirflowEnv, hook: VitessHook, tables: Lake, workload: ModesWorkload, tmp_path: Path
) -> None:
    """Its windows also add a column at the source: every table gets it, in place."""
    lake = tables
    store = _store(airflow)
    before = store.committed(SYNC)[1]
    workload.add_column("tag")
    for _ in range(2):
        workload.round()
    wrapper = failing_after_submit(spark_submit(), tmp_path)
    failing = AirflowEnv(airflow.home, {**airflow.env, "ICEBERG_TEST_SPARK_SUBMIT": str(wrapper)})
    killed = failing.run_dag(SYNC)
    assert killed["tasks"]["merge"] == "failed", killed["tasks"]
    assert "injected failure after spark-submit (exit 0)" in killed["log"]
    staged = [w.seq for w in store.open_windows(SYNC) if w.state is WindowState.STAGED]
    assert staged and store.committed(SYNC)[1] == before, "the windows are in Iceberg, not committed"
    held = {seq for app, seq in windows_held(lake.path(MIRROR), lake.catalog) if app.endswith(f":{MIRROR}")}
    assert set(staged) & held, (staged, held)

    rerun = airflow.run_dag(SYNC)
    assert_succeeded(rerun, "snapshot", "merge_snapshot", "catch_up", "merge")
    assert "already_applied" in rerun["log"]
    assert store.committed(SYNC)[1] >= max(staged)
    _assert_all(hook, lake, workload.record)
    for table in TABLES:
        assert "tag" in _rows(lake, table)[0], table


def test_a_table_rolled_back_under_the_sync_is_refused_and_a_resnapshot_heals_it(
    airflow: AirflowEnv, hook: VitessHook, tables: Lake, workload: ModesWorkload
) -> None:
    """Another program rolls the mirror back one snapshot: the next merge refuses it, naming
    the rollback and the re-snapshot; the re-snapshot the message names heals it."""
    lake = tables
    mirror = lake.path(MIRROR)
    roll_back([mirror], IVY_CACHE, lake.catalog)
    workload.round()
    refused = airflow.run_dag(SYNC)
    assert refused["tasks"]["merge"] == "failed", refused["tasks"]
    log = refused["log"]
    assert f"the Iceberg table at {mirror} holds this sync's windows only up to" in log
    assert "rolled back (rollback_to_snapshot)" in log and '{"resnapshot_tables": ["ice_mirror"]}' in log
    healed = airflow.run_dag(SYNC, conf={"resnapshot_tables": [MIRROR]})
    assert_succeeded(healed, "snapshot", "merge_snapshot", "catch_up", "merge")
    _assert_all(hook, lake, workload.record)
