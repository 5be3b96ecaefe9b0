"""The merge on a long-running Spark Connect server (``dev/spark_connect.sh``), through
:class:`MergeRunner` (the operator's code path) with :func:`merge.connect.run_merge` as its
submit: a snapshot and a catch-up window of two tables, target == ``SELECT *`` through vtgate,
each window committed once per table (its transaction id once in the Delta log), and a rerun
of an already merged window through the Connect path commits nothing.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.utils import is_remote

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job import connect, connect_tables
from airflow_provider_vitess.merge.job.steps import TableSize
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport, TableStatus
from airflow_provider_vitess.merge.runner import MergeRunner, build_plan
from tests.support.delta_check import assert_delta_equals_source, delta_txns
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

A, B = "connect_a", "connect_b"


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_connect", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_connect")
        execute(
            hook,
            *[
                f"CREATE TABLE IF NOT EXISTS commerce.{t} (id BIGINT NOT NULL PRIMARY KEY, "
                "note VARCHAR(64), amount DECIMAL(12,2))"
                for t in (A, B)
            ],
        )
        yield hook
        hook.close()


def workload(
    hook: VitessHook, rng: random.Random, old: dict[str, list[int]] | None = None
) -> dict[str, list[int]]:
    """30 inserts of fresh ids in both tables (reruns on a used cluster never collide); with
    ``old`` (an earlier round's ids), 5 updates and 3 deletes of those rows. Returns the ids.
    Which rows change is chosen, not left to ``ORDER BY id`` over the tables' random ids (that
    sometimes picked this round's own inserts, and the counts below then varied)."""
    statements, fresh = [], {}
    for table in (A, B):
        fresh[table] = [rng.randrange(1, 2**40) for _ in range(30)]
        for i in fresh[table]:
            statements.append(
                f"INSERT INTO commerce.{table} (id, note, amount) VALUES ({i}, 'n{i}', {i % 1000}.25)"
            )
        if old:
            updated, deleted = ", ".join(map(str, old[table][:5])), ", ".join(map(str, old[table][5:8]))
            statements.append(
                f"UPDATE commerce.{table} SET note = 'u{rng.random():.6f}' WHERE id IN ({updated})"
            )
            statements.append(f"DELETE FROM commerce.{table} WHERE id IN ({deleted})")
    execute(hook, *statements)
    return fresh


def test_windows_merged_on_spark_connect_equal_the_source_each_once(
    spark_connect: str, hook: VitessHook, tmp_path: Path
) -> None:
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"connect-{uuid.uuid4().hex[:8]}", "commerce", (A, B), str(tmp_path / "stage"))
    capture = CaptureRunner(hook, store, spec, holder="test-connect")
    delta = tmp_path / "delta"
    runner = MergeRunner(store, spec.sync_id, str(delta), holder="test-connect-merge")
    submitted: list[MergePlan] = []

    # A session setting (the merge task's SQL/Delta conf): Delta's default of a new table's property.
    retention = {"spark.databricks.delta.properties.defaults.logRetentionDuration": "interval 45 days"}

    def submit(plan: MergePlan) -> MergeReport:
        submitted.append(plan)
        return connect.run_merge(spark_connect, plan, conf=retention)

    rng = random.Random(spec.sync_id)
    first = workload(hook, rng)
    capture.snapshot()
    assert runner.run(submit).seq == 1
    workload(hook, rng, first)
    capture.catch_up()
    outcome = runner.run(submit)
    assert outcome.seq == 2 and outcome.report is not None
    written = {r.table: r for r in outcome.report.window(2).tables}
    assert {t: r.status for t, r in written.items()} == {A: TableStatus.WRITTEN, B: TableStatus.WRITTEN}
    assert {t: (r.rows_inserted, r.rows_updated, r.rows_deleted) for t, r in written.items()} == {
        A: (30, 5, 3),
        B: (30, 5, 3),
    }

    for table in (A, B):  # the sessions took the setting: the tables were created with it
        actions = [json.loads(line) for line in (delta / table / "_delta_log" / f"{0:020d}.json").open()]
        created = next(a["metaData"] for a in actions if "metaData" in a)
        assert created["configuration"]["delta.logRetentionDuration"] == "interval 45 days", created

    # The Connect merge leaves this process for classic Spark (the Spark tests after this one).
    assert not is_remote()
    with connect.remote_sessions(spark_connect) as new_session:
        reader = new_session()
        try:
            assert_delta_equals_source(hook, "commerce", (A, B), delta, reader)
            for table in (A, B):
                app_id = submitted[0].txn_app_id(table)
                assert [(a, v) for a, v, _ in delta_txns(delta / table)] == [(app_id, 1), (app_id, 2)]
                path = str(delta / table)
                assert (
                    connect_tables.txn_version(
                        reader, path, app_id, connect_tables.table_version(reader, path)
                    )
                    == 2
                )

            # A merge killed after its Delta commits but before MERGED was recorded is run
            # again: through the Connect path too, the transaction ids make it commit nothing.
            window = store.window(spec.sync_id, 2)
            assert window.state is WindowState.COMMITTED
            again = connect.run_merge(spark_connect, build_plan(store, spec.sync_id, window, str(delta)))
            statuses: dict[str, Any] = {r.table: r.status for r in again.window(2).tables}
            assert statuses == {A: TableStatus.ALREADY_APPLIED, B: TableStatus.ALREADY_APPLIED}
            assert [v for _, v, _ in delta_txns(delta / A)] == [1, 2]
            # A block inside the reader's keeps the mark: the reader still works.
            assert is_remote() and reader.range(3).count() == 3
        finally:
            store.close()
    assert not is_remote()


