"""The Spark merge job against the real Vitess, real Spark and real Delta Lake.

Windows are captured from a seeded workload on our own tables (``merge_workload``) and merged
with ``spark_jobs/merge_cdc.py``: in process (one Spark session for the whole test session), as
``spark-submit`` subprocesses killed at random points, and once on a local standalone Spark
cluster. The oracle is ``SELECT *`` through vtgate, value for value.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import (
    CorruptStagedDataError,
    DeltaFeatureError,
    UnsupportedDeltaError,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job import apply, delta_features, delta_log, tables
from airflow_provider_vitess.merge.job.schema import MergeSchemaError
from airflow_provider_vitess.merge.modes import DELETION_VECTORS, TYPE_WIDENING, TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import (
    PROGRESS_PREFIX,
    MergeReport,
    TableStatus,
    WriteMode,
    parse_report_line,
)
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, QUICK_JIT, spark_submit_args
from airflow_provider_vitess.staging import WindowStager, load_manifest
from airflow_provider_vitess.vgtid import Vgtid
from spark_jobs.merge_cdc import main, merge
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import REPO, LocalVitess, pyspark_home, spark_env
from tests.support.readers import (
    assert_readers_see_what_spark_sees,
    delta_rs_rows,
    polars_rows,
    reader_types,
    spark_rows,
)
from tests.support.replay import Replay, StagedChange
from tests.support.type_matrix import READER_TYPES

pytestmark = pytest.mark.integration

SEED = 20261122
SPARK_HOME = pyspark_home()
JOB = REPO / "spark_jobs" / "merge_cdc.py"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    """The worker's one local Spark session with Delta (a new one if its JVM died before)."""
    session: SparkSession = spark_session()
    return session


@dataclass
class Captured:
    hook: VitessHook
    root: Path
    workload: wl.Workload
    orders: wl.Sync
    commerce: wl.Sync


@pytest.fixture(scope="module")
def captured(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> Captured:
    """A snapshot and two catch-up windows of each sync, around the seeded workload (the first
    catch-up holds the 100,000-row transaction, the second changes some of its rows)."""
    hook = wl.hook_for(vitess)
    wl.create_tables(hook)
    work = wl.Workload(hook, SEED)
    work.initial()
    root = tmp_path_factory.mktemp("merge")
    store = CheckpointStore(f"sqlite:///{root}/store.db")
    suffix = uuid.uuid4().hex[:8]
    orders = wl.new_sync(hook, store, root / "stage", f"orders-{suffix}", "customer", [wl.ORDERS])
    commerce = wl.new_sync(
        hook, store, root / "stage", f"commerce-{suffix}", "commerce", [wl.TYPES, wl.LINES]
    )
    orders.capture(snapshot=True)
    commerce.capture(snapshot=True)
    for k in range(2):
        work.round()
        work.types_round(k)
        if k == 0:
            work.big_transaction()
        else:
            work.touch_big()
        orders.capture()
        commerce.capture()
    return Captured(hook, root, work, orders, commerce)


def keys_of(sync: wl.Sync, table: str) -> tuple[str, ...]:
    return tuple(sync.manifests[0].tables[table].key_columns)


def assert_oracle(spark: SparkSession, c: Captured, root: Path, syncs: tuple[wl.Sync, ...]) -> None:
    for sync in syncs:
        for table in sync.tables:
            n = wl.assert_equal_to_source(
                spark, c.hook, sync.keyspace, table, str(root / table), keys_of(sync, table)
            )
            assert n > 0


def txn_versions(path: str | Path) -> Counter[tuple[str, int]]:
    """(txnAppId, txnVersion) of every commit in the table's log, counted."""
    out: Counter[tuple[str, int]] = Counter()
    for f in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out[(action["txn"]["appId"], action["txn"]["version"])] += 1
    return out


def history_versions(spark: SparkSession, path: str | Path) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg({"version": "max"}).first()[0])  # type: ignore[index]


@dataclass
class Merged:
    root: Path
    reports: dict[str, list[MergeReport]]
    seconds: float


def _with_features(plan: MergePlan, tables: tuple[str, ...]) -> MergePlan:
    """``plan`` with deletion vectors chosen for ``tables`` (the others keep the defaults)."""
    shape = TargetShape(features=(DELETION_VECTORS,))
    return replace(
        plan, targets={t: replace(v, shape=shape) if t in tables else v for t, v in plan.targets.items()}
    )


