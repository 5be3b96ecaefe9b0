"""Shard groups in the store and in staging (``checkpoints/groups.py``, ``capture/groups.py``,
``staging/group_manifest.py``): the layout, each group's lock and its fencing, a part recorded
only into a PLANNED window, the window's one manifest over every group's parts, and a group's
rerun deleting only its own files. A real SQLite store and real staged Parquet parts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.capture.group_layout import SplitMismatchError, group_split, layout
from airflow_provider_vitess.capture.groups import assemble, delete_group_files, restrict, window_for_group
from airflow_provider_vitess.capture.resume import WindowBook
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind, WindowState
from airflow_provider_vitess.checkpoints.groups import group_lock_id
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import CheckpointError, SyncLockedError
from airflow_provider_vitess.staging import WindowStager, load_manifest, read_table, verify
from airflow_provider_vitess.staging.files import group_manifest_name, group_writer_id
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

SYNC = "grouped"
SHARDS = ("-40", "40-80", "80-c0", "c0-")
FIELDS = [
    query_pb2.Field(name="id", type=query_pb2.INT64, column_type="bigint", flags=1),
    query_pb2.Field(name="v", type=query_pb2.INT64, column_type="bigint"),
]


def position(n: int, shards: tuple[str, ...] = SHARDS) -> Vgtid:
    return Vgtid(tuple(ShardGtid("ks", s, f"MariaDB/0-1-{n + i}") for i, s in enumerate(shards)))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 28, 12, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> CheckpointStore:
    s = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    s.migrate()
    s.ensure_sync(SYNC, "ks", ["t"], {"staging": str(tmp_path / "stage")})
    return s


def test_layout_is_contiguous_by_key_range_and_balanced() -> None:
    assert layout(["c0-", "-40", "80-c0", "40-80"], 2) == [["-40", "40-80"], ["80-c0", "c0-"]]
    assert layout(list(SHARDS), 3) == [["-40", "40-80"], ["80-c0"], ["c0-"]]
    assert layout(["80-", "-80"], 5) == [["-80"], ["80-"]]  # no more groups than shards
    assert layout(["0"], 2) == [["0"]]
    with pytest.raises(ValueError, match="capture_parallelism must be 1 or more"):
        layout(list(SHARDS), 0)


def test_key_ranges_make_a_group_of_the_shards_inside_each() -> None:
    assert layout(list(SHARDS), ("80-", "-80")) == [["-40", "40-80"], ["80-c0", "c0-"]]
    assert layout(list(SHARDS), ("-40", "40-")) == [["-40"], ["40-80", "80-c0", "c0-"]]  # a hot shard alone
    assert layout(["-40", "40-80", "80-"], ("-80", "80-")) == [["-40", "40-80"], ["80-"]]
    assert layout(["-8000", "8000-"], ("-80", "80-")) == [["-8000"], ["8000-"]]  # 80 == 8000, as in Vitess
    assert layout(["-40"], ("-40", "40-")) == [["-40"]]  # a range that holds no shard: no group


def test_a_shard_across_a_range_boundary_does_not_fit() -> None:
    with pytest.raises(SplitMismatchError, match=r"shard\(s\) \['-80'\] span a boundary.*\['-40', '40-'\]"):
        layout(["-80", "80-"], ("-40", "40-"))


@pytest.mark.parametrize(
    ("given", "split"),
    [(2, 2), ("3", 3), (["-80", "80-"], ("-80", "80-")), ('["-80", "80-"]', ("-80", "80-")), (["0"], ("0",))],
)
def test_the_split_as_given_or_rendered(given: object, split: object) -> None:
    assert group_split(given) == split


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (0, "must be 1 or more, got 0"),
        (True, "a number of groups or a list of key ranges, got True"),
        ("two", "a number of groups or a list of key ranges, got 'two'"),
        ([], "key ranges are empty"),
        (["-80", "c0-"], "do not tile the keyspace: 'c0-' should start at 80"),
        (["-80", "40-"], "do not tile the keyspace: '40-' should start at 80"),
        (["40-"], "'40-' should start at the start"),
        (
            ["-80", "80-c0"],
            "do not reach the keyspace's end: the last ends at c0; make the last range open-ended",
        ),
        (["-80", "80-", "c0-"], "'c0-' should start at the keyspace's end"),
        (["-zz"], "not a key range of hex bounds"),
    ],
)
def test_a_split_that_is_not_one_is_refused_naming_the_fix(given: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        group_split(given)


def test_restrict_keeps_a_groups_shards_and_refuses_a_missing_one() -> None:
    assert [sg.shard for sg in restrict(position(1), ["80-c0", "c0-"]).shard_gtids] == ["80-c0", "c0-"]
    with pytest.raises(CheckpointError, match=r"no entry for shard\(s\) \['ff-'\]"):
        restrict(position(1), ["ff-"])


def test_groups_are_recorded_with_the_window_and_locked_apart(store: CheckpointStore, clock: Clock) -> None:
    seq = store.plan_window(
        SYNC, WindowKind.CATCHUP, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]]
    )
    groups = store.window_groups(SYNC, seq)
    assert [(g.group, g.shards, g.state) for g in groups] == [
        (0, SHARDS[:2], WindowState.PLANNED),
        (1, SHARDS[2:], WindowState.PLANNED),
    ]
    assert store.window(SYNC, seq).stats["groups"] == [list(SHARDS[:2]), list(SHARDS[2:])]
    # The sync's lock (a plan, a merge) and each group's lock are held at once; one writer per group.
    with (
        store.lock(SYNC, "plan"),
        store.lock(group_lock_id(SYNC, 0), "g0"),
        store.lock(group_lock_id(SYNC, 1), "g1"),
        pytest.raises(SyncLockedError, match="g0"),
    ):
        store.acquire_lock(group_lock_id(SYNC, 0), "g0 again")


def test_a_stale_group_writer_records_nothing(store: CheckpointStore, clock: Clock, tmp_path: Path) -> None:
    seq = store.plan_window(
        SYNC, WindowKind.CATCHUP, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]]
    )
    end = position(9, SHARDS[:2])
    scope = group_lock_id(SYNC, 0)
    with store.lock(scope, "stalled try", timedelta(seconds=60)):
        clock.now += timedelta(seconds=61)  # it stalled past the expiry ...
        other = CheckpointStore(engine=store.engine, clock=clock)
        taker = other.acquire_lock(scope, "retry", timedelta(seconds=60))  # ... and its retry took over
        with pytest.raises(SyncLockedError, match="lost its lock"):
            store.mark_group_staged(SYNC, seq, 0, end, "m0")
        assert store.window_groups(SYNC, seq)[0].state is WindowState.PLANNED
        taker.release()


def test_a_part_is_recorded_only_into_a_planned_window_and_is_immutable(store: CheckpointStore) -> None:
    seq = store.plan_window(
        SYNC, WindowKind.CATCHUP, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]]
    )
    end = position(9, SHARDS[:2])
    assert store.mark_group_staged(SYNC, seq, 0, end, "m0", {"rows": 3})
    assert not store.mark_group_staged(SYNC, seq, 0, end, "m0", {"rows": 3})  # a retried record
    with pytest.raises(CheckpointError, match="already STAGED"):
        store.mark_group_staged(SYNC, seq, 0, end, "another")
    store.discard_unmerged(SYNC, "a re-snapshot")
    with pytest.raises(CheckpointError, match="the window is FAILED, not PLANNED"):
        store.mark_group_staged(SYNC, seq, 1, position(9, SHARDS[2:]), "m1")
    assert store.window_groups(SYNC, seq)[1].state is WindowState.PLANNED


def _stage_group(root: Path, seq: int, group: int, shards: tuple[str, ...], token: str, base: int) -> str:
    stager = WindowStager(
        str(root), SYNC, seq, key_columns={"t": ["id"]}, writer_id=group_writer_id(group, token),
        manifest_name=group_manifest_name(group, group_writer_id(group, token)),
    )  # fmt: skip
    stager.set_schema("ks", "t", FIELDS)
    for i, shard in enumerate(shards):
        stager.add_change("ks", "t", shard, Operation.INSERT, 1_800_000_000 + i, i + 1, None, (base + i, i))
    stats = {"rows": len(shards), "keys": {"t": "id"}, "shard_lag_transactions": dict.fromkeys(shards, 0)}
    end = restrict(position(9), shards)
    stager.finish(restrict(position(1), shards), end, end, stats=stats)
    return f"{root}/{SYNC}/window={seq:010d}/{group_manifest_name(group, group_writer_id(group, token))}"


def test_the_window_is_staged_once_every_group_is_with_one_manifest(
    store: CheckpointStore, tmp_path: Path
) -> None:
    root = tmp_path / "stage"
    seq = store.plan_window(
        SYNC, WindowKind.CATCHUP, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]]
    )
    book = WindowBook(store, SYNC, str(root), None, "merge")
    path0 = _stage_group(root, seq, 0, SHARDS[:2], "aaaaaaaaaaaaaaaa", 100)
    store.mark_group_staged(SYNC, seq, 0, position(9, SHARDS[:2]), path0)
    assert assemble(store, SYNC, book) is None  # group 1 is still being read
    assert store.window(SYNC, seq).state is WindowState.PLANNED
    # A killed try of group 1 left files; its rerun deletes them, and only them.
    leftover = _stage_group(root, seq, 1, SHARDS[2:], "bbbbbbbbbbbbbbbb", 200)
    deleted = delete_group_files(str(root), SYNC, seq, 1, None)
    assert deleted and all("-g001-" in d or d.startswith("_group-001-") for d in deleted)
    assert Path(path0).exists()  # group 0's part is kept
    assert not Path(leftover).exists()
    path1 = _stage_group(root, seq, 1, SHARDS[2:], "cccccccccccccccc", 200)
    store.mark_group_staged(SYNC, seq, 1, position(9, SHARDS[2:]), path1)

    assert assemble(store, SYNC, book) == seq
    window = store.window(SYNC, seq)
    assert window.state is WindowState.STAGED and window.end_vgtid == position(9)
    manifest = load_manifest(str(root), SYNC, seq)
    assert manifest is not None and manifest.path == window.manifest_path
    verify(manifest)
    assert manifest.start_vgtid == position(1) and manifest.stop_vgtid == position(9)
    assert manifest.stats["rows"] == 4 and manifest.stats["shard_lag_transactions"] == dict.fromkeys(
        SHARDS, 0
    )
    assert window.stats["groups"] == [list(SHARDS[:2]), list(SHARDS[2:])]  # the layout stays
    rows = read_table(manifest, "t").to_pylist()
    assert sorted((r["_shard"], r["id"]) for r in rows) == [
        ("-40", 100),
        ("40-80", 101),
        ("80-c0", 200),
        ("c0-", 201),
    ]
    assert assemble(store, SYNC, book) is None  # once


def test_a_lost_group_manifest_discards_the_window(store: CheckpointStore, tmp_path: Path) -> None:
    root = tmp_path / "stage"
    seq = store.plan_window(
        SYNC, WindowKind.CATCHUP, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]]
    )
    for g, shards in enumerate((SHARDS[:2], SHARDS[2:])):
        path = _stage_group(root, seq, g, shards, f"{g}" * 16, 100 * g)
        store.mark_group_staged(SYNC, seq, g, position(9, shards), path)
    lost = store.window_groups(SYNC, seq)[1].manifest_path
    assert lost is not None
    Path(lost).unlink()
    assert assemble(store, SYNC, WindowBook(store, SYNC, str(root), None, "merge")) is None
    assert store.window(SYNC, seq).state is WindowState.FAILED
    assert store.open_window(SYNC) is None  # the next plan reads it again from its start


@pytest.mark.parametrize(
    ("kind", "other", "missing", "planned"),
    [
        (
            WindowKind.CATCHUP,
            WindowKind.SNAPSHOT,
            "sync 'grouped' has no unfinished catch-up window for group 2 to read: its plan task plans "
            "one (run the DAG's plan task first)",
            "sync 'grouped' window {seq} was planned with groups 0-1, not 2: the mapped task's group "
            "comes from the plan task of the same DAG run",
        ),
        (
            WindowKind.SNAPSHOT,
            WindowKind.CATCHUP,
            "sync 'grouped' has no unfinished snapshot window for group 2 to copy: its plan task plans "
            "one (run the DAG's plan_snapshot task first)",
            "sync 'grouped' snapshot window {seq} was planned with groups 0-1, not 2: the mapped "
            "task's group comes from the plan task of the same DAG run",
        ),
    ],
)
def test_a_group_task_finds_its_window_or_names_the_plan_task(
    store: CheckpointStore, kind: WindowKind, other: WindowKind, missing: str, planned: str
) -> None:
    with pytest.raises(CheckpointError) as none_open:
        window_for_group(store, SYNC, kind, 2)
    assert str(none_open.value) == missing
    # A window of the other kind open: not this task's either.
    seq = store.plan_window(SYNC, other, position(1), position(9))
    with pytest.raises(CheckpointError) as other_open:
        window_for_group(store, SYNC, kind, 2)
    assert str(other_open.value) == missing
    store.discard_unmerged(SYNC, "the test's next window")

    seq = store.plan_window(SYNC, kind, position(1), position(9), groups=[SHARDS[:2], SHARDS[2:]])
    window, groups = window_for_group(store, SYNC, kind, 1)
    assert (window.seq, window.kind, [g.shards for g in groups]) == (seq, kind, [SHARDS[:2], SHARDS[2:]])
    with pytest.raises(CheckpointError) as outside:
        window_for_group(store, SYNC, kind, 2)
    assert str(outside.value) == planned.format(seq=seq)
    store.discard_unmerged(SYNC, "the test's next window")

    # A window read by one process: no groups, whichever group asks (group 0 reads it whole).
    seq = store.plan_window(SYNC, kind, position(1), position(9))
    assert [(w.seq, g) for w, g in [window_for_group(store, SYNC, kind, n) for n in (0, 2)]] == [
        (seq, []),
        (seq, []),
    ]
