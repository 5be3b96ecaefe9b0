"""A snapshot copied by shard groups, in the store (SQLite) and the DAG factory: each group's
parts, resume position and progress apart; the window's progress their sums."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_vitess.capture.groups import delete_group_files
from airflow_provider_vitess.checkpoints import CheckpointStore, Part, Phase, TableProgress, WindowKind
from airflow_provider_vitess.checkpoints.progress import GroupProgress, summed
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from airflow_provider_vitess.exceptions import CheckpointError
from airflow_provider_vitess.operators.capture import VitessSnapshotOperator
from airflow_provider_vitess.staging.files import window_dir
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

SYNC = "snapgroups"
SHARDS = ("-40", "40-80", "80-c0", "c0-")
LAYOUT = [SHARDS[:2], SHARDS[2:]]
AT = datetime(2026, 11, 28, 12, tzinfo=timezone.utc)


def empty(shards: tuple[str, ...] = SHARDS) -> Vgtid:
    return Vgtid(tuple(ShardGtid("ks", s, "") for s in shards))


def at(n: int, shards: tuple[str, ...]) -> Vgtid:
    return Vgtid(tuple(ShardGtid("ks", s, f"MariaDB/0-1-{n}") for s in shards))


def part(name: str, rows: int = 10) -> Part:
    return Part(path=f"t/{name}", table="t", rows=rows, bytes=100, sha256="c" * 64, detail={})


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    s = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    s.ensure_sync(SYNC, "ks", ["t", "u"], {"staging": str(tmp_path / "stage")})
    return s


def row(table: str, rows_known: int | None = None, rows_copied: int = 0) -> TableProgress:
    return TableProgress(SYNC, 1, table, rows_known, rows_copied, Phase.COPYING, ["id"], "pk", AT)


G, DONE, BUSY = GroupProgress, Phase.COPIED, Phase.COPYING


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        # Every group counted and copied it: the sums, COPIED.
        ([G(0, "t", 40, 40, DONE), G(1, "t", 60, 60, DONE)], (100, 100, DONE)),
        # One group still copying: COPYING, the rows copied so far summed.
        ([G(0, "t", 40, 40, DONE), G(1, "t", 60, 12, BUSY)], (52, 100, BUSY)),
        # A group whose count(*) has not come back: no total (no percent) yet.
        ([G(0, "t", 40, 40, DONE), G(1, "t", None, 12, BUSY)], (52, None, BUSY)),
        # A group with no row yet (not started): not COPIED, no total, whatever the other says.
        ([G(0, "t", 40, 40, DONE)], (40, None, BUSY)),
        # Rows of other tables do not count.
        ([G(0, "u", 5, 5, DONE)], (0, None, BUSY)),
    ],
)
def test_a_tables_progress_is_summed_over_its_groups(
    groups: list[GroupProgress], expected: tuple[int, int | None, Phase]
) -> None:
    out = summed(row("t"), 2, groups)
    assert (out.rows_copied, out.rows_known, out.phase) == expected
    assert (out.key_columns, out.key_source) == (["id"], "pk")  # the window's row's


def test_each_group_records_its_own_parts_resume_position_and_progress(store: CheckpointStore) -> None:
    seq = store.plan_window(SYNC, WindowKind.SNAPSHOT, empty(), None, groups=LAYOUT)
    for table in ("t", "u"):
        store.update_progress(SYNC, seq, table, phase=Phase.COPYING)
    # Interleaved checkpoints of the two groups: their part numbers never collide.
    store.record_parts(
        SYNC, seq, [part("g0-a")], at(3, LAYOUT[0]), group=0, copied={"t": (10, Phase.COPYING)}
    )
    store.record_parts(
        SYNC, seq, [part("g1-a")], at(4, LAYOUT[1]), group=1, copied={"t": (10, Phase.COPYING)}
    )
    store.record_parts(
        SYNC, seq, [part("g0-b", 5)], at(5, LAYOUT[0]), group=0,
        copied={"t": (15, Phase.COPIED), "u": (0, Phase.COPYING)},
    )  # fmt: skip
    assert [p.path for p in store.parts(SYNC, seq, group=0)] == ["t/g0-a", "t/g0-b"]
    assert [p.path for p in store.parts(SYNC, seq, group=1)] == ["t/g1-a"]
    assert len(store.parts(SYNC, seq)) == 3
    groups = store.window_groups(SYNC, seq)
    assert [g.resume_vgtid for g in groups] == [at(5, LAYOUT[0]), at(4, LAYOUT[1])]
    assert store.resume_vgtid(SYNC, seq) is None  # the window's own: only a one-process copy's
    store.update_progress(SYNC, seq, "t", rows_known=15, group=0)
    store.update_progress(SYNC, seq, "t", rows_known=25, group=1)
    mine = {
        (p.group, p.table): (p.rows_copied, p.rows_known, p.phase) for p in store.group_progress(SYNC, seq)
    }
    assert mine == {
        (0, "t"): (15, 15, Phase.COPIED),
        (0, "u"): (0, None, Phase.COPYING),
        (1, "t"): (10, 25, Phase.COPYING),
    }
    window = {p.table: (p.rows_copied, p.rows_known, p.phase) for p in store.progress(SYNC, seq)}
    assert window == {"t": (25, 40, Phase.COPYING), "u": (0, None, Phase.COPYING)}
    # A staged group records no more parts.
    store.mark_group_staged(SYNC, seq, 0, at(6, LAYOUT[0]), "m0")
    with pytest.raises(CheckpointError, match="group 0 is not PLANNED"):
        store.record_parts(SYNC, seq, [part("g0-late")], at(7, LAYOUT[0]), group=0)
    assert [p.path for p in store.parts(SYNC, seq, group=0)] == ["t/g0-a", "t/g0-b"]


def test_a_rerun_of_a_group_keeps_its_checkpointed_files_and_the_other_groups(tmp_path: Path) -> None:
    wdir = Path(window_dir(str(tmp_path / "stage"), SYNC, 1))
    names = [
        "t/part-00001-g000-aaaa.parquet",  # group 0, checkpointed
        "t/part-00002-g000-aaaa.parquet",  # group 0, written after its last checkpoint
        "_group-000-g000-aaaa.json",  # group 0's manifest of a try that was not recorded
        "t/part-00001-g001-bbbb.parquet",  # group 1's
    ]
    for name in names:
        (wdir / name).parent.mkdir(parents=True, exist_ok=True)
        (wdir / name).write_bytes(b"x")
    deleted = delete_group_files(str(tmp_path / "stage"), SYNC, 1, 0, None, keep=[names[0]])
    assert sorted(deleted) == sorted(["part-00002-g000-aaaa.parquet", "_group-000-g000-aaaa.json"])
    assert sorted(str(p.relative_to(wdir)) for p in wdir.rglob("*.*")) == sorted([names[0], names[3]])


def test_the_factory_splits_the_snapshot_of_a_grouped_sync_only() -> None:
    dag = vitess_sync_dag(
        "sync_gs", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t",
        capture_parallelism=["-80", "80-"],
    )  # fmt: skip
    plan = dag.get_task("plan_snapshot")
    assert plan.capture_parallelism == ("-80", "80-")  # type: ignore[union-attr]
    assert plan.resnapshot_tables == "{{ params.resnapshot_tables }}"  # type: ignore[union-attr]
    assert dag.get_task("snapshot").upstream_task_ids == {"plan_snapshot"}
    merge = dag.get_task("merge_snapshot")
    assert merge.upstream_task_ids == {"snapshot"}
    assert merge.trigger_rule == "none_failed"  # a plan with nothing to copy skips the copy only
    assert dag.get_task("wait_for_changes").upstream_task_ids == {"merge_snapshot"}
    one = vitess_sync_dag("sync_1s", keyspace="ks", tables=["t"], staging_location="/s", target_location="/t")
    assert "plan_snapshot" not in one.task_ids
    assert type(one.get_task("snapshot")) is VitessSnapshotOperator
    assert one.get_task("merge_snapshot").upstream_task_ids == {"snapshot"}
    assert one.get_task("merge_snapshot").trigger_rule == "all_success"