@pytest.fixture(scope="module")
def merged(spark: SparkSession, captured: Captured) -> Merged:
    """Each sync merged in process as two jobs: [snapshot, first catch-up] then [second catch-up].
    Both ways of a MERGE meet the oracle: the orders tables are small, so their MERGEs rewrite
    the files they touch; ``merge_lines`` has deletion vectors (``table_features``) and its MERGEs
    write them whatever the size. ``merge_types`` keeps the defaults (no reader feature but
    ``timestampNtz``), so delta-rs and Polars can read the type matrix."""
    root = captured.root / "delta-inproc"
    reports: dict[str, list[MergeReport]] = {}
    started = time.monotonic()
    for sync in (captured.orders, captured.commerce):
        with pytest.MonkeyPatch.context() as m:
            if sync is captured.commerce:
                m.setattr(apply, "REWRITE_BELOW_BYTES", 0)
            dvs = (wl.LINES,)
            reports[sync.sync_id] = [
                merge(spark, _with_features(sync.plan(root, 0, 2), dvs), rows_per_file=40_000),
                merge(spark, _with_features(sync.plan(root, 2), dvs), rows_per_file=40_000),
            ]
    return Merged(root, reports, time.monotonic() - started)


# -- (a) the oracle ------------------------------------------------------------------------------


def test_windows_merged_in_process_equal_the_source(
    spark: SparkSession, captured: Captured, merged: Merged
) -> None:
    work = captured.workload
    assert work.moves > 5 and work.key_changes > 5
    # Moves between shards put one key on both shards within a window (here, in one commit
    # second): the rule for moved rows is exercised, not only documented.
    assert wl.cross_shard_ties(captured.orders.manifests[1:], wl.ORDERS, "order_id") > 0
    assert_oracle(spark, captured, merged.root, (captured.orders, captured.commerce))
    for sync in (captured.orders, captured.commerce):
        first, second = merged.reports[sync.sync_id]
        snapshot = first.windows[0]
        assert {t.status for t in snapshot.tables} == {TableStatus.WRITTEN}
        assert {t.mode.value for t in snapshot.tables} == {"replace"}
        statuses = {t.status for w in (*first.windows[1:], *second.windows) for t in w.tables}
        assert statuses <= {TableStatus.WRITTEN, TableStatus.NO_CHANGES}
    first, second = merged.reports[captured.orders.sync_id]
    assert first.windows[1].table(wl.ORDERS).rows_upserted >= wl.BIG_ROWS
    touched = second.windows[0].table(wl.ORDERS)
    assert touched.status is TableStatus.WRITTEN and touched.rows_deleted >= 500


def test_every_mysql_type_lands_with_its_documented_delta_type(spark: SparkSession, merged: Merged) -> None:
    schema = spark.read.format("delta").load(str(merged.root / wl.TYPES)).schema
    types = {f.name: f.dataType for f in schema.fields}
    assert types["u64"] == T.DecimalType(20, 0)
    assert types["dec"] == T.StringType()  # DECIMAL(65,30): exact text
    assert types["dt"] == T.TimestampNTZType() and types["ts"] == T.TimestampType()
    assert types["t"] == T.LongType() and "microseconds" in schema["t"].metadata["comment"]
    assert types["y"] == T.ShortType() and types["i8"] == T.ByteType() and types["u8"] == T.ShortType()
    assert types["b64"] == T.BinaryType() and types["bl"] == T.BinaryType() and types["js"] == T.StringType()
    row = (
        spark.read.format("delta")
        .load(str(merged.root / wl.TYPES))
        .where("u64 = 18446744073709551615")
        .first()
    )
    assert row is not None
    assert row["dec"] == "9" * 35 + "." + "9" * 30
    assert row["dt"].microsecond == 999999 and row["t"] == (838 * 3600 + 59 * 60 + 59) * 10**6


def test_the_type_matrix_reads_in_delta_rs_and_polars_as_in_spark(
    spark: SparkSession, captured: Captured, merged: Merged, tmp_path: Path
) -> None:
    """docs/reading-the-tables.md: delta-rs and Polars read every column of every row of the type
    matrix (merged with the defaults) as Spark does, which is ``SELECT *`` after the documented
    type mapping; each column has the reader type the docs list. The one representation that
    differs is TIMESTAMP: an aware UTC instant, where Spark gives a naive one in its session zone
    (UTC here). Read twice: the snapshot alone (the matrix's four rows, its awkward row too, which
    the workload deletes later), and the table after the workload's MERGEs (``merged``)."""
    sync = captured.commerce
    first = sync.plan(tmp_path, 0, 1)
    only = MergePlan(
        first.sync_id,
        tuple(replace(w, replace_tables=(wl.TYPES,)) for w in first.windows),
        {wl.TYPES: first.targets[wl.TYPES]},
    )
    merge(spark, only)
    snapshot = spark_rows(tmp_path / wl.TYPES, spark)
    assert sorted(r["u64"] for r in snapshot if r["u64"] is not None) == [0, 1, 2**64 - 1]  # MIN, ODD, MAX
    assert len(snapshot) == 4  # and NULL
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    for path in (tmp_path / wl.TYPES, merged.root / wl.TYPES):
        if path != tmp_path / wl.TYPES:
            n = wl.assert_equal_to_source(spark, captured.hook, "commerce", wl.TYPES, str(path), ("id",))
            assert n >= 4
        assert reader_types(path) == {"id": ("int32", "Int32"), **READER_TYPES}
        assert_readers_see_what_spark_sees(str(path), path, spark)
        spark_ts = {r["id"]: r["ts"] for r in spark_rows(path, spark)}
        assert all(v is None or v.tzinfo is None for v in spark_ts.values())
        for read in (delta_rs_rows, polars_rows):
            ts = {r["id"]: r["ts"] for r in read(path)}
            aware = {k: v and v.replace(tzinfo=datetime.timezone.utc) for k, v in spark_ts.items()}
            assert ts == aware, (read.__name__, path)