def test_the_txn_version_is_read_from_the_snapshots_own_log_files(
    spark_connect: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``connect_tables.txn_version`` reads a checkpoint and the commits after it, as Delta does, not
    every file of the log (a commit per window for 30 days): a stray older checkpoint file that
    Delta never reads is not read either (reading the whole log failed on it). Without the
    checkpoint at the interval it takes the newest one listed; with a V2 checkpoint (files not
    named here) newer than that, the whole log."""
    table = str(tmp_path / "txns")
    caplog.set_level(logging.INFO, logger=connect.__name__)
    with connect.remote_sessions(spark_connect) as new_session:
        spark = new_session()
        frame = spark.range(1)
        for v in range(1, 26):  # table versions 0-24: a checkpoint at 10 and at 20
            app = "app-x" if v <= 12 else "app-y"
            writer = frame.write.format("delta").mode("append")
            writer.option("txnAppId", app).option("txnVersion", v if v <= 12 else v - 12).save(table)
        log_dir = Path(table) / "_delta_log"
        assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 20
        version = connect_tables.table_version(spark, table)
        assert version == 24

        def txns() -> tuple[int | None, ...]:
            return tuple(
                connect_tables.txn_version(spark, table, app, version) for app in ("app-x", "app-y", "app-z")
            )

        stray = log_dir / f"{5:020d}.checkpoint.parquet"
        stray.write_bytes(b"not a parquet file")
        assert txns() == (12, 13, None)  # app-x only in the checkpoint at 20, app-y after it too
        stray.unlink()
        (log_dir / f"{20:020d}.checkpoint.parquet").unlink()  # the listed one at 10, then
        assert txns() == (12, 13, None)
        assert "reading the whole log" not in caplog.text
        v2 = log_dir / f"{22:020d}.checkpoint.0a1b2c3d-0000-4000-8000-000000000000.parquet"
        v2.write_bytes((log_dir / f"{10:020d}.checkpoint.parquet").read_bytes())
        assert txns() == (12, 13, None)
        assert "reading the whole log" in caplog.text


def test_the_table_state_is_read_from_the_versions_checksum_file_else_from_the_table(
    spark_connect: str, tmp_path: Path
) -> None:
    """Over Spark Connect the state's properties, transaction versions, files and bytes come from
    the version's ``.crc`` (one small read; ``DESCRIBE DETAIL`` rebuilds the version's file
    list): what it says is what the table says. A checksum without its transactions, or no
    checksum at all, gives the same state from the table itself (no size then: the MERGE asks)."""
    table = str(tmp_path / "state")
    with connect.remote_sessions(spark_connect) as new_session:
        spark = new_session()
        for app, version in (("app-x", 1), ("app-x", 2), ("app-y", 1), ("app-x", 3)):
            writer = spark.range(5).write.format("delta").mode("append")
            writer.option("txnAppId", app).option("txnVersion", version).save(table)
        spark.sql(
            f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
            "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
        )
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()
        assert detail is not None and detail["numFiles"] >= 4  # four appends
        size = TableSize(detail["numFiles"], detail["sizeInBytes"])
        version = connect_tables.table_version(spark, table)
        crc = Path(table) / "_delta_log" / f"{version:020d}.crc"
        written = json.loads(crc.read_text())

        def rewrite(doc: dict[str, Any]) -> None:
            crc.write_text(json.dumps(doc))
            # Hadoop's local file system keeps a checksum of each file it wrote beside it.
            crc.with_name(f".{crc.name}.crc").unlink(missing_ok=True)

        def state(app: str = "app-x") -> tuple[Any, ...]:
            s = connect_tables.table_state(spark, table, app, None)
            return s.exists, s.version, s.txn_version, s.column_mapping, s.size, s.schema.names

        assert state() == (True, version, 3, True, size, ["id"])
        assert state("app-y")[2] == 1 and state("app-z")[2] is None
        # What the file says is what counts (here a transaction the log does not hold).
        rewrite({**written, "setTransactions": [{"appId": "app-x", "version": 99}]})
        assert state()[2] == 99
        # Without its transactions (past Delta's bound of 100 app ids): from the log.
        rewrite({k: v for k, v in written.items() if k != "setTransactions"})
        assert state() == (True, version, 3, True, size, ["id"])
        crc.unlink()
        assert state() == (True, version, 3, True, None, ["id"])


def test_the_token_is_required_and_never_logged(
    spark_connect: str,
    hook: VitessHook,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The server refuses a client without its token; a merge through the operator's Connect
    path (a ``spark_connect`` connection whose password is the token) logs it in no form: as
    typed, URL-encoded (Airflow's Spark Connect hook puts it in the URL so, and the masker
    knows only the typed form), or fully URL-encoded."""
    from urllib.parse import quote

    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    plain, token = connect.split_token(spark_connect)
    assert token and "/" in token and "+" in token
    with connect.remote_sessions(plain) as new_session, pytest.raises(Exception, match="UNAUTHENTICATED"):
        new_session().range(1).count()

    host = plain.rstrip("/")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SC_TOKEN", json.dumps({"conn_type": "spark_connect", "host": host, "password": token})
    )
    caplog.set_level(logging.DEBUG)
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"connect-tok-{uuid.uuid4().hex[:8]}", "commerce", (A,), str(tmp_path / "stage"))
    delta = tmp_path / "delta"
    operator = VitessMergeOperator(
        task_id="merge", sync_id=spec.sync_id, target_location=str(delta), spark_connect_conn_id="sc_token"
    )
    try:
        workload(hook, random.Random(spec.sync_id))
        CaptureRunner(hook, store, spec, holder="test-token").snapshot()
        runner = MergeRunner(store, spec.sync_id, str(delta), holder="test-token-merge")
        backend = operator._make_backend()
        assert runner.run(lambda plan: backend.submit(plan, {})).seq == 1
    finally:
        store.close()
    with connect.remote_sessions(spark_connect) as new_session:
        assert_delta_equals_source(hook, "commerce", (A,), delta, new_session())
    out, err = capfd.readouterr()
    logged = "\n".join([caplog.text, out, err])
    assert "Merge window 1 of sync" in logged  # the capture saw the operator's own lines
    for form in {token, quote(token), quote(token, safe="")}:
        assert form not in logged, form


