"""A column dropped or renamed at the source, through vtgate and the capture path, into real Delta.

After the first merged window without the column, no row of the Delta table has it, whether the
window touched the row or not (``merge.schema``'s docstring); a rename is a drop of the old name
and an add of the new one; a merge killed between the DROP's commit and the MERGE's, then rerun,
gives the table an uninterrupted merge gives; later windows drop nothing again.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.merge.job import apply
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from spark_jobs.merge_cdc import merge
from tests.support import merge_workload as wl
from tests.support.delta_check import delta_history, spark_session
from tests.support.local import LocalVitess
from tests.support.readers import (
    assert_column_mapped_table_reads_as_documented,
    assert_readers_see_what_spark_sees,
    renamed_physically,
)

pytestmark = pytest.mark.integration

DRIFT = "merge_drift"


class Killed(Exception):
    """Stands for the merge process dying after its schema commits, before the MERGE commit."""


def rows_of(
    session: SparkSession, path: Path, columns: Sequence[str] | None = None
) -> tuple[list[str], dict[int, tuple[Any, ...]]]:
    """The table's column names and its rows by id (each row's ``columns``, or all of them)."""
    df = session.read.format("delta").load(str(path))
    rows = df.collect()
    return df.schema.fieldNames(), {
        r["id"]: tuple(r) if columns is None else tuple(r[c] for c in columns) for r in rows
    }


def _create_drift_table(hook: Any, table: str, rows: int) -> None:
    """``table`` with the columns the tests drop (``gone``) and rename (``old_label``), ids 1..rows."""
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{table}",
        f"CREATE TABLE commerce.{table} (id INT NOT NULL PRIMARY KEY, name VARCHAR(20), gone INT, "
        "old_label VARCHAR(10))",
        f"INSERT INTO commerce.{table} VALUES "
        + ", ".join(f"({i}, 'n{i}', {i * 10}, 'l{i}')" for i in range(1, rows + 1)),
    )


def _column_mapping(path: Path) -> tuple[str | None, int]:
    """The table's column mapping mode and its protocol's reader version, as delta-rs reads them
    (reader version 2 is the one that brings column mapping; 3 lists it as a reader feature)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    return table.metadata().configuration.get("delta.columnMapping.mode"), table.protocol().min_reader_version


