"""Freshness read from a lagging replica (issue 38, item 4b), on a real primary and replica.

A sync whose connection streams from REPLICA tablets takes its stop at the replica's position.
The replica here applies each transaction ``DELAY`` seconds after its primary committed it
(MariaDB's ``MASTER_DELAY``). Oracle (``checkpoints/freshness.py``): every source transaction
committed before the sync's *as of* time is in Delta. Rows committed just before a catch-up that
the replica has not applied yet are not in Delta after it, so *as of* must not pass their commit
(the worker's clock at the stop would: the replica's old position reported fresh); seconds behind
counts from there. Once the replica has applied them, the next catch-up holds them and *as of*
passes their commit (the delay lifted then, rather than waited for). The changes sensor's "no
change" time (a quiet source) is held to the same oracle. Source and worker share one host, so
one clock.

The cluster (``topology.replica_cluster_running``): ``dev/vitess_topology.sh``'s commerce layout
plus a replica, on ports from ``VITESS_TOPO_REPLICA_BASE_PORT`` (17600) and state in
``VITESS_TOPO_REPLICA_STATE_DIR``.
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, history
from airflow_provider_vitess.checkpoints.freshness import STOP_TAKEN_AT
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.plugins import documents
from airflow_provider_vitess.sensors.changes import VitessChangesSensor
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.source_clock import STOP_LAG_SECONDS, STOP_TABLET_TYPE, SourceClock
from tests.support.delta_check import assert_delta_equals_source, delta_rows, spark_session
from tests.support.local import connection_uri_env
from tests.support.merge_workload import execute
from tests.support.topology import ReplicaCluster, replica_cluster_running

pytestmark = pytest.mark.integration

TABLE = "lag_orders"
# Seconds: far longer than the catch-up, merge and sensor read that must end before the replica
# applies the rows (a busy machine included). Free: the test lifts the delay, never waits it out.
DELAY = 120


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ReplicaCluster]:
    with replica_cluster_running() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hooks(cluster: ReplicaCluster) -> Iterator[tuple[VitessHook, VitessHook]]:
    """(writes: the primary, the sync's reads: REPLICA tablets)."""
    with pytest.MonkeyPatch.context() as mp:
        for conn_id, extra in (("lag_primary", {}), ("lag_replica", {"tablet_type": "REPLICA"})):
            name, value = connection_uri_env(conn_id, cluster.vitess, **extra)
            mp.setenv(name, value)
        primary, replica = VitessHook("lag_primary"), VitessHook("lag_replica")
        yield primary, replica
        primary.close()
        replica.close()


def _wait_replica_rows(cluster: ReplicaCluster, rows: int, within: float) -> None:
    """Until the replica's own MariaDB holds ``rows`` rows of the table (a wait, not a check)."""
    deadline = time.monotonic() + within
    seen = ""
    while time.monotonic() < deadline:
        seen = cluster.tablet_sql(
            f"SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'vt_commerce' "
            f"AND table_name = '{TABLE}'"
        )
        if seen == "1":
            seen = cluster.tablet_sql(f"SELECT COUNT(*) FROM vt_commerce.{TABLE}")
            if seen == str(rows):
                return
        time.sleep(0.5)
    raise AssertionError(f"the replica holds {seen!r} rows of {TABLE} after {within:g}s, not {rows}")


def _written(hook: VitessHook, ids: range) -> dict[int, datetime.datetime]:
    with hook.connect_sql() as conn:
        got = conn.exec_driver_sql(
            f"SELECT id, written_at FROM commerce.{TABLE} WHERE id BETWEEN {ids.start} AND {ids.stop - 1}"
        ).all()
    return {int(i): w.replace(tzinfo=datetime.timezone.utc) for i, w in got}


def test_as_of_from_a_lagging_replica_is_the_source_time_of_its_stop(
    cluster: ReplicaCluster,
    hooks: tuple[VitessHook, VitessHook],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, replica = hooks
    store_conn = {"conn_type": "sqlite", "host": str(tmp_path / "store.db")}
    monkeypatch.setenv("AIRFLOW_CONN_LAG_STORE", json.dumps(store_conn))  # the sensor's store
    cluster.delay(0)
    execute(
        primary,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, written_at DATETIME(6) NOT NULL)",
        *(f"INSERT INTO commerce.{TABLE} VALUES ({i}, NOW(6))" for i in (1, 2, 3)),
    )
    _wait_replica_rows(cluster, 3, within=60)
    spark = spark_session()
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"lag-{uuid.uuid4().hex[:8]}", "commerce", (TABLE,), str(tmp_path / "stage"))
    capture = CaptureRunner(replica, store, spec, holder="test-lag")
    delta = tmp_path / "delta"

    def merged() -> MergeOutcome:
        runner = MergeRunner(store, spec.sync_id, str(delta), holder="test-lag-merge")
        return runner.run(lambda plan: merge(spark, plan))

    capture.snapshot()
    snapshot = merged()
    copied = store.window(spec.sync_id, snapshot.committed_seq).stats
    assert snapshot.as_of is not None, f"a replica caught up: its copy's time is known ({copied})"
    assert_delta_equals_source(primary, "commerce", [TABLE], delta)

    # The replica falls behind: two rows committed on the primary, not applied for DELAY s.
    cluster.delay(DELAY)
    execute(primary, *(f"INSERT INTO commerce.{TABLE} VALUES ({i}, NOW(6))" for i in (4, 5)))
    late = _written(primary, range(4, 6))
    catch_up = capture.catch_up()
    behind = merged()
    in_delta = {row[0] for row in delta_rows(delta / TABLE)}
    assert in_delta == {1, 2, 3}, (
        f"the catch-up ran after the replica applied the rows (Delta holds {sorted(in_delta)}): "
        f"the test needs a run shorter than DELAY={DELAY}s"
    )
    assert behind.as_of is not None, (
        f"the replica's lag was read: its time is known ({store.window(spec.sync_id, catch_up.seq).stats})"
    )
    # Every transaction before as of is in Delta: rows 4 and 5 are not, so as of is not past them.
    assert behind.as_of <= min(late.values()), (
        f"as of {behind.as_of.isoformat()} claims rows committed at "
        f"{sorted(t.isoformat() for t in late.values())} that the replica had not applied "
        f"(Delta holds ids {sorted(in_delta)})"
    )
    stats = store.window(spec.sync_id, catch_up.seq).stats
    assert stats[STOP_TABLET_TYPE] == "REPLICA" and stats[STOP_LAG_SECONDS] >= 0, stats

    # The changes sensor meanwhile: no change of the table up to the replica's position (the rows
    # are not there yet): its "quiet source" time is that position's too, not past rows 4 and 5.
    committed = store.committed(spec.sync_id)[0]
    assert committed is not None
    sensor = VitessChangesSensor(
        task_id="wait",
        vitess_conn_id="lag_replica",
        keyspace="commerce",
        tables=[TABLE],
        sync_id=spec.sync_id,
        checkpoint_conn_id="lag_store",
        deferrable=False,
        poke_read_seconds=10,
    )
    assert sensor.read_once(replica, committed) is None, "no change up to the replica's position"
    sensor._no_change(committed, sensor._watch_stop_at)  # what its timeout records
    assert cluster.tablet_sql(f"SELECT COUNT(*) FROM vt_commerce.{TABLE}") == "3", "still behind"
    quiet = history.checkpoint(store.engine, spec.sync_id)
    assert quiet is not None and quiet.as_of is not None and quiet.as_of >= behind.as_of
    assert quiet.as_of <= min(late.values()), (
        f"the sensor's as of {quiet.as_of.isoformat()} claims rows the replica had not applied"
    )
    now = _now()
    status = documents.sync_status(store, "default", spec.sync_id, now)
    assert status is not None and status.committed is not None
    assert status.committed.as_of == quiet.as_of  # the sensor's, at most rows 4 and 5's commit
    assert status.committed.seconds_behind is not None
    assert status.committed.seconds_behind >= (now - min(late.values())).total_seconds()

    # The replica catches up (its delay lifted: it applies them at once), and the next catch-up
    # holds them: its time passes their commit. An idle replica's lag (MariaDB's
    # Seconds_Behind_Master, whole seconds) counts from the last transaction it applied, so
    # with rows 4 and 5 the last, "as of" would fall within the 1 s grain before their commit:
    # a later transaction, 3 s after them, moves it past them.
    cluster.delay(0)
    _wait_replica_rows(cluster, 5, within=60)
    time.sleep(max(0.0, 3 - (_now() - max(late.values())).total_seconds()))
    execute(primary, f"INSERT INTO commerce.{TABLE} VALUES (6, NOW(6))")
    _wait_replica_rows(cluster, 6, within=60)
    capture.catch_up()
    caught_up = merged()
    assert_delta_equals_source(primary, "commerce", [TABLE], delta)
    assert caught_up.as_of is not None and caught_up.as_of > max(late.values())
    window = store.window(spec.sync_id, store.committed(spec.sync_id)[1])
    assert datetime.datetime.fromisoformat(window.stats[STOP_TAKEN_AT]) == caught_up.as_of

    # Replication stopped: vtgate reports the replica's lag as NULL, and no time is claimed.
    cluster.tablet_sql("STOP SLAVE")
    try:
        clock = SourceClock.read(replica, "commerce", "REPLICA")
        unknown = clock.lag_of(store.committed(spec.sync_id)[0] or Vgtid(()))
    finally:
        cluster.tablet_sql("START SLAVE")
    assert isinstance(unknown, str) and "reports lag 'NULL'" in unknown, unknown
    store.close()