KILLED = ("connect_kill_a", "connect_kill_b")


def test_a_killed_connect_merge_task_stops_its_spark_operations_and_leaves_the_window_to_rerun(
    spark_connect: str, hook: VitessHook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge task is killed (SIGTERM, which Airflow's task runner turns into ``on_kill``)
    while its Spark Connect merge writes a table: the server's operations for the merge stop
    before any commit, the task fails saying so, the sync's lock is released and the window
    stays STAGED; the next run merges it (target == source, each window committed once)."""
    from airflow_provider_vitess.exceptions import MergeInterruptedError
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    # Tables of this test's own, big enough that a table's write runs a while on the server.
    execute(
        hook,
        *[f"DROP TABLE IF EXISTS commerce.{t}" for t in KILLED],
        *[f"CREATE TABLE commerce.{t} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(200))" for t in KILLED],
    )
    rows, batch = 40_000, 2_000
    execute(
        hook,
        *[
            f"INSERT INTO commerce.{t} (id, note) VALUES "
            + ", ".join(f"({i}, '{format(i * 7919, 'x') * 12}')" for i in range(start, start + batch))
            for t in KILLED
            for start in range(1, rows + 1, batch)
        ],
    )
    plain, token = connect.split_token(spark_connect)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SC_KILL",
        json.dumps({"conn_type": "spark_connect", "host": plain.rstrip("/"), "password": token}),
    )
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    monkeypatch.setenv(
        "AIRFLOW_CONN_KILL_STORE", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "store.db")})
    )
    spec = SyncSpec(f"connect-kill-{uuid.uuid4().hex[:8]}", "commerce", KILLED, str(tmp_path / "stage"))
    delta = tmp_path / "delta"
    try:
        CaptureRunner(hook, store, spec, holder="test-kill").snapshot()
        operator = VitessMergeOperator(
            task_id="merge",
            sync_id=spec.sync_id,
            target_location=str(delta),
            checkpoint_conn_id="kill_store",
            spark_connect_conn_id="sc_kill",
        )
        # What Airflow's task runner does on SIGTERM: the task's on_kill, in the main thread.
        previous = signal.signal(signal.SIGTERM, lambda *_: operator.on_kill())
        writing = threading.Event()
        fired: list[float] = []

        def kill_while_a_table_is_written() -> None:
            # Delta writes a new table's data files into its directory before it commits: a
            # data file and no commit yet is a write in flight on the server.
            while not writing.is_set():
                if any(delta.glob("*/*.parquet")):
                    writing.set()
                    fired.append(time.monotonic())
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.005)

        killer = threading.Thread(target=kill_while_a_table_is_written, daemon=True)
        killer.start()
        try:
            with pytest.raises(MergeInterruptedError, match="window 1 on Spark Connect was killed"):
                operator.execute({})
            ended = time.monotonic()
        finally:
            writing.set()
            killer.join()
            signal.signal(signal.SIGTERM, previous)
        assert fired, "the merge ended before any table's write began: no kill happened"
        print(f"the killed merge task ended {ended - fired[0]:.2f}s after SIGTERM")
        time.sleep(3)  # whatever the server had left to run for the merge would commit by now
        assert [list((delta / t / "_delta_log").glob("*.json")) for t in KILLED] == [[], []]
        assert store.window(spec.sync_id, 1).state is WindowState.STAGED
        # The lock is free (a held one refuses this run) and the window merges as a whole.
        rerun = VitessMergeOperator(
            task_id="merge", sync_id=spec.sync_id, target_location=str(delta), spark_connect_conn_id="sc_kill"
        )._make_backend()
        runner = MergeRunner(store, spec.sync_id, str(delta), holder="test-kill-rerun")
        assert runner.run(lambda plan: rerun.submit(plan, {})).seq == 1
        with connect.remote_sessions(spark_connect) as new_session:
            assert_delta_equals_source(hook, "commerce", KILLED, delta, new_session())
        app_ids = {
            t: build_plan(store, spec.sync_id, store.window(spec.sync_id, 1), str(delta)).txn_app_id(t)
            for t in KILLED
        }
        assert {t: [(a, v) for a, v, _ in delta_txns(delta / t)] for t in KILLED} == {
            t: [(app_ids[t], 1)] for t in KILLED
        }
    finally:
        store.close()
    assert not is_remote()
