"""Remedies the product names, followed from the error to a Delta table equal to ``SELECT *``.

Each case makes the condition on the real cluster (vtgate, the sharded ``customer`` keyspace),
asserts that the error names its remedy, does exactly what the text says, and ends with the
target equal to ``SELECT *`` through vtgate. The capture and merge run through the runners the
operators drive (``CaptureRunner``, ``GroupedSnapshot``, ``MergeRunner``), the merges on the
session's Spark Connect server: no DAG per case, none of these remedies is about Airflow.

* a snapshot copied by shard groups, resumed by one process (``capture_parallelism`` removed);
* a catch-up while a snapshot window is unmerged, and a re-snapshot while a catch-up window is
  merged but not committed ("finish it before a ...");
* a table whose target mode changed (``TargetModeChangedError``): a new target location and a
  re-snapshot;
* a widened column on a Delta without type widening (``DeltaFeatureError``): a re-snapshot;
* a column added with a DEFAULT, NULL in the rows the binlog did not touch: a re-snapshot;
* a table without a usable key (``KeyChoiceError``): ``allow_all_columns_key=True``;
* a ``history`` table whose past value does not survive the re-snapshot's new type: a new
  target location;
* a grouped catch-up whose group failed ("nothing staged to merge ... still being read"): the
  failed map index cleared, then the merge;
* a source column named like a metadata column (``TargetModeError``): another ``metadata_prefix``;
* a checkpoint store restored from an older backup: the store that wrote the tables.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import SparkRuntimeException

from airflow_provider_vitess.capture.group_snapshot import GroupedSnapshot
from airflow_provider_vitess.capture.groups import GroupedCatchUp
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import (
    STORE_REMEDY,
    CheckpointError,
    DeltaFeatureError,
    KeyChoiceError,
    MergeSchemaError,
    StagingError,
    TargetIntegrityError,
    TargetModeChangedError,
    TargetModeError,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job import connect, delta_features
from airflow_provider_vitess.merge.modes import ModeOptions
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner, build_plan
from airflow_provider_vitess.staging.files import window_dir
from tests.support import merge_workload as wl
from tests.support.local import LocalVitess
from tests.support.mode_oracles import assert_history, delta_dicts, source_dicts

pytestmark = pytest.mark.integration

GROUPED, STAGED, MODE, SIDE = "rem2_grouped", "rem2_staged", "rem2_mode", "rem2_side"


def _create(hook: VitessHook, table: str, rows: int = 40, more_columns: str = "") -> None:
    """``table`` sharded by hash(id) (rows on both shards), ``rows`` rows; ``more_columns`` (DDL
    after ``note``) NULL in each."""
    columns = f"(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(32){more_columns})"
    wl.create_sharded_table(hook, table, columns, "id")
    values = ", ".join(f"({i}, 'row {i}')" for i in range(1, rows + 1))
    wl.execute(hook, f"INSERT INTO customer.{table} (id, note) VALUES {values}")


def _change(hook: VitessHook, table: str, tag: str) -> None:
    """An update, a delete and an insert of ``table``."""
    wl.execute(
        hook,
        f"UPDATE customer.{table} SET note = '{tag}' WHERE id IN (2, 3)",
        f"DELETE FROM customer.{table} WHERE id = 5",
        f"INSERT INTO customer.{table} (id, note) VALUES ({1000 + len(tag)}, '{tag} new')",
    )


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    hook = wl.hook_for(vitess, "vitess_rem2")
    yield hook
    made = (
        GROUPED,
        STAGED,
        MODE,
        SIDE,
        WIDEN,
        DEFAULTED,
        KEYLESS,
        NARROWED,
        PARTED,
        CLASHED,
        RESTORED,
        UNSTAGED,
    )
    for table in made:
        wl.execute(hook, f"DROP TABLE IF EXISTS customer.{table}")


@dataclass
class Sync:
    """One sync of ``tables``: its store, staging and Delta root, run as the operators run it."""

    hook: VitessHook
    spark_connect: str
    root: Path
    tables: tuple[str, ...]
    sync_id: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # SyncSpec's, as the DAG gives them

    def __post_init__(self) -> None:
        self.sync_id = self.sync_id or f"rem2-{uuid.uuid4().hex[:8]}"
        self.use_store(self.root / "store.db")
        self.delta = self.root / "delta"

    def use_store(self, path: Path) -> None:
        """The sync's ``checkpoint_conn_id`` names the SQLite file ``path``."""
        self.store = CheckpointStore(f"sqlite:///{path}")
        self.store.migrate()

    def spec(self) -> SyncSpec:
        return SyncSpec(self.sync_id, "customer", self.tables, str(self.root / "stage"), **self.options)

    def runner(self) -> CaptureRunner:
        return CaptureRunner(self.hook, self.store, self.spec(), holder="test-rem2")

    def grouped(self) -> GroupedSnapshot:
        return GroupedSnapshot(self.hook, self.store, self.spec(), holder="test-rem2-groups")

    def grouped_catch_up(self) -> GroupedCatchUp:
        return GroupedCatchUp(self.hook, self.store, self.spec(), holder="test-rem2-groups")

    def snapshot_task(self, resnapshot_tables: tuple[str, ...] = ()) -> int:
        """What the snapshot task does (``resnapshot_tables``: the DAG run's conf)."""
        run = self.runner()
        need = run.snapshot_need(resnapshot_tables)
        return run.snapshot(tables=need.tables, need=need).seq

    def submit(self, plan: MergePlan) -> MergeReport:
        return connect.run_merge(self.spark_connect, plan)

    def merge(
        self, targets: Mapping[str, Mapping[str, Any]] | None = None, modes: ModeOptions | None = None
    ) -> MergeOutcome:
        """What a merge task does: its targets (``targets`` and the sync-wide ``modes`` as the DAG
        gives them)."""
        runner = MergeRunner(
            self.store, self.sync_id, str(self.delta), targets, holder="test-rem2-merge", modes=modes
        )
        return runner.run(self.submit)

    def assert_exact(self, table: str, path: Path | None = None, key: tuple[str, ...] = ("id",)) -> int:
        with connect.remote_sessions(self.spark_connect) as new_session:
            spark = new_session()
            where = str(path or self.delta / table)
            return wl.assert_equal_to_source(spark, self.hook, "customer", table, where, list(key))


