"""A backlog several times ``max_events`` is caught up by one run of the factory's DAG
(``dag.test()``): the catch-up task stages a chain of bounded windows, the merge task merges
them in one Spark job and commits each; Delta == ``SELECT *`` through vtgate, and each window is
in every table's Delta log once. Real Vitess, Spark, Delta, Airflow."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_MERGE, make_airflow_env
from tests.support.customer_workload import run_workload
from tests.support.delta_check import assert_delta_equals_source, delta_txns
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

TABLES = ("corder",)  # the table with rows moved between shards; one table: half the merges
SYNC = "dag_backlog_sync"
ID_BASE = 6_500_000
MAX_EVENTS = 30
TRANSACTIONS = 16  # of ~8-12 changes of corder each: 4-5 windows of MAX_EVENTS

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag_backlog_sync = vitess_sync_dag(
    "dag_backlog_sync",
    keyspace="customer",
    tables=["corder"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    max_events={max_events},
    sensor_timeout=10,
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_backlog_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_backlog_test")


def _transactions(hook: VitessHook, first_seed: int, count: int) -> None:
    for seed in range(first_seed, first_seed + count):  # one transaction each
        run_workload(hook, seed, id_base=ID_BASE, customers=30, orders=60, rounds=8, tag="b")


def test_a_backlog_of_several_windows_is_caught_up_by_one_dag_run(
    vitess: LocalVitess, spark_connect: str, hook: VitessHook, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    airflow = make_airflow_env(tmp_path / "af", vitess, spark_connect=spark_connect)
    dag_source = DAG_FILE.format(lake=lake, max_events=MAX_EVENTS, merge_kwargs=CONNECT_MERGE)
    airflow.write_dag("backlog_dag", dag_source)
    _transactions(hook, 1, 3)
    first = airflow.run_dag(SYNC)
    assert first["tasks"]["merge_snapshot"] == "success", first["tasks"]
    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    committed_before, snapshot_seq = store.committed(SYNC)

    _transactions(hook, 100, TRANSACTIONS)  # the outage's backlog
    run = airflow.run_dag(SYNC)
    assert all(run["tasks"][t] == "success" for t in ("catch_up", "merge")), run["tasks"]

    windows = [store.window(SYNC, s) for s in range(snapshot_seq + 1, store.committed(SYNC)[1] + 1)]
    rows = [int(w.stats["rows"]) for w in windows]
    # At least a chain of two: how many depends on how vtgate interleaves the two shards' events.
    # A window that reaches its stop also takes every unit the cross-shard merge order still held
    # back (it may pass MAX_EVENTS then), so the last window can be a large one (seen: 31 + 60).
    assert len(windows) >= 2, f"one run staged {len(windows)} window(s) of {rows} rows"
    assert all(w.kind is WindowKind.CATCHUP and w.state is WindowState.COMMITTED for w in windows)
    assert sum(rows) >= 3 * MAX_EVENTS
    # A window that stopped early did so at the first transaction boundary after MAX_EVENTS
    # row changes (one that reached its stop takes every change the merge order still held).
    early = [r for w, r in zip(windows, rows, strict=True) if w.stats["stopped_early"]]
    assert all(r < MAX_EVENTS + 20 for r in early), rows
    # A chain: each window starts where the one before it ends, the first at the snapshot's end.
    starts = [w.start_vgtid for w in windows]
    assert starts == [committed_before, *[w.end_vgtid for w in windows[:-1]]]
    assert store.committed(SYNC)[0] == windows[-1].end_vgtid
    assert store.open_window(SYNC) is None
    # The catch-up task staged them all; the merge task committed them all (one Spark job).
    seqs = ", ".join(str(w.seq) for w in windows)
    assert f"staged catch-up window(s) {seqs}:" in run["log"]
    assert f"committed window(s) {seqs} at" in run["log"]
    # The source's checks (key choice from information_schema, moves, row images) ran once for
    # the run's chain, not once per window.
    assert run["log"].count("table customer.corder: key ") == 1, run["log"]

    assert_delta_equals_source(hook, "customer", TABLES, lake / "delta")
    for table in TABLES:
        versions = Counter(version for _, version, _ in delta_txns(lake / "delta" / table))
        assert all(n == 1 for n in versions.values()), f"{table}: a window applied twice: {versions}"
        assert set(versions) <= {snapshot_seq, *(w.seq for w in windows)}
