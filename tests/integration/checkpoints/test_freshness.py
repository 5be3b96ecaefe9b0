"""Freshness on the real cluster: the committed position's "as of" time, busy, quiet and cut short.

Every source transaction committed before a sync's *as of* time is in its Delta tables
(``checkpoints/freshness.py``). Oracles, with the source and the worker on one host (one clock):

* a catch-up's *as of* lies between the start and the end of its run (the stop position is taken
  inside it), and every row the source stamped before it is in Delta;
* a run with nothing to read still moves it (a quiet source is fresh), by the same rule;
* a window cut short with shards behind its stop does not move it; the chain's window that
  reaches the stop moves it to the stop's time, the one the chain's first window took;
* the status document shows it, and seconds behind = now - as of, never negative;
* a freshness objective is met by runs on an idle source (each moves *as of*) and breached by a
  sync whose vtgate is unreachable (through ``faultproxy.FaultProxy``): its runs fail and the
  status document turns red once the last commit is older than the objective.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, history
from airflow_provider_vitess.checkpoints.freshness import STOP_TAKEN_AT
from airflow_provider_vitess.exceptions import VitessConnectionError, VStreamDeadlineError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.plugins import documents
from airflow_provider_vitess.vstream.window import ReadBounds
from tests.support.delta_check import assert_delta_equals_source, spark_session
from tests.support.faultproxy import FaultProxy
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

BUSY, QUIET = "fr_busy", "fr_quiet"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_fresh", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_fresh")
        execute(
            hook,
            f"DROP TABLE IF EXISTS commerce.{BUSY}",
            f"DROP TABLE IF EXISTS commerce.{QUIET}",
            f"CREATE TABLE commerce.{BUSY} (id BIGINT NOT NULL PRIMARY KEY, written_at DATETIME(6) NOT NULL)",
            f"CREATE TABLE commerce.{QUIET} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(16))",
            f"INSERT INTO commerce.{QUIET} (id, note) VALUES (1, 'still')",
        )
        yield hook
        hook.close()


def test_as_of_is_the_stop_time_for_busy_and_quiet_tables_and_never_ahead(
    hook: VitessHook, tmp_path: Path
) -> None:
    spark = spark_session()
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"fresh-{uuid.uuid4().hex[:8]}", "commerce", (BUSY, QUIET), str(tmp_path / "stage"))
    capture = CaptureRunner(hook, store, spec, holder="test-fresh")
    delta = tmp_path / "delta"
    next_id = iter(range(1, 10_000))

    def write(n: int) -> None:
        execute(hook, *(f"INSERT INTO commerce.{BUSY} VALUES ({next(next_id)}, NOW(6))" for _ in range(n)))

    def merged() -> MergeOutcome:
        runner = MergeRunner(store, spec.sync_id, str(delta), holder="test-fresh-merge")
        return runner.run(lambda plan: merge(spark, plan))

    def as_of() -> datetime.datetime | None:
        point = history.checkpoint(store.engine, spec.sync_id)
        return None if point is None else point.as_of

    write(3)
    started = _now()
    capture.snapshot()
    snapshot = merged()
    assert snapshot.as_of is not None and started <= snapshot.as_of <= _now()
    assert as_of() == snapshot.as_of

    # A busy table: the stop is taken inside the run.
    write(5)
    started = _now()
    capture.catch_up()
    ended = _now()
    busy = merged()
    assert busy.as_of is not None and started <= busy.as_of <= ended, (started, busy.as_of, ended)
    assert_delta_equals_source(hook, "commerce", [BUSY, QUIET], delta)
    stamped = {r.written_at.replace(tzinfo=datetime.timezone.utc) for r in _written(hook)}
    assert max(stamped) < busy.as_of, "every row stamped before as of is in Delta (and they all are)"

    # Nothing to read: the quiet source's data is as fresh as the run.
    started = _now()
    capture.catch_up()
    quiet = merged()
    assert quiet.as_of is not None and quiet.as_of >= started > busy.as_of

    # A backlog cut short: the window with shards behind its stop does not move as of ...
    write(30)
    started = _now()
    chain = capture.backlog(ReadBounds(max_events=10), max_windows=1)
    assert chain.stopped == "max_windows=1", chain.stopped
    short = merged()
    assert short.as_of == quiet.as_of, "a window that ended before its stop keeps the time"
    # ... and the next run's chain that reaches its stop moves it to that stop's time.
    chain = capture.backlog(ReadBounds(max_events=10))
    assert chain.stopped == "caught up" and len(chain.windows) >= 2, chain
    first_stop = store.window(spec.sync_id, chain.windows[0].seq).stats[STOP_TAKEN_AT]
    assert store.window(spec.sync_id, chain.windows[-1].seq).stats[STOP_TAKEN_AT] == first_stop
    caught_up = merged()
    assert caught_up.as_of == datetime.datetime.fromisoformat(first_stop)
    assert caught_up.as_of is not None and caught_up.as_of > started
    assert_delta_equals_source(hook, "commerce", [BUSY, QUIET], delta)

    now = _now()
    status = documents.sync_status(store, "default", spec.sync_id, now)
    assert status is not None and status.committed is not None
    assert status.committed.as_of == caught_up.as_of
    assert status.committed.seconds_behind == round((now - caught_up.as_of).total_seconds(), 3) >= 0

    # A freshness objective of 5 minutes: met now; breached if nothing commits for longer (a
    # stalled sync: the status document, asked later, says so); a run on the quiet source meets
    # it again, since its stop is taken then.
    def breached(at: datetime.datetime) -> bool:
        status = documents.sync_status(store, "default", spec.sync_id, at)
        assert status is not None and status.committed is not None
        assert status.freshness_breached is status.committed.freshness_breached
        assert status.committed.freshness_sla == 300
        return status.committed.freshness_breached

    started = _now()
    capture.catch_up()
    idle = MergeRunner(store, spec.sync_id, str(delta), holder="test-fresh-merge", freshness_sla=300)
    kept = idle.run(lambda plan: merge(spark, plan)).as_of
    assert kept is not None and kept >= started
    assert not breached(_now())
    assert breached(kept + datetime.timedelta(seconds=301)), "no commit for 301 s: breached"
    started = _now()
    capture.catch_up()  # nothing changed at the source
    quiet_again = idle.run(lambda plan: merge(spark, plan)).as_of
    assert quiet_again is not None and quiet_again >= started
    assert quiet_again > kept, "the quiet source's run moved as of"
    assert not breached(quiet_again + datetime.timedelta(seconds=299))
    store.close()


SLA = 30.0  # seconds: longer than a run here (under -n 2), shorter than the stop probe's 60 s


def test_freshness_sla_is_kept_by_an_idle_source_and_breached_by_a_stalled_sync(
    vitess: LocalVitess, hook: VitessHook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = FaultProxy(vitess.grpc_port)
    through_proxy = dataclasses.replace(vitess, grpc_port=proxy.start())
    env, value = connection_uri_env("vitess_fresh_proxy", through_proxy)
    monkeypatch.setenv(env, value)
    proxied = VitessHook("vitess_fresh_proxy")  # VStream through the proxy, SQL straight to vtgate
    spark = spark_session()
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"sla-{uuid.uuid4().hex[:8]}", "commerce", (QUIET,), str(tmp_path / "stage"))
    capture = CaptureRunner(proxied, store, spec, holder="test-sla")
    merger = MergeRunner(store, spec.sync_id, str(tmp_path / "delta"), holder="test-sla", freshness_sla=SLA)

    def breached() -> bool:
        status = documents.sync_status(store, "default", spec.sync_id, _now())
        assert status is not None and status.committed is not None
        assert status.committed.freshness_sla == SLA
        return status.freshness_breached

    try:
        capture.snapshot()
        merger.run(lambda plan: merge(spark, plan))
        # An idle source, synced in a loop: asked before and after each run, never breached.
        for _ in range(3):
            assert not breached()
            before = history.checkpoint(store.engine, spec.sync_id)
            capture.catch_up()  # nothing changed at the source
            merger.run(lambda plan: merge(spark, plan))
            after = history.checkpoint(store.engine, spec.sync_id)
            assert before is not None and after is not None and before.as_of is not None
            assert after.as_of is not None and after.as_of > before.as_of, "each idle run moves as of"
            assert not breached()
        # vtgate unreachable: the run fails (a failed task, never "nothing to do") and, its
        # last commit now older than the objective, the status says so.
        last = history.checkpoint(store.engine, spec.sync_id)
        assert last is not None and last.as_of is not None
        proxy.stop()
        # The stop probe's reconnects give up (VitessConnectionError) or its 60 s run out.
        with pytest.raises((VitessConnectionError, VStreamDeadlineError), match=r"gave up|no position"):
            capture.catch_up()
        stalled_for = (_now() - last.as_of).total_seconds()
        time.sleep(max(0.0, SLA + 1 - stalled_for))  # nothing commits while the objective runs out
        assert breached()
        assert history.checkpoint(store.engine, spec.sync_id) == last, "nothing moved"
    finally:
        proxy.stop()
        proxied.close()
        store.close()


def _written(hook: VitessHook) -> list[Any]:
    with hook.connect_sql() as conn:
        return list(conn.execute(sqlalchemy.text(f"SELECT written_at FROM commerce.{BUSY}")))