def test_a_dropped_or_renamed_column_is_gone_from_every_row_and_a_rerun_gives_the_same_table(
    vitess: LocalVitess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = spark_session()
    hook = wl.hook_for(vitess, "vitess_merge_drift")
    _create_drift_table(hook, DRIFT, 6)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(hook, store, tmp_path / "stage", f"drift-{uuid.uuid4().hex[:8]}", "commerce", [DRIFT])
    target, clean = tmp_path / "delta", tmp_path / "delta-clean"
    sync.capture(snapshot=True)
    merge(spark, sync.plan(target, 0, 1))
    shutil.copytree(target, clean)  # the same table, for a merge nobody interrupts

    # The DDL, then a window that touches rows 1 and 7 only: rows 2..6 keep their old files.
    wl.execute(
        hook,
        f"ALTER TABLE commerce.{DRIFT} DROP COLUMN gone, RENAME COLUMN old_label TO label",
        f"UPDATE commerce.{DRIFT} SET name = 'one', label = 'L1' WHERE id = 1",
        f"INSERT INTO commerce.{DRIFT} VALUES (7, 'n7', 'L7')",
        f"DELETE FROM commerce.{DRIFT} WHERE id = 6",
    )
    window = sync.capture()
    assert [s.names for s in window.tables[DRIFT].schemas] == [("id", "name", "label")]

    # Killed after the schema's commits, before the window's MERGE commit: nothing of the window
    # is in the table, the columns are already gone (the DROP is its own commit).
    def killed(*_: object, **__: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(apply, "run_merge", killed)
        with pytest.raises(Killed):
            merge(spark, sync.plan(target, 1, 2))
    names, rows = rows_of(spark, target / DRIFT)
    assert names == ["id", "name", "label"]
    assert rows[6] == (6, "n6", None) and 7 not in rows

    rerun = merge(spark, sync.plan(target, 1, 2)).windows[0].table(DRIFT)
    assert rerun.status is TableStatus.WRITTEN and rerun.schema_changes == ()
    uninterrupted = merge(spark, sync.plan(clean, 1, 2)).windows[0].table(DRIFT)
    assert uninterrupted.status is TableStatus.WRITTEN
    assert uninterrupted.schema_changes == (
        "drop column gone",
        "drop column old_label",
        "add column label string",
    )
    expected = {
        1: (1, "one", "L1"),
        2: (2, "n2", None),  # untouched: no "gone", no "old_label"; "label" as any added column
        3: (3, "n3", None),
        4: (4, "n4", None),
        5: (5, "n5", None),
        7: (7, "n7", "L7"),
    }
    assert rows_of(spark, clean / DRIFT) == (["id", "name", "label"], expected)
    assert rows_of(spark, target / DRIFT) == (["id", "name", "label"], expected)
    # The drop rewrote the table without the columns: no column mapping turned on (a reader
    # feature Polars refuses, and delta-rs's Arrow reader reads columns added after it as NULL),
    # so delta-rs and Polars read what Spark reads.
    assert _column_mapping(target / DRIFT) == (None, 1)
    assert_readers_see_what_spark_sees(DRIFT, target / DRIFT, spark)

    # The same window again: already applied, nothing committed.
    version = delta_history(target / DRIFT)[-1]["version"]
    again = merge(spark, sync.plan(target, 1, 2)).windows[0].table(DRIFT)
    assert again.status is TableStatus.ALREADY_APPLIED
    assert delta_history(target / DRIFT)[-1]["version"] == version
    assert rows_of(spark, target / DRIFT) == (["id", "name", "label"], expected)

    # A later window drops nothing again; a column added back under an old name is a new column:
    # the dropped values do not come back. A name Delta refuses unmapped ("my note") turns column
    # mapping on, the one case it is turned on; the columns added with it get physical names.
    wl.execute(
        hook,
        f"ALTER TABLE commerce.{DRIFT} ADD COLUMN gone VARCHAR(5), ADD COLUMN `my note` VARCHAR(5)",
        f"UPDATE commerce.{DRIFT} SET name = 'two', gone = 'g2', `my note` = 'm2' WHERE id = 2",
    )
    sync.capture()
    later = merge(spark, sync.plan(target, 2, 3)).windows[0].table(DRIFT)
    assert later.status is TableStatus.WRITTEN
    assert later.schema_changes == (
        "map columns by name",
        "add column gone string",
        "add column my note string",
    )
    names, rows = rows_of(spark, target / DRIFT)
    assert names == ["id", "name", "label", "gone", "my note"]
    assert rows == {k: (*v, None, None) for k, v in expected.items()} | {2: (2, "two", "l2", "g2", "m2")}
    assert _column_mapping(target / DRIFT) == ("name", 2)
    assert renamed_physically(target / DRIFT) == {"gone", "my note"}
    # As docs/reading-the-tables.md says: delta-rs's SQL engine reads it as Spark does, its Arrow
    # reader reads the two columns NULL, Polars refuses the table.
    assert_column_mapped_table_reads_as_documented(DRIFT, target / DRIFT, spark)

    # A re-snapshot fills the renamed column everywhere: the table (column mapping on since the
    # spaced name) is replaced and equals the source, value for value.
    resnapshot = sync.capture(snapshot=True)
    merge(
        spark,
        MergePlan(
            sync.sync_id,
            (WindowToMerge(resnapshot.window_seq, resnapshot.path, (DRIFT,)),),
            sync.targets(target),
        ),
    )
    assert wl.assert_equal_to_source(spark, hook, "commerce", DRIFT, str(target / DRIFT), ("id",)) == 6
    assert _column_mapping(target / DRIFT) == ("name", 2)  # the replace keeps the mapping
    assert_column_mapped_table_reads_as_documented(DRIFT, target / DRIFT, spark)
    wl.execute(hook, f"DROP TABLE commerce.{DRIFT}")


def test_a_soft_delete_table_loses_a_dropped_column_from_live_and_flagged_rows_alike(
    vitess: LocalVitess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``soft_delete`` keeps deleted rows: the drop's rewrite takes the column out of those too,
    keeps their flags, and a merge killed after it then rerun gives the uninterrupted table."""
    spark = spark_session()
    table = f"{DRIFT}_soft"
    hook = wl.hook_for(vitess, "vitess_merge_drift_soft")
    _create_drift_table(hook, table, 4)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(
        hook, store, tmp_path / "stage", f"drift-soft-{uuid.uuid4().hex[:8]}", "commerce", [table]
    )
    soft = TargetShape(mode=TargetMode.SOFT_DELETE)

    def plan(root: Path, first: int, last: int) -> MergePlan:
        return sync.plan(root, first, last, soft)

    target, clean = tmp_path / "delta", tmp_path / "delta-clean"
    sync.capture(snapshot=True)
    merge(spark, plan(target, 0, 1))
    # A delete before the DDL: row 4 is kept, flagged, with the column about to go.
    wl.execute(hook, f"DELETE FROM commerce.{table} WHERE id = 4")
    sync.capture()
    merge(spark, plan(target, 1, 2))
    shutil.copytree(target, clean)

    wl.execute(
        hook,
        f"ALTER TABLE commerce.{table} DROP COLUMN gone, RENAME COLUMN old_label TO label",
        f"UPDATE commerce.{table} SET label = 'L1' WHERE id = 1",
        f"DELETE FROM commerce.{table} WHERE id = 3",
    )
    sync.capture()

    def killed(*_: object, **__: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(apply, "run_merge", killed)
        with pytest.raises(Killed):
            merge(spark, plan(target, 2, 3))
    assert merge(spark, plan(target, 2, 3)).windows[0].table(table).status is TableStatus.WRITTEN
    assert merge(spark, plan(clean, 2, 3)).windows[0].table(table).status is TableStatus.WRITTEN

    compared = ("id", "name", "label", "_vitess_deleted")  # not deleted_at: a time of the merge
    expected = {
        1: (1, "n1", "L1", False),
        2: (2, "n2", None, False),
        3: (3, "n3", None, True),  # deleted after the drop: its last values, without the column
        4: (4, "n4", None, True),  # deleted before it: rewritten without the column, still flagged
    }
    # An added column goes last, after the mode's columns, as any column added to the table.
    names = ["id", "name", "_vitess_deleted", "_vitess_deleted_at", "label"]
    assert rows_of(spark, target / table, compared) == (names, expected)
    assert rows_of(spark, clean / table, compared) == (names, expected)
    assert _column_mapping(target / table) == (None, 1)
    assert_readers_see_what_spark_sees(table, target / table, spark)
    wl.execute(hook, f"DROP TABLE commerce.{table}")
