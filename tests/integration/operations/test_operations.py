"""Operating events against the real vtgate, Spark and Delta: a target that is not what the sync
last wrote is refused before anything is written, a re-snapshot heals it (discarding the
unfinished window it was stuck on), a changed key asks for a re-snapshot, windows merge with
the key they were staged with, and the connection's tablet type is the one every read uses.

The merge runs through :class:`MergeRunner` (the merge operator's own code path) with the Spark
job's ``merge`` in this process instead of a spark-submit, to keep each merge at seconds.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airflow_provider_vitess.capture import run as capture_run
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind, WindowState
from airflow_provider_vitess.exceptions import (
    KeyChangedError,
    MergeSchemaError,
    TableListChangedError,
    TargetIntegrityError,
    UnnamedColumnsError,
    VStreamError,
    ZeroDateError,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies, ZeroDatePolicy
from airflow_provider_vitess.vstream.position import capture_stop_position
from spark_jobs.merge_cdc import merge
from tests.support.delta_check import assert_delta_equals_source, delta_history, spark_session
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.merge_workload import execute

pytestmark = pytest.mark.integration

A, B = "ops_a", "ops_b"
T = TypeVar("T")


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_ops", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_ops")
        execute(
            hook,
            f"CREATE TABLE IF NOT EXISTS commerce.{A} (id BIGINT NOT NULL PRIMARY KEY, "
            "code VARCHAR(32) NOT NULL, note VARCHAR(64), UNIQUE KEY uk_code (code))",
            f"CREATE TABLE IF NOT EXISTS commerce.{B} (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))",
        )
        yield hook
        hook.close()


@dataclass
class Sync:
    """One sync of ``ops_a``/``ops_b`` with its store, staging and Delta root (all in tmp)."""

    hook: VitessHook
    root: Path
    spec: SyncSpec
    store: CheckpointStore
    rng: random.Random

    def runner(self, **spec: Any) -> CaptureRunner:
        return CaptureRunner(self.hook, self.store, replace(self.spec, **spec), holder="test-ops")

    def merge(self) -> MergeOutcome:
        def submit(plan: object) -> MergeReport:
            return merge(spark_session(), plan)  # type: ignore[arg-type]

        return MergeRunner(self.store, self.spec.sync_id, str(self.delta), holder="test-ops-merge").run(
            submit
        )

    @property
    def delta(self) -> Path:
        return self.root / "delta"

    def workload(self, n: int = 20) -> None:
        """Inserts, updates and deletes in both tables (fresh ids, so reruns never collide)."""
        statements = []
        for table in self.spec.tables:
            for _ in range(n):
                i = self.rng.randrange(1, 2**40)
                code = f"'c{i}'" if table == A else None
                cols = "id, code, note" if table == A else "id, note"
                values = f"{i}, {code}, 'n{i}'" if table == A else f"{i}, 'n{i}'"
                statements.append(f"INSERT INTO commerce.{table} ({cols}) VALUES ({values})")
            statements.append(
                f"UPDATE commerce.{table} SET note = 'u{self.rng.random():.6f}' ORDER BY id LIMIT 3"
            )
            statements.append(f"DELETE FROM commerce.{table} ORDER BY id DESC LIMIT 2")
        execute(self.hook, *statements)

    def assert_equal(self, tables: Sequence[str] | None = None) -> None:
        assert_delta_equals_source(self.hook, "commerce", tables or self.spec.tables, self.delta)


@pytest.fixture
def sync(hook: VitessHook, tmp_path: Path) -> Iterator[Sync]:
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"ops-{uuid.uuid4().hex[:8]}", "commerce", (A, B), str(tmp_path / "stage"))
    made = Sync(hook, tmp_path, spec, store, random.Random(spec.sync_id))
    made.workload()
    yield made
    store.close()


def test_a_deleted_or_restored_delta_table_is_refused_and_a_resnapshot_heals_it(sync: Sync) -> None:
    sync.runner().snapshot()
    sync.merge()
    sync.workload()
    sync.runner().catch_up()
    assert sync.merge().seq == 2
    sync.assert_equal()

    # Deleted between runs: the next catch-up must not rebuild it from one window's rows.
    shutil.rmtree(sync.delta / A)
    versions_b = [c["version"] for c in delta_history(sync.delta / B)]
    sync.workload()
    sync.runner().catch_up()
    with pytest.raises(TargetIntegrityError) as refused:
        sync.merge()
    message = str(refused.value)
    assert f"table '{A}': the Delta table at {sync.delta / A} is missing" in message
    assert "this sync last merged window 2 into it" in message
    assert f'{{"resnapshot_tables": ["{A}"]}}' in message and "nothing was written" in message
    assert not (sync.delta / A).exists()
    assert [c["version"] for c in delta_history(sync.delta / B)] == versions_b  # untouched
    stuck = sync.store.open_window(sync.spec.sync_id)
    assert stuck is not None and (stuck.seq, stuck.state) == (3, WindowState.STAGED)

    # The way out: re-snapshot that table. It discards the stuck window (not merged, so its
    # changes are read again by the next catch-up) and rebuilds the table.
    sync.runner().snapshot(tables=[A])
    discarded = sync.store.window(sync.spec.sync_id, 3)
    assert discarded.state is WindowState.FAILED and "discarded by a re-snapshot of ['ops_a']" in (
        discarded.error or ""
    )
    assert sync.merge().kind is WindowKind.SNAPSHOT
    sync.runner().catch_up()
    sync.merge()
    sync.assert_equal()

    # Rolled back with RESTORE (Delta keeps the sync's transaction version through it).
    spark_session().sql(f"RESTORE TABLE delta.`{sync.delta / B}` TO VERSION AS OF 0")
    sync.workload()
    sync.runner().catch_up()
    with pytest.raises(
        TargetIntegrityError, match=rf"table '{B}'.*was restored to an earlier version \(RESTORE"
    ):
        sync.merge()
    sync.runner().snapshot(tables=[B])
    sync.merge()
    sync.runner().catch_up()
    sync.merge()
    sync.assert_equal()


def test_a_changed_key_asks_for_a_resnapshot_and_windows_merge_with_their_own_key(sync: Sync) -> None:
    sync.runner().snapshot()
    sync.merge()
    sync.workload()
    by_code = {A: KeyOverrides(source_unique_key_columns=("code",))}
    with pytest.raises(KeyChangedError) as refused:
        sync.runner(key_overrides=by_code).catch_up()
    message = str(refused.value)
    assert f"table '{A}': its key is now ['code']" in message
    assert "its Delta table was built with key ['id']" in message
    assert f'{{"resnapshot_tables": ["{A}"]}}' in message
    assert sync.store.open_window(sync.spec.sync_id) is None  # refused before planning a window

    # A window staged with the old key keeps it for its merge, even after the key changed.
    sync.runner().catch_up()
    sync.runner(key_overrides=by_code).snapshot(tables=[A])  # re-snapshot with the new key...
    staged = sync.store.window(sync.spec.sync_id, 2)
    assert staged.state is WindowState.FAILED  # ...discards the unmerged window first
    sync.merge()
    assert json.loads(json.dumps(sync.store.sync_config(sync.spec.sync_id)["keys"][A]))["source_columns"] == [
        "code"
    ]
    sync.workload()
    sync.runner(key_overrides=by_code).catch_up()
    window = sync.store.open_window(sync.spec.sync_id)
    assert window is not None and window.stats["keys"][A]["source_columns"] == ["code"]
    assert window.stats["keys"][B]["source_columns"] == ["id"]
    sync.merge()
    sync.assert_equal()


# A refused read names the tablet type it asked for: vtgate's "failed to find a REPLICA tablet",
# or the stop-position probe's own error once vtgate has given no position by its timeout.
NO_REPLICA = r"REPLICA tablet"
PROBE_TIMEOUT = 15.0


# On a cluster started moments before, the RDONLY tablet's schema may not list the tables the
# fixture just created: vttablet refuses the stream ("table ops_a is not present in the
# database") until it reloads it. A snapshot that fails so is resumed by the next attempt.
NOT_YET_IN_SCHEMA = "is not present in the database"


def _once_rdonly_has_the_tables(read: Callable[[], T], within: float = 90.0) -> T:
    deadline = time.monotonic() + within
    while True:
        try:
            return read()
        except VStreamError as exc:
            if NOT_YET_IN_SCHEMA not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


def test_every_read_uses_the_connections_tablet_type(
    vitess: LocalVitess, sync: Sync, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vttestserver's vtcombo offers VStream an RDONLY tablet of each shard but no REPLICA one
    # ("failed to find a REPLICA tablet"). A read that honours the connection's tablet type
    # fails on REPLICA naming it (one that ignored it would read the PRIMARY and succeed), and
    # a whole sync reads from RDONLY.
    for tablet_type in ("REPLICA", "RDONLY"):
        name, value = connection_uri_env(f"vitess_{tablet_type.lower()}", vitess, tablet_type=tablet_type)
        monkeypatch.setenv(name, value)
    # vtgate holds a REPLICA stream open waiting for a tablet that never comes: the probe's 60 s
    # default (for a slow link) would only make each refused read wait longer to fail the same.
    monkeypatch.setattr(
        capture_run,
        "capture_stop_position",
        functools.partial(capture_stop_position, timeout=PROBE_TIMEOUT),
    )
    replica = CaptureRunner(VitessHook("vitess_replica"), sync.store, sync.spec, holder="test-replica")
    with pytest.raises(VStreamError, match=NO_REPLICA):
        replica.snapshot()
    rdonly = CaptureRunner(VitessHook("vitess_rdonly"), sync.store, sync.spec, holder="test-rdonly")
    _once_rdonly_has_the_tables(rdonly.snapshot)
    sync.merge()
    sync.workload()
    with pytest.raises(VStreamError, match=NO_REPLICA):
        replica.catch_up()
    rdonly.catch_up()
    sync.merge()
    sync.assert_equal()


def test_a_change_no_window_can_stage_is_left_behind_by_a_resnapshot_of_every_table(
    hook: VitessHook, tmp_path: Path
) -> None:
    # The wedge: a zero date reaches the binlog while the sync streams with zero_date_policy
    # "error". Fixing the row at the source does not fix the binlog event, so every catch-up
    # fails on it again. Re-snapshotting every table discards the stuck window and makes the
    # copy's end the new position, past that event.
    table = "ops_dates"
    execute(hook, f"CREATE TABLE IF NOT EXISTS commerce.{table} (id BIGINT NOT NULL PRIMARY KEY, d DATE)")
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(
        f"wedge-{uuid.uuid4().hex[:8]}",
        "commerce",
        (table,),
        str(tmp_path / "stage"),
        zero_dates=ZeroDatePolicies(ZeroDatePolicy.ERROR),
    )
    sync = Sync(hook, tmp_path, spec, store, random.Random(spec.sync_id))
    row = sync.rng.randrange(1, 2**40)
    sync.runner().snapshot()
    sync.merge()
    raw = hook.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
        cursor.execute(f"INSERT INTO commerce.{table} (id, d) VALUES (%s, '0000-00-00')", (row,))
        raw.commit()
    finally:
        raw.invalidate()
    with pytest.raises(ZeroDateError):
        sync.runner().catch_up()
    execute(hook, f"UPDATE commerce.{table} SET d = '2020-01-01' WHERE id = {row}")  # fixed at the source
    with pytest.raises(ZeroDateError):
        sync.runner().catch_up()  # ...but the binlog still holds the zero date
    stuck = store.open_window(spec.sync_id)
    assert stuck is not None and stuck.state is WindowState.PLANNED

    sync.runner().snapshot(tables=[table])  # the resnapshot_tables param of the DAG, every table
    assert store.window(spec.sync_id, stuck.seq).state is WindowState.FAILED
    assert sync.merge().kind is WindowKind.SNAPSHOT
    sync.runner().catch_up()  # from the copy's end: the zero date is behind it
    sync.merge()
    sync.assert_equal()
    store.close()


def test_a_resnapshot_after_an_incompatible_type_change_heals_the_table(
    hook: VitessHook, tmp_path: Path
) -> None:
    """VARCHAR -> INT while the sync streams, with changes on both sides of the DDL: the catch-up
    is refused naming the remedy, and a re-snapshot of that table alone heals it. The
    other table keeps its position, so the next catch-up reads the typed table's pre-DDL
    changes again: they are behind its copy and must not reach it (they did, every run)."""
    table = "ops_typed"
    execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{table}",
        f"CREATE TABLE commerce.{table} (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(16))",
        f"INSERT INTO commerce.{table} VALUES (1, '10'), (2, '20'), (3, '30')",
    )
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"typed-{uuid.uuid4().hex[:8]}", "commerce", (table, B), str(tmp_path / "stage"))
    sync = Sync(hook, tmp_path, spec, store, random.Random(spec.sync_id))
    sync.runner().snapshot()
    sync.merge()
    before_ddl = [
        f"UPDATE commerce.{table} SET v = '11' WHERE id = 1",
        f"INSERT INTO commerce.{table} VALUES (4, '40')",
        f"DELETE FROM commerce.{table} WHERE id = 3",
        f"INSERT INTO commerce.{B} (id, note) VALUES ({sync.rng.randrange(1, 2**40)}, 'before')",
    ]
    execute(hook, *before_ddl)
    execute(
        hook,
        f"ALTER TABLE commerce.{table} MODIFY v INT",
        f"UPDATE commerce.{table} SET v = v + 1 WHERE id = 2",
        f"INSERT INTO commerce.{table} VALUES (5, 50)",
        f"INSERT INTO commerce.{B} (id, note) VALUES ({sync.rng.randrange(1, 2**40)}, 'after')",
    )
    # Without schema history, vttablet cannot name the columns of rows logged before the DDL.
    for _ in range(2):  # the same error, run after run: only the remedy moves it
        with pytest.raises(UnnamedColumnsError) as refused:
            sync.runner().catch_up()
        message = str(refused.value)
        assert f"table '{table}': vtgate sent its rows with columns named ['@1', '@2']" in message
        assert f'{{"resnapshot_tables": ["{table}"]}}' in message and "Nothing was staged" in message

    sync.runner().snapshot(tables=[table])  # the remedy the error names
    assert sync.merge().kind is WindowKind.SNAPSHOT
    execute(
        hook,
        f"UPDATE commerce.{table} SET v = 99 WHERE id = 4",
        f"INSERT INTO commerce.{B} (id, note) VALUES ({sync.rng.randrange(1, 2**40)}, 'later')",
    )
    caught_up = sync.runner().catch_up()
    # The typed table's changes behind its copy were read again and left out; its later one was not.
    assert {t: tm.rows for t, tm in caught_up.manifest.tables.items()} == {table: 1, B: 3}
    sync.merge()
    sync.assert_equal()
    execute(hook, f"UPDATE commerce.{table} SET v = 7 WHERE id = 5")
    sync.runner().catch_up()
    sync.merge()
    sync.assert_equal()
    assert store.sync_config(spec.sync_id).get("copied_at", {}) == {}  # the copy is behind the position now
    store.close()


def test_a_snapshot_never_replaces_a_delta_table_another_writer_made(sync: Sync, tmp_path: Path) -> None:
    """A Delta table at the target that this sync never wrote: another program's, then another
    sync's (two syncs pointed at one target). The snapshot is refused naming it; the table is
    left as it was; pointed elsewhere, the sync runs."""
    spark = spark_session()
    spark.createDataFrame([(1, "someone else's row")], "id BIGINT, note STRING").write.format("delta").save(
        str(sync.delta / A)
    )
    sync.runner().snapshot()
    with pytest.raises(TargetIntegrityError) as refused:
        sync.merge()
    message = str(refused.value)
    assert f"table '{A}': the Delta table at {sync.delta / A} already exists (Delta version 0)" in message
    assert "holds no window of this sync: another sync or program wrote it" in message
    assert "nothing was written" in message and "another target (target_location" in message
    assert [c["version"] for c in delta_history(sync.delta / A)] == [0]
    assert spark.read.format("delta").load(str(sync.delta / A)).collect()[0]["note"] == "someone else's row"
    assert not (sync.delta / B).exists()  # the plan's other table: not written either

    # A second sync of the same tables pointed at the first one's target, once that one ran.
    shutil.rmtree(sync.delta / A)
    assert sync.merge().seq == 1
    sync.assert_equal()
    other_spec = replace(
        sync.spec, sync_id=f"{sync.spec.sync_id}-other", staging_location=str(tmp_path / "s2")
    )
    other_store = CheckpointStore(f"sqlite:///{tmp_path / 'other.db'}")
    other_store.migrate()
    try:
        CaptureRunner(sync.hook, other_store, other_spec, holder="test-ops-other").snapshot()
        versions = {t: [c["version"] for c in delta_history(sync.delta / t)] for t in (A, B)}
        with pytest.raises(TargetIntegrityError, match=rf"table '{A}': .* another sync or program wrote it"):
            MergeRunner(other_store, other_spec.sync_id, str(sync.delta), holder="test-ops-other").run(
                lambda plan: merge(spark_session(), plan)
            )
        assert {t: [c["version"] for c in delta_history(sync.delta / t)] for t in (A, B)} == versions
    finally:
        other_store.close()
    sync.assert_equal()


def test_a_type_the_target_cannot_take_is_refused_and_the_resnapshot_it_names_heals_the_table(
    hook: VitessHook, tmp_path: Path
) -> None:
    """VARCHAR -> INT with every change after the DDL (so the window stages): the merge refuses
    (``MergeSchemaError``: Delta cannot turn a string column into an int), run after run, with
    the window STAGED; the re-snapshot it names discards that window and rebuilds the table, and
    the other table reads its changes of the discarded window again: Delta == ``SELECT *``."""
    table = "remedy_ops_typed"
    execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{table}",
        f"CREATE TABLE commerce.{table} (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(16))",
        f"INSERT INTO commerce.{table} VALUES (1, '10'), (2, '20'), (3, '30')",
    )
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"remedy-typed-{uuid.uuid4().hex[:8]}", "commerce", (table, B), str(tmp_path / "stage"))
    sync = Sync(hook, tmp_path, spec, store, random.Random(spec.sync_id))
    sync.runner().snapshot()
    sync.merge()
    execute(
        hook,
        f"ALTER TABLE commerce.{table} MODIFY v INT",
        f"UPDATE commerce.{table} SET v = v + 1 WHERE id = 2",
        f"INSERT INTO commerce.{table} VALUES (5, 50)",
        f"INSERT INTO commerce.{B} (id, note) VALUES ({sync.rng.randrange(1, 2**40)}, 'typed')",
    )
    stuck = sync.runner().catch_up()
    for _ in range(2):  # the same error, run after run: only the remedy moves it
        with pytest.raises(MergeSchemaError) as refused:
            sync.merge()
        message = str(refused.value)
        assert f"table '{table}' column 'v': the staged type int" in message, message
        assert "cannot be written to string" in message
        assert f'{{"resnapshot_tables": ["{table}"]}}' in message
    assert store.window(spec.sync_id, stuck.seq).state is WindowState.STAGED

    sync.runner().snapshot(tables=[table])  # the remedy the error names
    assert store.window(spec.sync_id, stuck.seq).state is WindowState.FAILED
    assert sync.merge().kind is WindowKind.SNAPSHOT
    sync.runner().catch_up()  # B's change of the discarded window, read again
    sync.merge()
    sync.assert_equal()
    execute(hook, f"DROP TABLE IF EXISTS commerce.{table}")
    store.close()


def test_a_table_that_joined_is_refused_by_a_catch_up_and_the_resnapshot_it_names_heals(
    hook: VitessHook, tmp_path: Path
) -> None:
    """A table added to a streaming sync, met first by a catch-up (a DAG of one's own without a
    snapshot task): refused (``TableListChangedError``) naming the trigger conf, in JSON as the
    trigger form takes it; doing that gives Delta == ``SELECT *`` for both tables."""
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    spec = SyncSpec(f"remedy-joined-{uuid.uuid4().hex[:8]}", "commerce", (B,), str(tmp_path / "stage"))
    sync = Sync(hook, tmp_path, spec, store, random.Random(spec.sync_id))
    sync.runner().snapshot()
    sync.merge()
    sync.spec = replace(spec, tables=(A, B))  # the DAG's tables now
    sync.workload()
    with pytest.raises(TableListChangedError) as refused:
        sync.runner().catch_up()
    message = str(refused.value)
    assert f"table(s) ['{A}'] joined the sync's tables" in message, message
    assert f'trigger it with {{"resnapshot_tables": ["{A}"]}}' in message, message
    assert json.loads(message.split("trigger it with ", 1)[1]) == {"resnapshot_tables": [A]}
    assert store.open_window(spec.sync_id) is None  # nothing was read

    sync.runner().snapshot(tables=json.loads(message.split("trigger it with ", 1)[1])["resnapshot_tables"])
    assert sync.merge().kind is WindowKind.SNAPSHOT
    sync.workload()
    sync.runner().catch_up()
    sync.merge()
    sync.assert_equal((A, B))
    store.close()