# -- (b) idempotence -----------------------------------------------------------------------------


def test_a_repeated_plan_is_already_applied_and_commits_nothing(
    spark: SparkSession, captured: Captured, merged: Merged
) -> None:
    for sync in (captured.orders, captured.commerce):
        plan = sync.plan(merged.root)
        versions = {t: history_versions(spark, merged.root / t) for t in sync.tables}
        report = merge(spark, plan)
        assert {s for s in report.statuses().values()} <= {
            TableStatus.ALREADY_APPLIED,
            TableStatus.NO_CHANGES,
        }
        assert all(
            report.window(m.window_seq).table(t).status is TableStatus.ALREADY_APPLIED
            for m in sync.manifests
            for t in sync.tables
            if m.tables.get(t) is not None and m.tables[t].parts
        )
        for table in sync.tables:
            assert history_versions(spark, merged.root / table) == versions[table]
            written = [
                w.seq
                for r in merged.reports[sync.sync_id]
                for w in r.windows
                if w.table(table).status is TableStatus.WRITTEN
            ]
            assert txn_versions(merged.root / table) == Counter(
                {(plan.txn_app_id(table), seq): 1 for seq in written}
            )
    assert_oracle(spark, captured, merged.root, (captured.orders, captured.commerce))


def test_a_merge_delta_skips_is_already_applied_and_commits_nothing(
    spark: SparkSession, captured: Captured, merged: Merged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run committed the window after this run read the table's transaction version
    (a fenced-off holder): the plan says MERGE, Delta skips it (the table holds the transaction),
    and the report says so instead of counting another run's commit as this run's write."""
    sync = captured.orders
    read = tables.table_state

    def read_before_the_other_run(
        session: SparkSession, path: str, app_id: str, restores_after: Any = None
    ) -> Any:
        state = read(session, path, app_id, restores_after)
        assert state.txn_version is not None
        return replace(state, txn_version=state.txn_version - 1)

    monkeypatch.setattr(tables, "table_state", read_before_the_other_run)
    last = sync.manifests[2].window_seq
    version = history_versions(spark, merged.root / wl.ORDERS)
    result = merge(spark, sync.plan(merged.root, 2)).window(last).table(wl.ORDERS)
    assert result.status is TableStatus.ALREADY_APPLIED
    assert result.rows_upserted == 0 and result.delta_version == version  # the table's, unchanged
    assert history_versions(spark, merged.root / wl.ORDERS) == version
    assert txn_versions(merged.root / wl.ORDERS)[(sync.plan(merged.root).txn_app_id(wl.ORDERS), last)] == 1


def test_a_replace_delta_skips_is_already_applied_and_commits_nothing(
    spark: SparkSession, captured: Captured, merged: Merged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a snapshot window: its replace is a plain write, which returns nothing either
    way; only the commit that the session records, or does not, tells a skip from a write."""
    sync = captured.orders
    read = tables.table_state

    def read_before_the_snapshot_committed(
        session: SparkSession, path: str, app_id: str, restores_after: Any = None
    ) -> Any:
        # Before the snapshot committed, its table did not exist yet.
        return replace(read(session, path, app_id, restores_after), exists=False, txn_version=None)

    monkeypatch.setattr(tables, "table_state", read_before_the_snapshot_committed)
    version = history_versions(spark, merged.root / wl.ORDERS)
    snapshot = sync.manifests[0].window_seq
    result = merge(spark, sync.plan(merged.root, 0, 1)).window(snapshot).table(wl.ORDERS)
    assert result.mode is WriteMode.REPLACE
    assert result.status is TableStatus.ALREADY_APPLIED
    assert result.rows_upserted == 0 and result.delta_version == version
    assert history_versions(spark, merged.root / wl.ORDERS) == version
    app_id = sync.plan(merged.root).txn_app_id(wl.ORDERS)
    assert txn_versions(merged.root / wl.ORDERS)[(app_id, snapshot)] == 1


def test_a_merge_whose_commit_the_session_does_not_record_is_an_error_and_a_rerun_finds_it(
    spark: SparkSession, captured: Captured, merged: Merged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Delta that does not record the session's last commit version (not the one pinned): the
    MERGE runs and commits, and the job, unable to tell that commit from a skip, stops with an
    error naming the remedy instead of reporting the write as ``already_applied``. The window's
    commit stays in the table, and a rerun finds it there."""
    sync = captured.orders
    last = sync.manifests[2].window_seq
    [_, second] = merged.reports[sync.sync_id]
    written = second.window(last).table(wl.ORDERS).delta_version
    assert written is not None
    # The table as it was before the second job: a copy, its log cut before that job's commit.
    table = tmp_path / wl.ORDERS
    shutil.copytree(merged.root / wl.ORDERS, table)
    for f in (table / "_delta_log").iterdir():
        version = f.name.lstrip(".")[:20]  # (".<name>.crc": the local file system's checksums)
        if (version.isdigit() and int(version) >= written) or "_last_checkpoint" in f.name:
            f.unlink()
    app_id = sync.plan(tmp_path).txn_app_id(wl.ORDERS)
    assert (app_id, last) not in txn_versions(table)
    before = history_versions(spark, table)

    # A setting Delta never writes: what the session holds after a write with such a Delta.
    monkeypatch.setattr(delta_log, "LAST_COMMIT_CONF", "spark.databricks.delta.notRecordedHere")
    with pytest.raises(UnsupportedDeltaError) as failed:
        merge(spark, sync.plan(tmp_path, 2))
    message = str(failed.value)
    assert f"window {last} table {wl.ORDERS}: Delta ran the MERGE into {table}" in message
    assert DELTA_PACKAGE in message  # the Delta built for the session's Spark line
    assert history_versions(spark, table) == before + 1
    assert txn_versions(table)[(app_id, last)] == 1

    rerun = merge(spark, sync.plan(tmp_path, 2)).window(last).table(wl.ORDERS)
    assert rerun.status is TableStatus.ALREADY_APPLIED and rerun.delta_version == before + 1
    assert txn_versions(table)[(app_id, last)] == 1
    assert_oracle(spark, captured, tmp_path, (sync,))


def test_small_tables_merge_by_rewriting_files_larger_ones_by_deletion_vectors(
    spark: SparkSession, captured: Captured, merged: Merged
) -> None:
    """The ``merged`` MERGEs: the orders table is below ``REWRITE_BELOW_BYTES``, so its MERGEs
    rewrite the files they touch and add no deletion vector; the commerce sync's MERGEs ran with
    the bound at 0, and ``merge_lines``'s (deletion vectors chosen) mark rows with deletion
    vectors instead (both tables meet the oracle)."""

    def merges(table: str) -> list[dict[str, int]]:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{merged.root / table}`").collect()
        return [
            {k: int(v) for k, v in row["operationMetrics"].items()}
            for row in history
            if row["operation"] == "MERGE"
        ]

    size = spark.sql(f"DESCRIBE DETAIL delta.`{merged.root / wl.ORDERS}`").first()
    assert size is not None and 0 < size["sizeInBytes"] < apply.REWRITE_BELOW_BYTES
    orders = merges(wl.ORDERS)
    assert len(orders) == 2
    assert all(m["numTargetDeletionVectorsAdded"] == 0 and m["numTargetFilesRemoved"] > 0 for m in orders)
    lines = merges(wl.LINES)
    assert lines and any(m["numTargetDeletionVectorsAdded"] > 0 for m in lines)
    types = merges(wl.TYPES)  # the defaults: no deletion vectors, so files rewritten
    assert types and all(m["numTargetDeletionVectorsAdded"] == 0 for m in types)


# -- the tie rule, against the reference applier ---------------------------------------------------


def _shard_merged(changes: list[StagedChange]) -> list[StagedChange]:
    """``changes`` (each shard's in its binlog order) in the order one capture process stages them
    and the merge ranks a key's events (``merge/job/order.key_order``): by commit second made
    non-decreasing along each shard's events, then shard, then the shard's own order. Another
    order across shards is not one a capture produces, and the applier would be judged on it."""
    top: dict[str, int] = {}
    ranked = []
    for i, c in enumerate(changes):
        top[c.shard] = max(top.get(c.shard, c.commit_ts), c.commit_ts)
        ranked.append((top[c.shard], c.shard, i, c))
    return [c for *_, c in sorted(ranked, key=lambda r: r[:3])]


def test_last_event_per_key_matches_the_reference_applier(spark: SparkSession, tmp_path: Path) -> None:
    """Random windows with keys moving between two shards (halves in either order, in the same
    or the next second, and halves split across two windows), key changes and deletes: the Delta
    table equals tests/support/replay.py's result after every window."""
    rng = random.Random(SEED)
    fields = [
        query_pb2.Field(name="k", type=query_pb2.INT64, column_type="bigint", flags=1),
        query_pb2.Field(name="v", type=query_pb2.INT64, column_type="bigint"),
    ]
    Image = tuple[int, int] | None
    reference = Replay(key_index=[0])
    live: dict[int, str] = {}  # key -> the shard holding it
    target = TableTarget("t", str(tmp_path / "t"), ("k",), ("k",))
    changes: list[StagedChange] = []
    carried: list[StagedChange] = []  # the other half of a move split by a window's stop
    ts, split_moves = 1000, 0
    split: set[int] = set()  # keys whose move this window's stop splits

    def emit(shard: str, op: Operation, before: Image, after: Image, at: int | None = None) -> None:
        changes.append(StagedChange("ks", "t", shard, op, at or ts, len(changes) + 1, before, after))

    for w in range(1, 6):
        changes[:] = carried
        blocked = {(c.before or c.after or (0,))[0] for c in carried}
        carried, split = [], set()
        for i in range(400):
            ts += rng.random() < 0.1  # several events a second, in staged (commit second) order
            k = rng.randint(1, 40)
            if k in split or k in blocked:
                continue  # only the other half of its split move here: the case to get right
            shard = live.get(k, rng.choice(["-80", "80-"]))
            p = rng.random()
            if k not in live:
                emit(shard, Operation.INSERT, None, (k, len(changes)))
                live[k] = shard
            elif p < 0.2:
                emit(shard, Operation.DELETE, (k, 0), None)
                del live[k]
            elif p < 0.5:  # a move: DELETE on its shard and INSERT on the other
                other = "80-" if shard == "-80" else "-80"
                later = ts + (rng.random() < 0.2)  # the second commit may fall in the next second
                halves = [(shard, Operation.DELETE, (k, 0), None), (other, Operation.INSERT, None, (k, i))]
                if rng.random() < 0.5:  # either half first (staged in shard order, below)
                    halves.reverse()
                emit(*halves[0])
                if i >= 390 and w < 5 and rng.random() < 0.5:  # the stop falls between the halves
                    second_shard, op, before, after = halves[1]
                    carried.append(StagedChange("ks", "t", second_shard, op, later, 0, before, after))
                    split.add(k)
                    if op is Operation.DELETE and rng.random() < 0.5:
                        # The old shard's update before the move, merged after the INSERT (same
                        # second, shard order): its stale row shows until the DELETE arrives.
                        emit(second_shard, Operation.UPDATE, (k, 0), (k, -i))
                else:
                    emit(*halves[1], at=later)
                live[k] = other
            elif p < 0.6 and k + 100 not in live:  # key change on the same shard
                emit(shard, Operation.UPDATE, (k, 0), (k + 100, len(changes)))
                live[k + 100] = live.pop(k)
            else:
                emit(shard, Operation.UPDATE, (k, 0), (k, len(changes)))
        split_moves += len(split)
        stager = WindowStager(str(tmp_path / "stage"), "ties", w, key_columns={"t": ["k"]})
        for shard in ("-80", "80-"):
            stager.set_schema("ks", "t", fields, shard)
        staged = [replace(c, seq=i + 1) for i, c in enumerate(_shard_merged(changes))]
        for c in staged:
            stager.add_change(c.keyspace, c.table, c.shard, c.op, c.commit_ts, c.seq, c.before, c.after)
        v = Vgtid.for_keyspace("ks", "")
        # Only the first window is a snapshot (no stop position): the others look back.
        manifest = stager.finish(v, None if w == 1 else v, v)
        reference.apply(staged)
        window = WindowToMerge(w, manifest.path, ("t",) if w == 1 else ())
        merge(spark, MergePlan("ties", (window,), {"t": target}))
        got = {(r["k"],): (r["k"], r["v"]) for r in spark.read.format("delta").load(target.path).collect()}
        assert got == reference.rows(), f"window {w}"
    assert len(reference.rows()) > 10
    assert split_moves >= 3


# -- damaged input ---------------------------------------------------------------------------------


def test_corrupt_part_or_missing_manifest_fails_naming_it_and_writes_nothing(
    spark: SparkSession, captured: Captured, tmp_path: Path
) -> None:
    sync = captured.orders
    stage = tmp_path / "stage"
    shutil.copytree(captured.root / "stage" / sync.sync_id, stage / sync.sync_id)
    copy = wl.Sync(sync.sync_id, sync.keyspace, sync.tables, sync.runner, sync.store)
    for m in sync.manifests:
        loaded = load_manifest(str(stage), sync.sync_id, m.window_seq)
        assert loaded is not None
        copy.manifests.append(loaded)
    target = tmp_path / "delta"
    merge(spark, copy.plan(target, 0, 1))
    version = history_versions(spark, target / wl.ORDERS)

    part = copy.manifests[1].tables[wl.ORDERS].parts[0]
    path = stage / sync.sync_id / f"window={copy.manifests[1].window_seq:010d}" / part.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStagedDataError, match=rf"part file {path}"):
        merge(spark, copy.plan(target, 1))
    out = tmp_path / "report.json"
    code = main(["--plan-json", copy.plan(target, 1).to_json(), "--report-file", str(out)], spark=spark)
    # No report: the file holds the refusal, which a retry cannot fix (the operator fails at once).
    error = json.loads(out.read_text())
    assert code == 2 and (error["type"], error["permanent"]) == ("CorruptStagedDataError", True)
    assert f"part file {path}" in error["error"]

    (stage / sync.sync_id / f"window={copy.manifests[2].window_seq:010d}" / "_manifest.json").unlink()
    with pytest.raises(MergePlanError, match=r"window \d+: staged manifest .*_manifest\.json does not exist"):
        merge(spark, copy.plan(target, 2))
    assert history_versions(spark, target / wl.ORDERS) == version


# -- (d) schema changes ----------------------------------------------------------------------------

EVOLVE = "merge_evolve"


def test_added_and_widened_columns_evolve_and_an_incompatible_change_is_refused(
    spark: SparkSession, vitess: LocalVitess, tmp_path: Path
) -> None:
    hook = wl.hook_for(vitess, "vitess_merge_evolve")
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{EVOLVE}",
        f"CREATE TABLE commerce.{EVOLVE} (id INT NOT NULL PRIMARY KEY, name VARCHAR(20), qty INT)",
        f"INSERT INTO commerce.{EVOLVE} VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)",
    )
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(
        hook, store, tmp_path / "stage", f"evolve-{uuid.uuid4().hex[:8]}", "commerce", [EVOLVE]
    )
    target = tmp_path / "delta"
    sync.capture(snapshot=True)
    merge(spark, sync.plan(target, 0, 1))
    # One window with two schema versions: rows before and after the DDL.
    wl.execute(
        hook,
        f"UPDATE commerce.{EVOLVE} SET qty = 10 WHERE id = 1",
        f"ALTER TABLE commerce.{EVOLVE} ADD COLUMN note VARCHAR(10), MODIFY qty BIGINT",
        f"INSERT INTO commerce.{EVOLVE} VALUES (4, 'four', 5000000000, '44'), (5, 'five', -1, NULL)",
        f"UPDATE commerce.{EVOLVE} SET note = '22', qty = qty + 4000000000 WHERE id = 2",
        f"DELETE FROM commerce.{EVOLVE} WHERE id = 3",
    )
    window = sync.capture()
    assert len(window.tables[EVOLVE].schemas) == 2
    # Widened without type widening (not chosen: the default), on Delta 3 and 4 alike: the
    # table is rewritten with the wider type.
    report = merge(spark, sync.plan(target, 1, 2))
    result = report.windows[0].table(EVOLVE)
    assert result.status is TableStatus.WRITTEN
    assert set(result.schema_changes) == {"add column note string", "widen column qty int -> bigint"}
    schema = spark.read.format("delta").load(str(target / EVOLVE)).schema
    assert schema["qty"].dataType == T.LongType() and schema["note"].dataType == T.StringType()
    wl.assert_equal_to_source(spark, hook, "commerce", EVOLVE, str(target / EVOLVE), ("id",))
    # The added and the widened column (rewritten, no reader feature) read alike everywhere.
    assert reader_types(target / EVOLVE)["qty"] == ("int64", "Int64")
    assert_readers_see_what_spark_sees(EVOLVE, target / EVOLVE, spark)

    version = history_versions(spark, target / EVOLVE)
    wl.execute(
        hook,
        f"ALTER TABLE commerce.{EVOLVE} MODIFY note INT",
        f"INSERT INTO commerce.{EVOLVE} VALUES (6, 'six', 6, 66)",
    )
    sync.capture()
    with pytest.raises(
        MergeSchemaError, match=rf"table '{EVOLVE}' column 'note': .*cannot be written to string"
    ):
        merge(spark, sync.plan(target, 2))
    assert history_versions(spark, target / EVOLVE) == version
    rows = {r["id"]: r["note"] for r in spark.read.format("delta").load(str(target / EVOLVE)).collect()}
    assert rows == {1: None, 2: "22", 4: "44", 5: None}
    wl.execute(hook, f"DROP TABLE commerce.{EVOLVE}")


@pytest.mark.parametrize("mode", [TargetMode.SOFT_DELETE, TargetMode.HISTORY])  # changelog: history's path
def test_a_widening_in_place_in_every_mode_is_refused_before_any_change_without_type_widening(
    spark: SparkSession,
    vitess: LocalVitess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: TargetMode,
) -> None:
    """The type-widening guard runs for every target mode, not only ``mirror``: a table given
    ``type_widening`` (``table_features``) widens in place, which Delta 3 (Spark 3.5) cannot, so
    there a window that widens a column and adds another is refused before the table gets any
    commit. The session's Delta line is read as 3 here (this suite runs Delta 4, which widens)."""
    table = f"{EVOLVE}_{mode.value}"
    hook = wl.hook_for(vitess, "vitess_merge_evolve")
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{table}",
        f"CREATE TABLE commerce.{table} (id INT NOT NULL PRIMARY KEY, name VARCHAR(20), qty INT)",
        f"INSERT INTO commerce.{table} VALUES (1, 'one', 1), (2, 'two', 2)",
    )
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(hook, store, tmp_path / "stage", f"widen-{uuid.uuid4().hex[:8]}", "commerce", [table])
    target = tmp_path / "delta"
    sync.capture(snapshot=True)
    shape = TargetShape(mode, features=(TYPE_WIDENING,))
    shaped = {t: replace(v, shape=shape) for t, v in sync.targets(target).items()}

    def plan(first: int, last: int | None = None) -> MergePlan:
        return replace(sync.plan(target, first, last), targets=shaped)

    merge(spark, plan(0, 1))
    wl.execute(
        hook,
        f"ALTER TABLE commerce.{table} ADD COLUMN note VARCHAR(10), MODIFY qty BIGINT",
        f"UPDATE commerce.{table} SET qty = 5000000000, note = 'n' WHERE id = 1",
    )
    sync.capture()
    before = history_versions(spark, target / table)
    monkeypatch.setattr(delta_features, "delta_major", lambda _spark: 3)
    with pytest.raises(DeltaFeatureError, match=r"qty int -> bigint.*needs Delta Lake type widening"):
        merge(spark, plan(1, 2))
    assert history_versions(spark, target / table) == before  # no ALTER, no ADD COLUMNS commit
    schema = spark.read.format("delta").load(str(target / table)).schema
    assert schema["qty"].dataType == T.IntegerType() and "note" not in schema.fieldNames()
    wl.execute(hook, f"DROP TABLE commerce.{table}")


