"""A merge reads, checks and writes only the tables its windows touch: a window of 1 table in a
sync of many looks at 1 Delta table, and still refuses that one when it is not what the sync
wrote. Real staged windows (Parquet parts, manifest, checksums); the Delta table states are
given instead of read (the job's one Spark-facing call here), and every step needs no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import TargetIntegrityError
from airflow_provider_vitess.merge.job import run, tables
from airflow_provider_vitess.merge.job.steps import TableState, touched_tables
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid

FIELDS = [
    query_pb2.Field(name="id", type=query_pb2.INT64, column_type="bigint", flags=1),
    query_pb2.Field(name="v", type=query_pb2.INT64, column_type="bigint"),
]
V = Vgtid.for_keyspace("ks", "")
TABLES = ("t00", "t01", "t02", "t03")
NO_SPARK = cast(SparkSession, object())  # every step here is decided without Spark


def catch_up(root: Path, seq: int, tables: tuple[str, ...]) -> WindowToMerge:
    """A staged catch-up window with one update in each of ``tables``."""
    stager = WindowStager(str(root), "s", seq, key_columns={t: ["id"] for t in TABLES})
    for n, table in enumerate(tables):
        stager.set_schema("ks", table, FIELDS)
        stager.add_change("ks", table, "-", Operation.UPDATE, 1_800_000_000, n + 1, (1, 0), (1, seq))
    manifest = stager.finish(V, V, V)
    return WindowToMerge(seq, manifest.path)


def sync_plan(window: WindowToMerge, *, last_merged_seq: int = 2) -> MergePlan:
    targets = {
        t: TableTarget(
            t, f"/delta/{t}", ("id",), ("id",), last_merged_seq=last_merged_seq, last_delta_version=7
        )
        for t in TABLES
    }
    return MergePlan("s", (window,), targets)


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> dict[str, TableState]:
    """The Delta paths whose state the job read; each table holds window 2 of the sync."""
    seen: dict[str, TableState] = {}

    def table_state(spark: Any, path: str, app_id: str, restores_after: int | None) -> TableState:
        assert app_id == f"airflow-provider-vitess:s:{path.rsplit('/', 1)[1]}" and restores_after == 7
        seen[path] = TableState(exists=True, txn_version=2, version=7)
        return seen[path]

    monkeypatch.setattr(tables, "table_state", table_state)
    return seen


def test_a_window_of_one_table_reads_only_that_tables_state(
    tmp_path: Path, read: dict[str, TableState]
) -> None:
    # Window 2 touched t01 only; it is merged again (its commit is in t01: already applied).
    plan = sync_plan(catch_up(tmp_path, 2, ("t01",)))
    report = run.merge(NO_SPARK, plan)
    assert sorted(read) == ["/delta/t01"]
    statuses = {r.table: (r.status, r.delta_version) for r in report.window(2).tables}
    assert statuses == {
        "t00": (TableStatus.NO_CHANGES, None),
        "t01": (TableStatus.ALREADY_APPLIED, 7),
        "t02": (TableStatus.NO_CHANGES, None),
        "t03": (TableStatus.NO_CHANGES, None),
    }


def test_the_touched_table_is_still_refused_when_it_is_not_what_the_sync_wrote(
    tmp_path: Path, read: dict[str, TableState]
) -> None:
    # The store says window 3 was merged into every table; each Delta table holds only window 2
    # (rolled back): t02, which window 4 writes, is refused before any write; the others are
    # not read (a run that does not write them cannot make them wrong).
    plan = sync_plan(catch_up(tmp_path, 4, ("t02",)), last_merged_seq=3)
    with pytest.raises(TargetIntegrityError, match=r"table 't02'.*holds this sync's windows only up to 2"):
        run.merge(NO_SPARK, plan)
    assert sorted(read) == ["/delta/t02"]


def test_touched_tables_are_those_with_staged_rows_or_replaced(tmp_path: Path) -> None:
    first = catch_up(tmp_path, 5, ("t03", "t00"))
    second = WindowToMerge(6, catch_up(tmp_path, 6, ()).manifest_path, replace_tables=("t01",))
    targets = sync_plan(first).targets
    plan = MergePlan("s", (first, second), targets)
    manifests = run.load_windows(plan)
    assert touched_tables(MergePlan("s", (first,), targets), manifests[:1]) == ["t00", "t03"]
    assert touched_tables(plan, manifests) == ["t00", "t01", "t03"]