@pytest.fixture
def sync_of(hook: VitessHook, spark_connect: str, tmp_path: Path) -> Any:
    return lambda *tables: Sync(hook, spark_connect, tmp_path, tables)


def test_a_grouped_snapshot_resumed_by_one_process_heals_with_capture_parallelism_back(
    hook: VitessHook, sync_of: Any
) -> None:
    """``plan_snapshot`` with ``capture_parallelism=2`` and one group copied; then the DAG loses
    its ``capture_parallelism`` and the one-process snapshot task is refused. The remedy: the
    parallelism back until the snapshot is merged (the groups resume), removed afterwards."""
    _create(hook, GROUPED)
    sync = sync_of(GROUPED)
    assert sync.grouped().plan_snapshot(2) == [0, 1]
    sync.grouped().copy_group(0)
    _change(hook, GROUPED, "during")  # between the two groups' copies

    with pytest.raises(CheckpointError) as refused:
        sync.snapshot_task()
    text = str(refused.value)
    assert f"sync {sync.sync_id!r} snapshot window 1 is copied by shard groups" in text, text
    assert "give the DAG its capture_parallelism back until this snapshot is merged" in text, text
    assert [p.state for p in sync.store.window_groups(sync.sync_id, 1)] == [
        WindowState.STAGED,
        WindowState.PLANNED,
    ]

    # capture_parallelism=2 back: plan_snapshot, every group mapped, merge_snapshot.
    groups = sync.grouped().plan_snapshot(2)
    assert groups == [0, 1]
    assert [sync.grouped().copy_group(g)["status"] for g in groups] == ["already staged", "staged"]
    assert sync.merge().seq == 1  # each group's shards as of its own copy
    # Removed afterwards: one process streams on, from each group's copy end.
    _change(hook, GROUPED, "after the snapshot")
    sync.runner().catch_up()
    assert sync.merge().seq == 2
    assert sync.assert_exact(GROUPED) == 41  # 40, one deleted, two inserted


