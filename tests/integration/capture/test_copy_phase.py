"""A snapshot of a table whose copy on a shard takes longer than vttablet's copy-phase duration.

On the four-shard cluster (``four_shard_cluster``), whose vttablets run with
``--vreplication-copy-phase-duration`` at a few seconds (and, MariaDB ignoring the
MAX_EXECUTION_TIME hint that carries it on MySQL, the same bound on the row streamer's MariaDB
user: ``dev/vitess_topology.sh``), so each copy query is killed when that time runs out:

a table with a primary key, nearly all its rows on one shard, copies there for longer than the
duration: each killed query is started again from its last copied key (by vtgate, unseen by
the client), every row is staged once, and the snapshot, merged into Delta, equals ``SELECT *``.
The copy is made long by the wire, not by the machine: the snapshot's VStream runs through a
``FaultProxy`` at a few MB/s, and the stream's flow control holds vttablet's copy query back.

The tablets' logs show the condition was there: the copy queries carry the flag's value as
their MAX_EXECUTION_TIME hint, and were killed and started again from their last key.

A copy query that cannot send a row within the duration (a keyless table whose sort outlasts
it) is started over by Vitess for ever (vitessio/vitess#20039); the snapshot then fails with
``CopyStalledError`` after ``copy_stall_seconds`` (``tests/unit/vstream/test_window_copy.py``). Not
made here: a sort that outlasts 2 s on every run needs millions of rows on this machine (the
first row of 1.6 million 230-byte rows sorted with LIMIT 1 took 2 s), more than the suite's
time budget allows. A keyless table of 400,000 rows did
copy here, but in 2-second cycles that each sorted the rest again and sent a few thousand rows
(four minutes): too slow and too variable for the suite.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.staging import read_table
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.faultproxy import FaultProxy
from tests.support.local import connection_uri_env
from tests.support.topology import FourShardCluster

pytestmark = pytest.mark.integration

BIG = "copy_phase_big"
TENANT = 7  # every row but a few on this tenant's shard (the vindex column)
BIG_ROWS = 200_000
BATCH = 10_000
# The snapshot's stream from vtgate, at most this fast: BIG_ROWS (~40 MB on the wire) then take
# several times the copy-phase duration to arrive (~10 s), and vttablet's copy, held back by the
# stream's flow control once the buffers on the way are full, outlasts it on any machine.
COPY_BYTES_PER_SECOND = 4_000_000
# A copy query's kill: MySQL's (MAX_EXECUTION_TIME, error 3024) or MariaDB's (error 1969).
KILLED = re.compile(r"maximum statement execution time exceeded|max_statement_time exceeded")


@pytest.fixture(scope="module")
def proxy(four_shard_cluster: FourShardCluster) -> Iterator[FaultProxy]:
    """Between the snapshot's VStream and vtgate: the copy is made slow by the wire, whatever
    the machine's speed (a fast machine copied BIG_ROWS in under the duration: CI, session 19)."""
    p = FaultProxy(four_shard_cluster.vitess.grpc_port)
    p.start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def hook(four_shard_cluster: FourShardCluster, proxy: FaultProxy) -> Iterator[VitessHook]:
    # gRPC through the proxy; SQL (DDL, the fill, the oracle's SELECT) straight to vtgate.
    vitess = dataclasses.replace(four_shard_cluster.vitess, grpc_port=proxy.port)
    name, value = connection_uri_env("vitess_shards4", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_shards4")


def _create(hook: VitessHook, cluster: FourShardCluster, table: str, columns: str) -> None:
    ks = cluster.keyspace
    wl.execute(hook, f"DROP TABLE IF EXISTS {ks}.{table}", f"CREATE TABLE {ks}.{table} ({columns})")
    try:  # the vschema outlives a dropped table
        wl.execute(hook, f"ALTER VSCHEMA ON {ks}.{table} ADD VINDEX hash(tenant) USING hash")
    except Exception as exc:
        if "already" not in str(exc):
            raise


def _fill(hook: VitessHook, sql: str, rows: int, row: Callable[[int], dict[str, Any]]) -> None:
    """``rows`` rows in batches of BATCH; ``row(i)`` gives row i's values."""
    for first in range(0, rows, BATCH):
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(sqlalchemy.text(sql), [row(i) for i in range(first, min(first + BATCH, rows))])


def _shard_of_tenant(hook: VitessHook, cluster: FourShardCluster) -> str:
    """The shard vtgate routes TENANT's rows to (its hash vindex, asked as a table)."""
    with hook.connect_sql() as conn:
        shard = conn.execute(
            sqlalchemy.text(f"SELECT shard FROM {cluster.keyspace}.hash WHERE id = :id"), {"id": TENANT}
        ).scalar_one()
    name = shard.decode() if isinstance(shard, bytes) else str(shard)
    assert name in cluster.shards, name
    return name


def _copy_queries(text: str, table: str) -> list[str]:
    """The row streamers' copy queries of ``table`` in the tablets' log ``text``."""
    return re.findall(rf"Streaming query: (select .* from `?{table}`?\b.*)", text)


def _big_row(i: int) -> dict[str, Any]:
    return {
        "i": i,
        "t": TENANT,
        "n": f"row {i} " + "x" * (i % 150),
        "a": f"{i % 10_000}.{i % 100:02d}",
        "s": f"2026-03-{i % 28 + 1:02d} 12:{i % 60:02d}:00.{i % 1_000_000:06d}",
    }


def test_a_copy_longer_than_the_copy_phase_duration_completes_exactly(
    hook: VitessHook, proxy: FaultProxy, four_shard_cluster: FourShardCluster, tmp_path: Path
) -> None:
    cluster, ks = four_shard_cluster, four_shard_cluster.keyspace
    _create(
        hook, cluster, BIG,
        "id BIGINT NOT NULL PRIMARY KEY, tenant BIGINT NOT NULL, note VARCHAR(200) NOT NULL, "
        "amount DECIMAL(12,2), seen DATETIME(6)",
    )  # fmt: skip
    insert = f"INSERT INTO {ks}.{BIG} (id, tenant, note, amount, seen) VALUES (:i, :t, :n, :a, :s)"
    _fill(hook, insert, BIG_ROWS, _big_row)
    # A few rows on the other shards too: every shard copies, one of them for long.
    _fill(
        hook, insert, 40, lambda i: {"i": BIG_ROWS + i, "t": 100 + i, "n": "elsewhere", "a": None, "s": None}
    )
    heavy = _shard_of_tenant(hook, cluster)

    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec("copy-phase-big", ks, (BIG,), str(tmp_path / "stage"))
    logs_before = cluster.tablet_log_sizes()
    proxy.slow(COPY_BYTES_PER_SECOND)
    started = time.monotonic()
    try:
        outcome = CaptureRunner(hook, store, spec, holder="test").snapshot(checkpoint_every_rows=50_000)
    finally:
        proxy.slow(None)
    took = time.monotonic() - started
    print(
        f"\ncopy of {BIG_ROWS} rows on shard {heavy}: snapshot {took:.1f}s, {proxy.stats.bytes_down:,} bytes"
    )
    assert store.window(spec.sync_id, outcome.seq).state is WindowState.STAGED

    # The condition: the copy queries carry the flag (2s -> 2000 ms), and the heavy shard's was
    # killed at that duration and started again from its last key (the stream's rate decides
    # how often, not the machine's speed).
    logs = cluster.tablet_logs(since=logs_before)
    queries = _copy_queries(logs, BIG)
    duration_ms = int(float(cluster.copy_phase_duration.rstrip("s")) * 1000)
    assert queries and all(f"MAX_EXECUTION_TIME({duration_ms})" in q for q in queries), queries[:3]
    resumed = [q for q in queries if re.search(r"where \(`?id`? > \d+\)", q)]
    killed = KILLED.findall(logs)
    print(f"copy queries of {BIG}: {len(queries)}, resumed from a last key: {len(resumed)}")
    assert len(resumed) >= 1 and len(killed) >= len(resumed), (len(queries), len(resumed), len(killed))

    # Staged exactly once per row (at-least-once is allowed, but a resumed copy recopies nothing).
    staged = read_table(outcome.manifest, BIG).to_pylist()
    ids = [r["id"] for r in staged]
    assert len(ids) == BIG_ROWS + 40 and len(set(ids)) == len(ids), (len(ids), len(set(ids)))
    assert {r["_shard"] for r in staged if r["tenant"] == TENANT} == {heavy}

    # Merged into Delta: Delta == SELECT * through vtgate.
    key = outcome.manifest.tables[BIG].key_columns
    target = TableTarget(BIG, str(tmp_path / "delta" / BIG), tuple(key), tuple(key))
    window = WindowToMerge(outcome.seq, outcome.manifest.path, (BIG,))
    report = merge(spark_session(), MergePlan(spec.sync_id, (window,), {BIG: target}))
    assert report.statuses() == {(outcome.seq, BIG): TableStatus.WRITTEN}
    spark = spark_session()
    assert wl.assert_equal_to_source(spark, hook, ks, BIG, target.path, list(key)) == BIG_ROWS + 40
    wl.execute(hook, f"DROP TABLE IF EXISTS {ks}.{BIG}")