# -- spark-submit: killed at random points, and on a standalone cluster ------------------------------


def _submit_command(plan_file: Path, report_file: Path, master: str, extra: dict[str, str]) -> list[str]:
    conf = {
        "spark.pyspark.python": sys.executable,
        "spark.executor.extraJavaOptions": QUICK_JIT,  # the driver's is spark_submit_args's
        **extra,
    }
    return [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        master,
        *spark_submit_args(local=True, extra=conf),
        str(JOB),
        "--plan-file",
        str(plan_file),
        "--report-file",
        str(report_file),
        "--rows-per-file",
        "40000",
    ]


def _env() -> dict[str, str]:
    return {**spark_env(), "PYTHONPATH": str(REPO)}


@dataclass
class Run:
    code: int | None
    killed_at: str | None
    progress: list[dict[str, Any]]
    stdout: list[str]


def _run_job(
    plan: MergePlan,
    tmp: Path,
    name: str,
    *,
    master: str = "local[2]",
    kill: tuple[str, int, float] | None = None,
) -> Run:
    """spark-submit the job; with ``kill=(phase, nth, delay)`` SIGKILL its process group ``delay``
    seconds after its nth progress line of ``phase``."""
    plan_file, report_file = tmp / f"{name}.plan.json", tmp / f"{name}.report.json"
    plan_file.write_text(plan.to_json())
    with open(tmp / f"{name}.stderr", "w") as err:
        child = subprocess.Popen(
            _submit_command(plan_file, report_file, master, {}),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=tmp,
            env=_env(),
            start_new_session=True,
        )
        assert child.stdout is not None
        lines: list[str] = []
        progress: list[dict[str, Any]] = []
        killed: list[str] = []

        def kill_after(delay: float, what: str) -> None:
            time.sleep(delay)
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                killed.append(what)

        seen: Counter[str] = Counter()
        for line in child.stdout:
            lines.append(line)
            if line.startswith(PROGRESS_PREFIX):
                event = json.loads(line[len(PROGRESS_PREFIX) :])
                progress.append(event)
                seen[event["phase"]] += 1
                if kill is not None and event["phase"] == kill[0] and seen[kill[0]] == kill[1]:
                    threading.Thread(
                        target=kill_after, args=(kill[2], f"{kill[0]} #{kill[1]}"), daemon=True
                    ).start()
        code = child.wait(timeout=600)
    if killed:
        return Run(None, killed[0], progress, lines)
    assert code == 0, (tmp / f"{name}.stderr").read_text()[-4000:]
    return Run(code, None, progress, lines)