def test_a_catch_up_before_its_snapshot_is_merged_and_a_resnapshot_before_a_commit_heal_as_the_errors_say(
    hook: VitessHook, sync_of: Any
) -> None:
    """Windows never interleave. A catch-up while the snapshot window is STAGED (its merge failed
    or has not run) is refused naming the task that finishes it (before, it named the snapshot
    task, whose rerun hands the same window back: refused again). Then a merge killed after its
    Delta commit and its MERGED mark, before the checkpoint's commit: a re-snapshot is refused
    naming the merge task. Doing what each says, the refused task runs, exact."""
    _create(hook, STAGED)
    sync = sync_of(STAGED)
    sync.snapshot_task()
    _change(hook, STAGED, "before the merge")
    with pytest.raises(CheckpointError) as refused:
        sync.runner().catch_up()
    text = str(refused.value)
    assert f"sync {sync.sync_id!r} has an unfinished snapshot window 1 (STAGED)" in text, text
    assert "finish it before a catchup: its merge task (merge_snapshot) commits it" in text, text
    assert sync.merge().seq == 1  # what it says
    seq = sync.runner().catch_up().seq

    sync.submit(build_plan(sync.store, sync.sync_id, sync.store.window(sync.sync_id, seq), str(sync.delta)))
    sync.store.mark_merged(sync.sync_id, seq)  # killed here, before the commit
    _change(hook, STAGED, "and then")
    with pytest.raises(CheckpointError) as refused:
        sync.snapshot_task((STAGED,))
    text = str(refused.value)
    assert f"has an unfinished catchup window {seq} (MERGED)" in text, text
    assert (
        "finish it before a snapshot: its merge task (merge; follow in a DAG with follow_seconds) commits it"
        in text
    ), text
    assert sync.merge().seq == seq  # what it says: the merge task, rerun
    assert sync.snapshot_task((STAGED,)) == seq + 1
    assert sync.merge().seq == seq + 1
    assert sync.assert_exact(STAGED) == 41  # 40, one deleted, two inserted


def test_a_target_mode_change_heals_with_a_new_target_location_and_a_resnapshot(
    hook: VitessHook, sync_of: Any
) -> None:
    """A table built in ``soft_delete`` whose DAG now asks ``mirror``: refused, nothing written.
    The remedy the error names: a new target location for the table and a re-snapshot of it;
    the other table of the sync loses none of the refused window's changes."""
    _create(hook, MODE)
    _create(hook, SIDE, rows=10)
    sync = sync_of(MODE, SIDE)
    built = {MODE: {"mode": "soft_delete"}}
    sync.snapshot_task()
    sync.merge(built)
    _change(hook, MODE, "refused")
    _change(hook, SIDE, "side")
    sync.runner().catch_up()
    asked = {MODE: {"mode": "mirror"}}
    with pytest.raises(TargetModeChangedError) as refused:
        sync.merge(asked)
    text = str(refused.value)
    assert "was built in mode 'soft_delete'" in text and "asks for mode 'mirror'" in text, text
    assert "give the table a new target location (its entry in targets, or target_location)" in text, text
    assert f'{{"resnapshot_tables": ["{MODE}"]}}' in text, text

    moved = sync.root / "elsewhere" / MODE
    asked = {MODE: {"mode": "mirror", "path": str(moved)}}
    sync.snapshot_task((MODE,))
    sync.merge(asked)
    _change(hook, MODE, "after the remedy")
    sync.runner().catch_up()
    sync.merge(asked)
    assert sync.assert_exact(MODE, moved) == 41  # 40, one deleted, two inserted
    assert sync.assert_exact(SIDE) == 10


