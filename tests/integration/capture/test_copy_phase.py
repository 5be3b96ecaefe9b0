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

A copy query that cannot send a row within the duration (a keyless table, sorted whole before
its first row) is started over by Vitess for ever (vitessio/vitess#20039); the snapshot then fails
with ``CopyStalledError`` after ``copy_stall_seconds``. Made here by a keyless table whose sort
outlasts a duration lowered to 40 ms for that test (``dev/vitess_topology.sh copy-phase``: the
vttablets restarted with another flag, their data kept), and healed by following the error's
remedy: the flag raised, ``copy_stall_timeout`` above it, the snapshot run again.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import CopyStalledError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.staging import read_table
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.faultproxy import FaultProxy
from tests.support.local import connection_uri_env
from tests.support.topology import FOUR_SHARD_COPY_PHASE, SCRIPT, FourShardCluster, four_shard_env

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


# ----- a copy that cannot send its first rows within the duration: CopyStalledError's remedy --

STALLED = "copy_stall_keyless"
STALLED_ROWS = 150_000
# The duration the stall is made at: a keyless table is copied `order by` every column, sorted
# whole before its first row, and twice STALLED_ROWS rows of ~140 bytes (past MariaDB's 2 MB sort
# buffer: a sort on disk) took 0.4 s to sort here (at a load of 3), 10x the duration.
STALL_COPY_PHASE = "40ms"
FIRST_STALL_SECONDS = 6.0
# The remedy: the flag raised above what the copy query needs, copy_stall_timeout above the flag.
RAISED_COPY_PHASE = "30s"
RAISED_STALL_SECONDS = 45.0


def _copy_phase(duration: str) -> None:
    """``dev/vitess_topology.sh copy-phase``: the four-shard cluster's vttablets restarted with
    another --vreplication-copy-phase-duration (data kept), as an operator raises the flag."""
    proc = subprocess.run(
        [str(SCRIPT), "copy-phase", duration], env=four_shard_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _fill_on_shard(cluster: FourShardCluster, shard: str, sql: str) -> None:
    """``sql`` on ``shard``'s MariaDB itself (its socket, as the tablet's DBA): a bulk fill of
    rows that belong to that shard, in one statement instead of 30 round trips through vtgate."""
    uid = (cluster.shards.index(shard) + 1) * 100
    db = pymysql.connect(
        unix_socket=str(cluster.state_dir / f"vt_{uid:010d}" / "mysql.sock"),
        user="vt_dba",
        database=f"vt_{cluster.keyspace}",
        autocommit=True,
    )
    try:
        with db.cursor() as cur:
            cur.execute(sql)
    finally:
        db.close()


def test_a_stalled_copy_fails_with_copy_stalled_error_and_its_remedy_heals_it(
    hook: VitessHook, four_shard_cluster: FourShardCluster, tmp_path: Path
) -> None:
    """A copy query that cannot send its first rows within vttablet's copy-phase duration is
    killed at it and started again by Vitess for ever (vitessio/vitess#20039): here a keyless
    table whose sort outlasts a 40 ms duration. The snapshot fails with CopyStalledError naming
    the shard, the table, the flag and the remedy; the remedy, followed (the flag raised on the
    keyspace's vttablets above the time the query needs, copy_stall_timeout above the flag, the
    task run again), completes the snapshot, which resumes its window: Delta == SELECT *."""
    cluster, ks = four_shard_cluster, four_shard_cluster.keyspace
    _create(hook, cluster, STALLED, "tenant BIGINT NOT NULL, note VARCHAR(200) NOT NULL")
    insert = f"INSERT INTO {ks}.{STALLED} (tenant, note) VALUES (:t, :n)"
    _fill(hook, insert, 40, lambda i: {"t": 100 + i, "n": f"elsewhere {i}"})
    heavy = _shard_of_tenant(hook, cluster)
    _fill_on_shard(
        cluster,
        heavy,
        f"INSERT INTO `{STALLED}` (tenant, note) SELECT {TENANT}, CONCAT('row ', seq, ' ', "
        f"REPEAT('x', 120 + seq % 7)) FROM seq_1_to_{STALLED_ROWS}",
    )
    # Keyless: rows are identified by all their columns, as the KeyChoiceError's remedy says.
    overrides = {STALLED: KeyOverrides(source_unique_key_columns=("tenant", "note"))}
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec("copy-stalled", ks, (STALLED,), str(tmp_path / "stage"), key_overrides=overrides)

    _copy_phase(STALL_COPY_PHASE)
    try:
        logs_before = cluster.tablet_log_sizes()
        with pytest.raises(CopyStalledError) as stalled:
            CaptureRunner(hook, store, spec, holder="test").snapshot(copy_stall_seconds=FIRST_STALL_SECONDS)
        message = str(stalled.value)
        assert f"shard {heavy}: table {STALLED!r}" in message, message
        assert (
            "Remedy: raise --vreplication-copy-phase-duration" in message and "copy_stall_timeout" in message
        )
        # The condition: the copy query was killed at the duration and started again, no row sent.
        logs = cluster.tablet_logs(since=logs_before)
        queries = _copy_queries(logs, STALLED)
        print(
            f"\nstalled: {len(queries)} copy queries of {STALLED}, {len(KILLED.findall(logs))} killed: "
            f"{message[:120]}"
        )
        assert len(queries) >= 3 and len(KILLED.findall(logs)) >= 2, logs[-3000:]
        assert all("MAX_EXECUTION_TIME(40)" in q for q in queries), queries[:3]
        [failed] = store.open_windows(spec.sync_id)  # the snapshot's window, nothing staged
        assert failed.state is WindowState.PLANNED, failed

        # The remedy: the flag raised on the keyspace's vttablets, copy_stall_timeout above it.
        _copy_phase(RAISED_COPY_PHASE)
        logs_before = cluster.tablet_log_sizes()
        outcome = CaptureRunner(hook, store, spec, holder="test").snapshot(
            copy_stall_seconds=RAISED_STALL_SECONDS
        )
        queries = _copy_queries(cluster.tablet_logs(since=logs_before), STALLED)
    finally:
        _copy_phase(FOUR_SHARD_COPY_PHASE)
    # The rerun went on with the failed run's window (resumed, not a second snapshot).
    assert outcome.seq == failed.seq and [w.seq for w in store.open_windows(spec.sync_id)] == [failed.seq]
    assert queries and all("MAX_EXECUTION_TIME(30000)" in q for q in queries), queries[:3]

    staged = read_table(outcome.manifest, STALLED).to_pylist()
    assert len(staged) == STALLED_ROWS + 40 and len({(r["tenant"], r["note"]) for r in staged}) == len(staged)
    key = outcome.manifest.tables[STALLED].key_columns
    target = TableTarget(STALLED, str(tmp_path / "delta" / STALLED), tuple(key), tuple(key))
    window = WindowToMerge(outcome.seq, outcome.manifest.path, (STALLED,))
    report = merge(spark_session(), MergePlan(spec.sync_id, (window,), {STALLED: target}))
    assert report.statuses() == {(outcome.seq, STALLED): TableStatus.WRITTEN}
    assert (
        wl.assert_equal_to_source(spark_session(), hook, ks, STALLED, target.path, list(key))
        == STALLED_ROWS + 40
    )
    wl.execute(hook, f"DROP TABLE IF EXISTS {ks}.{STALLED}")