def test_spark_submit_killed_at_random_points_then_rerun_commits_each_window_once(
    spark: SparkSession, captured: Captured, tmp_path: Path
) -> None:
    rng = random.Random(SEED + 1)
    sync = captured.orders
    plan = sync.plan(tmp_path / "delta")
    assert len(plan.windows) >= 3
    # Each run resumes where the one before stopped; (phase, n, delay): kill ``delay`` seconds
    # after the run's nth progress line of ``phase``.
    kills = [
        ("writing", 1, 0.0),  # before a write: the step has started, nothing is written yet
        ("writing", 1, rng.uniform(0.5, 6.0)),  # while writing or committing
        ("committed", 1, 0.0),  # right after a commit, before the next window
    ]
    landed = []
    for i, kill in enumerate(kills):
        run = _run_job(plan, tmp_path, f"kill{i}", kill=kill)
        landed.append(run.killed_at)
    assert all(landed), f"every kill must land while the job runs: {landed}"
    final = _run_job(plan, tmp_path, "final")
    report = parse_report_line(final.stdout)
    assert report is not None and report.merged_seqs() == [w.seq for w in plan.windows]
    assert any(s is TableStatus.ALREADY_APPLIED for s in report.statuses().values())
    written = json.loads((tmp_path / "final.report.json").read_text())
    # The file is the printed report plus the Spark application (for the task's Spark UI link).
    assert written.pop("spark")["application_id"].startswith("local-")
    assert written == json.loads(report.to_json())
    table = tmp_path / "delta" / wl.ORDERS
    assert txn_versions(table) == Counter({(plan.txn_app_id(wl.ORDERS), w.seq): 1 for w in plan.windows})
    wl.assert_equal_to_source(spark, captured.hook, "customer", wl.ORDERS, str(table), ("order_id",))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_job_on_a_standalone_spark_cluster(spark: SparkSession, captured: Captured, tmp_path: Path) -> None:
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = {**_env(), "SPARK_LOG_DIR": str(tmp_path), "SPARK_WORKER_DIR": str(tmp_path / "work")}
    procs = []
    try:
        for args, log in [
            (
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui),
                ],
                "master.log",
            ),
            (
                [
                    "org.apache.spark.deploy.worker.Worker",
                    f"spark://127.0.0.1:{port}",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(worker_ui),
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                ],
                "worker.log",
            ),
        ]:
            with open(tmp_path / log, "w") as out:
                procs.append(
                    subprocess.Popen(
                        [spark_class, *args],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.loads(r.read()).get("aliveworkers", 0) >= 1:
                        break
            # ValueError: an empty answer, which the master's UI gives while it is not yet the
            # elected leader (seen under load, with another worker's tests beside it)
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
        # The type matrix only: its DECIMAL(65,30) column runs a Python function on the executors.
        sync = captured.commerce
        full = sync.plan(tmp_path / "delta")
        windows = tuple(
            replace(w, replace_tables=(wl.TYPES,) if w.replace_tables else ()) for w in full.windows
        )
        plan = MergePlan(full.sync_id, windows, {wl.TYPES: full.targets[wl.TYPES]})
        run = _run_job(plan, tmp_path, "cluster", master=f"spark://127.0.0.1:{port}")
        report = parse_report_line(run.stdout)
        assert report is not None and report.merged_seqs() == [w.seq for w in plan.windows]
        wl.assert_equal_to_source(
            spark, captured.hook, "commerce", wl.TYPES, str(tmp_path / "delta" / wl.TYPES), ("id",)
        )
        apps = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5).read())
        assert apps["completedapps"], "the job ran on the cluster"
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_transaction_versions_are_read_from_a_checkpointed_log_without_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The capture side's reader of a table's transactions (no JVM there) agrees with what Delta
    wrote, across a checkpoint and the commits after it, and across two app ids."""
    from airflow_provider_vitess.delta_txns import transaction_versions

    path = str(tmp_path / "t")
    assert transaction_versions(path) == {}
    spark.sql(f"CREATE TABLE delta.`{path}` (k INT) USING delta TBLPROPERTIES (delta.checkpointInterval = 4)")
    for n in range(1, 12):
        # app-c writes once, long before the checkpoint at 8; app-b last at 9, after it.
        app = "app-c" if n == 2 else "app-a" if n % 3 else "app-b"
        spark.createDataFrame([(n,)], "k INT").write.format("delta").mode("append").option(
            "txnAppId", app
        ).option("txnVersion", n).save(path)
    log = tmp_path / "t" / "_delta_log"
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 8
    assert (log / f"{8:020d}.checkpoint.parquet").is_file()
    assert transaction_versions(path) == {"app-a": 11, "app-b": 9, "app-c": 2}
    # app-c's version lives in the checkpoint alone once the commits before it are gone (as log
    # cleanup removes them); the others' come from the commits after it.
    for f in log.glob("*.json"):
        if int(f.name.split(".")[0]) <= 8:
            f.unlink()
    assert transaction_versions(path) == {"app-a": 11, "app-b": 9, "app-c": 2}
    spark.createDataFrame([(99,)], "k INT").write.format("delta").mode("append").save(path)  # no txn
    assert transaction_versions(path) == {"app-a": 11, "app-b": 9, "app-c": 2}