WIDEN = "rem2_widen"


def test_a_widened_column_without_type_widening_heals_with_a_resnapshot(
    hook: VitessHook, sync_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DeltaFeatureError`` on a Delta without type widening (Delta 3, Spark 3.5; the session's
    Delta line is read as 3 here, the server runs Delta 4) for a table given ``type_widening``
    (without it the merge rewrites the table with the wider type): the remedy it names, a
    re-snapshot of the table, rewrites it with the new type without widening a column in place,
    and the sync streams on. In ``history``, whose re-snapshot keeps the past (cast to the new type): the
    mode where the rewrite could have needed the widening the error is about."""
    # qty comes with the table, not by an ALTER right after its CREATE: vtgate's schema tracker
    # once kept the table without it (CI: "column 'qty' not found" at the UPDATE below).
    _create(hook, WIDEN, rows=6, more_columns=", qty INT")
    sync = sync_of(WIDEN)
    targets = {WIDEN: {"mode": "history", "table_features": ["type_widening"]}}
    sync.snapshot_task()
    sync.merge(targets)
    wl.execute(
        hook,
        f"UPDATE customer.{WIDEN} SET qty = 1 WHERE id = 1",
        f"ALTER TABLE customer.{WIDEN} MODIFY qty BIGINT",
        f"UPDATE customer.{WIDEN} SET qty = 5000000000 WHERE id = 2",
    )
    sync.runner().catch_up()
    monkeypatch.setattr(delta_features, "delta_major", lambda _spark: 3)
    widening = r"qty int -> bigint.*needs Delta Lake type widening"
    with pytest.raises(DeltaFeatureError, match=widening) as refused:
        sync.merge(targets)
    assert f're-snapshot the table (trigger the DAG with {{"resnapshot_tables": ["{WIDEN}"]}})' in str(
        refused.value
    )

    sync.snapshot_task((WIDEN,))  # what it says: a run with resnapshot_tables
    sync.merge(targets)
    _change(hook, WIDEN, "after the remedy")
    sync.runner().catch_up()
    sync.merge(targets)
    with connect.remote_sessions(sync.spark_connect) as new_session:
        spark = new_session()
        schema = spark.read.format("delta").load(str(sync.delta / WIDEN)).schema
        assert schema["qty"].dataType.simpleString() == "bigint", schema
        rows = delta_dicts(sync.delta / WIDEN, spark)
    assert_history(WIDEN, rows, source_dicts(hook, "customer", WIDEN))
    assert any(not r["_vitess_current"] for r in rows), "the past was kept"


DEFAULTED, KEYLESS, NARROWED, PARTED = "rem2_defaulted", "rem2_keyless", "rem2_narrowed", "rem2_parted"


def test_a_column_added_with_a_default_is_filled_in_by_the_resnapshot_the_docs_name(
    hook: VitessHook, sync_of: Any
) -> None:
    """``ADD COLUMN ... DEFAULT``: MySQL fills the existing rows without a binlog row event, so
    the rows no later change touched keep NULL in Delta (the documented symptom, shown). The
    remedy in the docs: re-snapshot the table; then exact, and the sync streams on."""
    _create(hook, DEFAULTED, rows=10)
    sync = sync_of(DEFAULTED)
    sync.snapshot_task()
    sync.merge()
    wl.execute(hook, f"ALTER TABLE customer.{DEFAULTED} ADD COLUMN tier INT NOT NULL DEFAULT 7")
    _change(hook, DEFAULTED, "after the add")
    sync.runner().catch_up()
    sync.merge()
    with pytest.raises(AssertionError, match=r"column 'tier': Delta None != source 7"):
        sync.assert_exact(DEFAULTED)  # rows 1, 4, 6-10: tier NULL in Delta, 7 at the source

    sync.snapshot_task((DEFAULTED,))  # what the docs say
    sync.merge()
    assert sync.assert_exact(DEFAULTED) == 10  # 10, one deleted, one inserted
    _change(hook, DEFAULTED, "after the remedy")
    sync.runner().catch_up()
    sync.merge()
    assert sync.assert_exact(DEFAULTED) == 11


def test_a_table_without_a_usable_key_heals_with_allow_all_columns_key(
    hook: VitessHook, sync_of: Any
) -> None:
    """A table with neither a PRIMARY KEY nor a UNIQUE KEY on NOT NULL columns: the snapshot is
    refused before anything is copied, naming ``allow_all_columns_key=True`` among the remedies.
    Given it, rows are identified by all their columns: an update is a delete and an insert of
    that identity, and the table is exact."""
    wl.create_sharded_table(hook, KEYLESS, "(id BIGINT NOT NULL, note VARCHAR(32))", "id")
    values = ", ".join(f"({i}, 'row {i}')" for i in range(1, 11))
    wl.execute(hook, f"INSERT INTO customer.{KEYLESS} (id, note) VALUES {values}")
    sync = sync_of(KEYLESS)
    with pytest.raises(KeyChoiceError, match="pass allow_all_columns_key=True"):
        sync.snapshot_task()
    assert sync.store.open_window(sync.sync_id) is None, "refused before a window was planned"

    sync.options["allow_all_columns_key"] = True  # what it says
    sync.snapshot_task()
    sync.merge()
    _change(hook, KEYLESS, "keyless")
    sync.runner().catch_up()
    sync.merge()
    assert sync.assert_exact(KEYLESS, key=("id", "note")) == 10  # 10, one deleted, one inserted


def test_a_history_past_that_does_not_survive_the_new_type_heals_with_a_new_target_location(
    hook: VitessHook, sync_of: Any
) -> None:
    """``history`` keeps its past through a re-snapshot after a type change, cast to the new type
    losslessly or not at all: VARCHAR -> INT with a closed version holding 'abc'. The catch-up's
    merge names the re-snapshot (``MergeSchemaError``); the re-snapshot's merge then names the
    value that cannot be kept and the way out, a new target location; followed, the table there
    is exact and the old one stays as it was."""
    wl.create_sharded_table(hook, NARROWED, "(id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(16))", "id")
    wl.execute(hook, f"INSERT INTO customer.{NARROWED} (id, v) VALUES (1, 'abc'), (2, '20'), (3, '30')")
    sync = sync_of(NARROWED)
    targets: dict[str, dict[str, Any]] = {NARROWED: {"mode": "history"}}
    sync.snapshot_task()
    sync.merge(targets)
    wl.execute(hook, f"UPDATE customer.{NARROWED} SET v = '12' WHERE id = 1")  # 'abc' is the past now
    sync.runner().catch_up()
    sync.merge(targets)
    wl.execute(
        hook,
        f"ALTER TABLE customer.{NARROWED} MODIFY v INT",
        f"INSERT INTO customer.{NARROWED} (id, v) VALUES (4, 40)",
    )
    sync.runner().catch_up()
    with pytest.raises(MergeSchemaError, match=f'resnapshot_tables": \\["{NARROWED}"\\]'):
        sync.merge(targets)
    sync.snapshot_task((NARROWED,))  # what it says
    old_log = sorted(p.name for p in (sync.delta / NARROWED / "_delta_log").glob("*.json"))
    survive = "value 'abc' of an earlier version or deleted row does not survive"
    with pytest.raises(SparkRuntimeException, match=survive) as lost:  # the job's raise_error
        sync.merge(targets)
    assert "Give the table a new target location (targets[table]['path']" in str(lost.value)
    assert sorted(p.name for p in (sync.delta / NARROWED / "_delta_log").glob("*.json")) == old_log

    moved = sync.root / "elsewhere" / NARROWED
    targets = {NARROWED: {"mode": "history", "path": str(moved)}}
    sync.merge(targets)  # what it says: the DAG run again, the snapshot merged there
    wl.execute(hook, f"UPDATE customer.{NARROWED} SET v = 41 WHERE id = 4")
    sync.runner().catch_up()
    sync.merge(targets)
    with connect.remote_sessions(sync.spark_connect) as new_session:
        rows = delta_dicts(moved, new_session())
    assert_history(NARROWED, rows, source_dicts(hook, "customer", NARROWED))
    assert any(not r["_vitess_current"] for r in rows), "the new table's own past (id 4's 40)"


def test_a_grouped_catch_up_whose_group_failed_merges_once_that_map_index_is_cleared(
    hook: VitessHook, sync_of: Any
) -> None:
    """``capture_parallelism=2``: ``plan_catch_up`` maps two groups, group 1's ``catch_up``
    fails. The merge answers "nothing staged to merge ... still being read (PLANNED)", naming the
    task; the remedy, that map index cleared (group 0's part is kept), then the merge: exact."""
    _create(hook, PARTED)
    sync = sync_of(PARTED)
    sync.snapshot_task()
    sync.merge()
    _change(hook, PARTED, "grouped")
    assert sync.grouped_catch_up().plan(2) == [0, 1]
    sync.grouped_catch_up().read_group(0)  # group 1's task failed before it read
    outcome = sync.merge()
    assert outcome.seq is None and outcome.committed_seq == 1, outcome
    assert outcome.message == (
        "nothing staged to merge: catchup window 2 is still being read (PLANNED); its 'catch_up' task "
        "resumes it (clear that task in the run where it failed, or let the next run's task do it)"
    )
    sync.grouped_catch_up().read_group(1)  # what it says: the failed map index cleared
    parts = sync.store.window_groups(sync.sync_id, 2)
    assert [p.state for p in parts] == [WindowState.STAGED, WindowState.STAGED]
    assert sync.merge().seq == 2  # then the merge
    assert sync.assert_exact(PARTED) == 40  # 40, one deleted, one inserted


CLASHED = "rem2_clashed"


def test_a_source_column_named_like_a_metadata_column_heals_with_another_metadata_prefix(
    hook: VitessHook, sync_of: Any
) -> None:
    """A source column ``_vitess_deleted`` in a ``soft_delete`` target: the first merge is refused
    before the table exists, naming ``metadata_prefix``; given another prefix (the table's first
    window: not a mode change), the staged snapshot merges and the sync streams on: live rows ==
    ``SELECT *`` (the source's ``_vitess_deleted`` among their columns), the deleted key flagged."""
    wl.create_sharded_table(
        hook, CLASHED, "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(32), _vitess_deleted VARCHAR(8))", "id"
    )
    values = ", ".join(f"({i}, 'row {i}', 'src {i % 2}')" for i in range(1, 11))
    wl.execute(hook, f"INSERT INTO customer.{CLASHED} (id, note, _vitess_deleted) VALUES {values}")
    sync = sync_of(CLASHED)
    sync.snapshot_task()
    with pytest.raises(
        TargetModeError, match=r"source column\(s\) \['_vitess_deleted'\] have the names"
    ) as refused:
        sync.merge({CLASHED: {"mode": "soft_delete"}})
    assert "Give the sync another metadata_prefix (now '_vitess_')" in str(refused.value)
    assert not (sync.delta / CLASHED).exists(), "nothing was written"

    prefixed = ModeOptions(metadata_prefix="_cdc_")  # what it says (the sync's option)
    targets = {CLASHED: {"mode": "soft_delete"}}
    sync.merge(targets, prefixed)
    _change(hook, CLASHED, "prefixed")
    sync.runner().catch_up()
    sync.merge(targets, prefixed)
    with connect.remote_sessions(sync.spark_connect) as new_session:
        rows = delta_dicts(sync.delta / CLASHED, new_session())
    live = sorted((r["id"], r["note"], r["_vitess_deleted"]) for r in rows if not r["_cdc_deleted"])
    source = sorted(
        (r["id"], r["note"], r["_vitess_deleted"]) for r in source_dicts(hook, "customer", CLASHED)
    )
    assert live == source and len(source) == 10
    assert [r["id"] for r in rows if r["_cdc_deleted"]] == [5]


RESTORED = "rem2_restored"


def _restored_one_window_behind(hook: VitessHook, sync_of: Any, table: str) -> tuple[Sync, Path]:
    """``table`` snapshotted and merged, its store backed up, window 2 merged; then the sync on
    the backup (restored one window behind). Returns the sync and the store that wrote the tables."""
    _create(hook, table)
    sync = sync_of(table)
    sync.snapshot_task()
    sync.merge()
    shutil.copy(sync.root / "store.db", sync.root / "backup.db")
    _change(hook, table, "one")
    sync.runner().catch_up()
    assert sync.merge().seq == 2
    restored = sync.root / "restored.db"
    shutil.copy(sync.root / "backup.db", restored)
    sync.use_store(restored)
    return sync, sync.root / "store.db"


def test_a_store_restored_from_an_older_backup_is_refused_and_the_store_that_wrote_the_tables_heals(
    hook: VitessHook, sync_of: Any
) -> None:
    """The store is restored from a backup taken one window ago: it plans the next window with
    the number Delta already holds, which a merge would take for applied. The catch-up refuses
    (that number's staged files exist), naming the cause and the remedy; pointing the sync back
    at the store that wrote the tables, it streams on, exact."""
    sync, newer = _restored_one_window_behind(hook, sync_of, RESTORED)
    _change(hook, RESTORED, "second")
    with pytest.raises(StagingError) as refused:
        sync.runner().catch_up()
    text = str(refused.value)
    assert f"window {sync.sync_id}/2 has a manifest" in text and "restored from an older backup" in text, text
    assert STORE_REMEDY in text

    sync.use_store(newer)  # what it says: the store that wrote the tables
    sync.runner().catch_up()
    assert sync.merge().seq == 3
    assert sync.assert_exact(RESTORED) == 41  # 40, one deleted, two inserted


UNSTAGED = "rem2_unstaged"


def test_a_store_restored_from_an_older_backup_with_its_staging_gone_is_refused_not_taken_for_applied(
    hook: VitessHook, sync_of: Any
) -> None:
    """As above, but the staged files of the window the backup lacks are gone too (a new staging
    location, retention): the restored store plans that window's number again from its older
    position, and only the mark of the table's commit (``merge/job/marks.py``) tells the new
    window from the one merged. Without it the merge took the new window for applied and lost
    what it read past the old one (this test failed so). Refused naming the cause and the
    store's remedy; the store that wrote the tables then streams on, exact."""
    sync, newer = _restored_one_window_behind(hook, sync_of, UNSTAGED)
    shutil.rmtree(window_dir(str(sync.root / "stage"), sync.sync_id, 2))
    _change(hook, UNSTAGED, "second")
    assert sync.runner().catch_up().seq == 2  # nothing in the store or staging tells them apart
    with pytest.raises(TargetIntegrityError) as refused:
        sync.merge()
    text = str(refused.value)
    held = f"the Delta table at {sync.delta / UNSTAGED} holds window 2 of this sync from another read"
    assert f"table {UNSTAGED!r}: {held}" in text, text
    assert "restored from an older backup" in text and STORE_REMEDY in text, text

    sync.use_store(newer)  # what it says: the store that wrote the tables
    sync.runner().catch_up()
    assert sync.merge().seq == 3
    assert sync.assert_exact(UNSTAGED) == 41  # 40, one deleted, two inserted
