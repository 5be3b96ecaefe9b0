"""Snapshots through the real vtgate: exact staged content, count(*) progress, SIGKILL + resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.capture import source
from airflow_provider_vitess.capture.progress import LiveCopyProgress
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, Phase, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support import capture_child
from tests.support.big_table import BIG_ROWS, copied_rows, select_all, staged_rows
from tests.support.capture_child import ChildSpec
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration


def test_snapshot_of_three_tables_in_two_keyspaces_with_progress(
    vitess_conn_id: str, big_table: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    hook = VitessHook(vitess_conn_id)
    with hook.connect_sql() as conn, conn.begin():  # rows of its own: other tests empty the table
        conn.execute(
            sqlalchemy.text("INSERT IGNORE INTO customer.customer (customer_id, email) VALUES (:c, :e)"),
            [{"c": c, "e": f"snap-{c}@example.com"} for c in range(70_001, 70_021)],
        )
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    lines: list[str] = []

    def emit(p: LiveCopyProgress) -> None:
        lines.append(p.line())
        logging.getLogger("snapshot").info("progress %s", p.line())

    outcomes = {}
    for sync_id, keyspace, tables in [
        ("snap-commerce", "commerce", ("big", "product")),
        ("snap-customer", "customer", ("customer",)),
    ]:
        spec = SyncSpec(sync_id, keyspace, tables, str(tmp_path / "stage"))
        runner = CaptureRunner(hook, store, spec, holder="test", emit_progress=emit, progress_interval=0.5)
        outcome = runner.snapshot(checkpoint_every_rows=20_000)
        outcomes[sync_id] = outcome
        assert store.window(sync_id, outcome.seq).state is WindowState.STAGED
        for table in tables:
            staged, n = staged_rows(outcome.manifest, table)
            source = select_all(hook, keyspace, table)
            assert staged == source, f"{keyspace}.{table}"
            assert n == len(source)  # nothing copied twice
        progress = {p.table: p for p in store.progress(sync_id, outcome.seq)}
        for table in tables:
            count = len(select_all(hook, keyspace, table))
            assert progress[table].rows_known == count
            assert progress[table].rows_copied == count
            assert progress[table].phase is Phase.COPIED
    assert len(select_all(hook, "commerce", "big")) == BIG_ROWS
    assert any("big: 200,000 of 200,000 rows copied (100.0%)" in line for line in lines)
    assert any("%)" in line and "100.0%" not in line for line in lines), "no intermediate percentage logged"
    assert "progress big:" in caplog.text


def test_snapshot_killed_at_random_points_resumes_without_recopying(
    vitess: LocalVitess, big_table: str, tmp_path: Path
) -> None:
    connection = connection_uri_env("vitess_kill", vitess)
    tables = ("big", "product")
    spec = ChildSpec.in_dir(tmp_path, "snap-kill", "commerce", tables, connection, lock_stale_seconds=1)
    rng = random.Random(20261122)
    # Kill points: after a seeded random number of copied rows (as the store reports them) plus a
    # seeded random delay, so kills land mid-batch, mid-table and between checkpoints.
    # Four fall in table big; the last once big is finished and product is being copied, where a
    # resume must not copy big again (Vitess would, unless told which tables remain).
    product_rows = len(select_all(VitessHook("vitess_big"), "commerce", "product"))
    assert product_rows > 10_000, "product must be big enough to be killed while it is copied"
    thresholds = sorted(rng.randint(0, BIG_ROWS - 20_000) for _ in range(4))
    thresholds.append(BIG_ROWS + rng.randint(1_000, product_rows - 6_000))
    kills, resumed = 0, []
    observer = CheckpointStore(spec.store_url)
    while True:
        child = capture_child.start("snapshot", spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if kills < len(thresholds):
            deadline = time.monotonic() + 120
            while child.poll() is None and copied_rows(observer, "snap-kill") < thresholds[kills]:
                assert time.monotonic() < deadline, "snapshot made no progress"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                child.communicate()
                kills += 1
                continue
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-3000:]
        resumed.append(json.loads(out.strip().splitlines()[-1])["resumed"])
        break
    assert kills == 5, "every kill point must fall while the snapshot runs"
    assert resumed == [True]

    hook = VitessHook("vitess_big")
    store = CheckpointStore(spec.store_url)
    window = store.window("snap-kill", 1)
    assert window.state is WindowState.STAGED
    from airflow_provider_vitess.staging import load_manifest

    manifest = load_manifest(spec.staging, "snap-kill", 1)
    assert manifest is not None
    for table in ("big", "product"):
        staged, n = staged_rows(manifest, table)
        source = select_all(hook, "commerce", table)
        assert staged == source, table
        # A finished table copied again after a resume would show up as extra staged rows.
        assert n == len(source), f"{table}: {n} staged rows for {len(source)} source rows"


SHARDED_TABLES = ("snapkill_a", "snapkill_b")  # copied in this (sorted) order on each shard


def _sharded_tables(hook: VitessHook) -> None:
    """customer.snapkill_a (400 rows) and snapkill_b (4,000 rows), both on both shards."""
    with hook.connect_sql() as conn, conn.begin():
        for table, rows in zip(SHARDED_TABLES, (400, 4000), strict=True):
            body = "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))"
            conn.execute(sqlalchemy.text(f"CREATE TABLE IF NOT EXISTS customer.{table} {body}"))
            with contextlib.suppress(sqlalchemy.exc.DBAPIError):  # the vschema outlives a DROP
                conn.execute(
                    sqlalchemy.text(f"ALTER VSCHEMA ON customer.{table} ADD VINDEX hash(id) USING hash")
                )
            conn.execute(sqlalchemy.text(f"DELETE FROM customer.{table}"))
            conn.execute(
                sqlalchemy.text(f"INSERT INTO customer.{table} (id, note) VALUES (:id, :note)"),
                [{"id": i, "note": f"{table} row {i}"} for i in range(1, rows + 1)],
            )


def test_a_table_one_shard_finished_before_the_other_began_is_copied_on_both_after_a_kill(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    """Shard -80 copies snapkill_a and moves on to snapkill_b while 80- has not begun snapkill_a
    (held up: an open transaction on 80- that wrote to it blocks vttablet's ``LOCK TABLES ..
    READ``). A kill there, then a rerun: snapkill_a's rows on 80- must be copied too. Before the
    fix the first run recorded snapkill_a COPIED (seen in copy, then in copy nowhere), and the
    rerun's ``tables_to_copy`` (which applies to every shard) left it out on 80- as well."""
    name, value = connection_uri_env("vitess_shardkill", vitess)
    os.environ[name] = value
    hook = VitessHook("vitess_shardkill")
    _sharded_tables(hook)
    options = {"checkpoint_every_rows": 100, "lock_stale_seconds": 1}
    spec = ChildSpec.in_dir(tmp_path, "snap-shardkill", "customer", SHARDED_TABLES, (name, value), **options)
    observer = CheckpointStore(spec.store_url)
    blocker = hook.engine.raw_connection()
    try:
        cur = blocker.cursor()
        cur.execute("USE `customer:80-`")
        cur.execute("BEGIN")
        cur.execute("UPDATE snapkill_a SET note = note WHERE id = -1")  # holds the table's lock
        child = capture_child.start("snapshot", spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:  # until -80 has checkpointed a few hundred rows of snapkill_b
            assert child.poll() is None, child.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "shard -80 did not reach snapkill_b"
            try:
                progress = {p.table: p for p in observer.progress("snap-shardkill", 1)}
            except Exception:  # the child has not created the store's tables yet
                progress = {}
            if "snapkill_b" in progress and (progress["snapkill_b"].rows_copied or 0) >= 300:
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.communicate()
        resume_at = observer.resume_vgtid("snap-shardkill", 1)
        assert resume_at is not None
        entries = {sg.shard: sg for sg in resume_at.shard_gtids}
        # The case this test is about: -80 past snapkill_a, 80- not begun at all.
        assert [pk.table_name for pk in entries["-80"].table_last_pks] == ["snapkill_b"]
        assert entries["80-"].gtid == "" and not entries["80-"].table_last_pks
    finally:
        cur.execute("ROLLBACK")
        cur.execute("USE customer")  # pooled: leave no shard target behind
        blocker.close()
    time.sleep(1.5)  # the killed run's lock goes stale
    done = capture_child.run("snapshot", spec, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["resumed"] is True

    from airflow_provider_vitess.staging import load_manifest

    manifest = load_manifest(spec.staging, "snap-shardkill", 1)
    assert manifest is not None
    for table in SHARDED_TABLES:
        staged, _ = staged_rows(manifest, table)
        source = select_all(hook, "customer", table)
        assert len(source) == (400 if table == "snapkill_a" else 4000)
        assert staged == source, f"{table}: {len(source) - len(staged.keys() & source.keys())} rows missing"
    assert progress["snapkill_a"].phase is Phase.COPYING  # at the kill: not copied on 80- yet


def test_count_rows_reads_from_the_connections_tablet_type(vitess: LocalVitess) -> None:
    """The snapshot's ``count(*)`` is a full scan: it goes where the connection says reads go.
    vttestserver has RDONLY tablets and no REPLICA one, so a count that honours REPLICA fails
    naming it (before the fix it read the primary and returned the count)."""
    hooks = {}
    for tablet_type in ("RDONLY", "REPLICA"):
        name, value = connection_uri_env(
            f"vitess_count_{tablet_type.lower()}", vitess, tablet_type=tablet_type
        )
        os.environ[name] = value
        hooks[tablet_type] = VitessHook(f"vitess_count_{tablet_type.lower()}")
    _sharded_tables(hooks["RDONLY"])
    assert source.count_rows(hooks["RDONLY"], "customer", "snapkill_b") == 4000
    with pytest.raises(sqlalchemy.exc.DBAPIError, match=r"no healthy tablet.*REPLICA"):
        source.count_rows(hooks["REPLICA"], "customer", "snapkill_b")
    # The pooled connections stay aimed at no tablet type: a plain query reads the keyspace.
    with hooks["RDONLY"].connect_sql() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM customer.snapkill_a").scalar_one() == 400


GAP_TABLES = ("snapgap_a", "snapgap_b")  # this test's own tables, copied in this order
GAP_ROWS = {"snapgap_a": 1000, "snapgap_b": 300}


def test_a_kill_right_after_the_checkpoint_that_finished_a_table_does_not_copy_it_again(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    """The checkpoint at which ``snapgap_a`` is finished (its position names only ``snapgap_b``,
    or nothing) is recorded, and the copy is SIGKILLed right then. The rerun must leave
    ``snapgap_a`` out of ``tables_to_copy``, else Vitess copies it again (it copies every listed
    table absent from the position's last PKs). Before the fix the phases were written after the
    parts and position, in transactions of their own: the kill left ``snapgap_a`` COPYING, and
    its rows were staged twice."""
    name, value = connection_uri_env("vitess_snapgap", vitess)
    os.environ[name] = value
    hook = VitessHook("vitess_snapgap")
    for table, rows in GAP_ROWS.items():
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{table}"))
            conn.execute(
                sqlalchemy.text(
                    f"CREATE TABLE commerce.{table} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(1100))"
                )
            )
            # Rows of ~1 KB: vttablet sends the copy in packets of 250 KB, a checkpoint after each.
            conn.execute(
                sqlalchemy.text(f"INSERT INTO commerce.{table} VALUES (:id, :note)"),
                [{"id": i, "note": f"{i:06d}" + "x" * 1000} for i in range(1, rows + 1)],
            )
    options = {"checkpoint_every_rows": 100, "lock_stale_seconds": 1, "kill_once_copied": True}
    spec = ChildSpec.in_dir(tmp_path, "snap-gap", "commerce", GAP_TABLES, (name, value), **options)
    killed = capture_child.run("snapshot", spec, timeout=300)
    assert killed.returncode == -9 and "KILLED-AFTER-CHECKPOINTS" in killed.stdout, killed.stderr[-3000:]
    time.sleep(1.5)  # the killed run's lock goes stale
    done = capture_child.run("snapshot", dataclasses.replace(spec, kill_once_copied=False), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["resumed"] is True

    from airflow_provider_vitess.staging import load_manifest

    manifest = load_manifest(spec.staging, "snap-gap", 1)
    assert manifest is not None
    for table in GAP_TABLES:
        staged, n = staged_rows(manifest, table)
        assert staged == select_all(hook, "commerce", table), table
        assert n == GAP_ROWS[table], f"{table}: {n} rows staged for {GAP_ROWS[table]} source rows"
