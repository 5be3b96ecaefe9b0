"""The apply side of the window state machine without Spark: what a merge does with each
window state, the key it merges with, the lock it holds, and what it records for the next
merge's integrity check; and how the provider's errors end a task."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind, WindowState
from airflow_provider_vitess.consistent_reads import consistent_cut, cut_sql
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.exceptions import (
    CheckpointError,
    CorruptStagedDataError,
    KeyChangedError,
    StagedWindowLostError,
    StagingError,
    SyncLockedError,
    is_permanent,
    permanent_by_name,
)
from airflow_provider_vitess.keys import KeyChoice, reconcile_keys
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.merge.report import (
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
)
from airflow_provider_vitess.merge.runner import MergeRunner, build_plan, merged_targets
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.utils.airflow_compat import AirflowFailException
from airflow_provider_vitess.utils.failures import task_failures
from airflow_provider_vitess.vgtid import Vgtid

START = Vgtid.for_keyspace("customer", "")
END = Vgtid.from_json('[{"keyspace":"customer","shard":"0","gtid":"MariaDB/0-1-5","table_p_ks":[]}]')
BY_ID = KeyChoice("t", ("id",), ("id",), "PRIMARY", "primary key", ("id",))
BY_CODE = KeyChoice("t", ("code",), ("code",), "uk_code", "override", ("code",))


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    store.ensure_sync("s1", "customer", ["t"], {"keys": {"t": BY_ID.to_dict()}})
    return store


def _never(plan: MergePlan) -> MergeReport:
    raise AssertionError("nothing may be submitted")


def _committed_snapshot(store: CheckpointStore) -> None:
    seq = store.plan_window("s1", WindowKind.SNAPSHOT, START)
    store.mark_staged("s1", seq, END, "/stage/s1/window=0000000001/_manifest.json")
    store.mark_merged("s1", seq, {"t": 3})
    store.commit("s1", seq)


def test_a_window_merges_with_the_key_it_was_staged_with(store: CheckpointStore) -> None:
    _committed_snapshot(store)
    seq = store.plan_window("s1", WindowKind.CATCHUP, END, END)
    stats = {"keys": {"t": BY_ID.to_dict()}}
    store.mark_staged("s1", seq, END, "/stage/s1/window=0000000002/_manifest.json", stats)
    # Meanwhile the sync's key config changed (e.g. a capture run with a new override).
    store.ensure_sync("s1", "customer", ["t"], {"keys": {"t": BY_CODE.to_dict()}})
    plan = build_plan(store, "s1", store.window("s1", seq), "/delta")
    assert plan.targets["t"].key_columns == ("id",)
    # ...and the plan carries what the sync last wrote to the table, for the integrity check.
    assert (plan.targets["t"].last_merged_seq, plan.targets["t"].last_delta_version) == (1, 3)


def test_a_merge_with_nothing_staged_does_nothing_and_names_the_task_that_owns_the_window(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed_snapshot(store)
    store.plan_window("s1", WindowKind.CATCHUP, END, END)  # its catch_up task failed while reading
    outcome = MergeRunner(store, "s1", "/delta", holder="merge").run(_never)
    assert (outcome.seq, outcome.committed_seq) == (None, 1)
    assert "catchup window 2 is still being read (PLANNED); its 'catch_up' task resumes it" in outcome.message
    # Through the operator (the DAG's merge_snapshot task in a run that snapshots nothing).
    monkeypatch.setenv(
        "AIRFLOW_CONN_STORE", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "store.db")})
    )
    operator = VitessMergeOperator(
        task_id="merge_snapshot", sync_id="s1", target_location="/delta", checkpoint_conn_id="store"
    )
    assert operator.execute({}) == {"sync_id": "s1", "merged": None, "committed_seq": 1}


def test_the_merge_holds_the_sync_lock(store: CheckpointStore) -> None:
    _committed_snapshot(store)
    seq = store.plan_window("s1", WindowKind.CATCHUP, END, END)
    store.mark_staged("s1", seq, END, "/stage/s1/window=0000000002/_manifest.json")
    with (
        store.lock("s1", "capture of another run"),
        pytest.raises(SyncLockedError, match="capture of another"),
    ):
        MergeRunner(store, "s1", "/delta", holder="merge").run(_never)
    assert store.window("s1", seq).state is WindowState.STAGED


def test_a_merged_window_records_the_tables_that_hold_it() -> None:
    plan = MergePlan.from_json(
        json.dumps(
            {
                "sync_id": "s1",
                "windows": [{"seq": 4, "manifest_path": "/m", "replace_tables": ["empty"]}],
                "targets": {
                    t: {"table": t, "path": f"/d/{t}", "key_columns": ["id"], "key_from_source": ["id"]}
                    for t in ("written", "again", "untouched", "empty")
                },
            }
        )
    )
    results = (
        TableResult("written", "/d/written", TableStatus.WRITTEN, delta_version=7),
        TableResult("again", "/d/again", TableStatus.ALREADY_APPLIED, delta_version=5),
        TableResult("untouched", "/d/untouched", TableStatus.NO_CHANGES),
        TableResult("empty", "/d/empty", TableStatus.NO_CHANGES, WriteMode.REPLACE),
    )
    report = MergeReport("s1", (WindowResult(4, results),))
    assert merged_targets(plan, report) == {"written": 7, "again": 5, "empty": None}


def test_keys_change_only_through_a_resnapshot() -> None:
    assert reconcile_keys("s1", {}, {"t": BY_CODE}) == {"t": BY_CODE}  # a new sync
    assert reconcile_keys("s1", {"t": BY_ID}, {"t": BY_ID}) == {"t": BY_ID}
    assert reconcile_keys("s1", {"t": BY_ID}, {"t": BY_CODE}, snapshot_of=["t"]) == {"t": BY_CODE}
    with pytest.raises(KeyChangedError) as changed:
        reconcile_keys("s1", {"t": BY_ID}, {"t": BY_CODE})
    assert str(changed.value) == (
        "sync 's1' table 't': its key is now ['code'] (override), but its Delta table was built with "
        "key ['id'] (primary key); re-snapshot the table to rebuild it with the new key (trigger the "
        'DAG with {"resnapshot_tables": ["t"]}), or restore the old key'
    )


def test_permanent_errors_fail_the_task_without_retries_and_without_their_library_chain() -> None:
    assert is_permanent(KeyChangedError("x")) and permanent_by_name("KeyChangedError")
    assert permanent_by_name("MergeSchemaError") and permanent_by_name("TargetIntegrityError")
    assert permanent_by_name("UnsupportedDeltaError")  # another Delta on the next try too
    assert not is_permanent(SyncLockedError("x")) and not permanent_by_name("SyncLockedError")
    assert not permanent_by_name("Py4JJavaError")

    def corrupt() -> None:
        try:
            raise OSError("short read")
        except OSError as exc:
            raise CorruptStagedDataError("part t/part-00001.parquet: 10 bytes, expected 20") from exc

    with pytest.raises(AirflowFailException) as failed, task_failures(_Log()):
        corrupt()
    assert str(failed.value) == (
        "CorruptStagedDataError: part t/part-00001.parquet: 10 bytes, expected 20 "
        "(a permanent error: the task is not retried)"
    )
    assert failed.value.__cause__ is None and failed.value.__suppress_context__

    def transient() -> None:
        try:
            raise ConnectionResetError("peer")
        except ConnectionResetError as exc:
            raise StagingError("cannot write /stage") from exc

    with pytest.raises(StagingError) as retried, task_failures(_Log()):
        transient()
    assert retried.value.__cause__ is None and retried.value.__suppress_context__
    with pytest.raises(CheckpointError), task_failures(_Log()):
        raise CheckpointError("kept as it is: retried")


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def debug(self, event: object, /, *args: object, **kwargs: object) -> None:
        self.lines.append(str(event) % args)


def test_targets_are_checked_unless_the_plan_starts_by_rebuilding_them() -> None:
    from airflow_provider_vitess.exceptions import TargetIntegrityError
    from airflow_provider_vitess.merge.job.integrity import check_targets
    from airflow_provider_vitess.merge.job.steps import TableState

    def plan(windows: list[tuple[int, list[str]]], seq: int | None, version: int | None) -> MergePlan:
        target = {"table": "t", "path": "/d/t", "key_columns": ["id"], "key_from_source": ["id"]}
        return MergePlan.from_json(
            json.dumps(
                {
                    "sync_id": "s1",
                    "windows": [{"seq": s, "manifest_path": "/m", "replace_tables": r} for s, r in windows],
                    "targets": {"t": {**target, "last_merged_seq": seq, "last_delta_version": version}},
                }
            )
        )

    missing = {"t": TableState(exists=False)}
    ok = {"t": TableState(exists=True, txn_version=4, version=9)}
    check_targets(plan([(1, ["t"]), (2, [])], None, None), missing)  # a snapshot, then a catch-up
    check_targets(plan([(5, [])], 4, 9), ok)
    check_targets(plan([(5, [])], 4, None), missing)  # its snapshot had no rows: no table needed
    Case = tuple[list[tuple[int, list[str]]], int | None, int | None, dict[str, TableState]]
    cases: dict[str, Case] = {
        "is missing: this sync last merged window 4 into it (Delta version 9)": ([(5, [])], 4, 9, missing),
        "does not exist and this sync never built it": ([(5, [])], None, None, missing),
        "holds this sync's windows only up to 4, but window 5 was merged": ([(6, [])], 5, 9, ok),
        "is at Delta version 9, below version 12": ([(5, [])], 4, 12, ok),
        "was restored to an earlier version (RESTORE at Delta version 10, 11)": (
            [(5, [])],
            4,
            9,
            {"t": TableState(exists=True, txn_version=4, version=11, restores=(10, 11))},
        ),
        "holds no window of this sync, but window 4 was merged": (
            [(5, [])],
            4,
            9,
            {"t": TableState(exists=True, version=3)},
        ),
        "merging this window into it would leave": ([(5, []), (6, ["t"])], 4, 9, missing),
    }
    for expected, (windows, seq, version, states) in cases.items():
        with pytest.raises(TargetIntegrityError, match=re.escape(expected)) as refused:
            check_targets(plan(windows, seq, version), states)
        assert (
            'Re-snapshot the table to rebuild it (trigger the DAG with {"resnapshot_tables": ["t"]})'
            in str(refused.value)
        )

    # Ahead of the store: a re-snapshot would be numbered below the table's window and taken for
    # already applied (a loop), so the remedy is the store's; a snapshot's own table counts too.
    ahead: dict[str, tuple[list[tuple[int, list[str]]], int | None, int | None]] = {
        "holds window 4 of this sync, ahead of the checkpoint store (window 2 merged, window 3": (
            [(3, [])],
            2,
            7,
        ),
        "holds window 4 of this sync, ahead of the checkpoint store (no window merged, window 1": (
            [(1, ["t"])],
            None,
            None,
        ),
    }
    for expected, (windows, seq, version) in ahead.items():
        with pytest.raises(TargetIntegrityError, match=re.escape(expected)) as refused:
            check_targets(plan(windows, seq, version), ok)
        assert "copy that store into this one" in str(refused.value)
        assert "resnapshot_tables" not in str(refused.value)
    check_targets(plan([(4, ["t"])], None, None), ok)  # a snapshot rerun after its Delta commit

    # A window the table holds from another read of the source (its commit's mark): the store
    # planned that seq again from an older position (restored, its staging gone). The same read
    # (a merge rerun after its Delta commit) and a commit without a mark pass.
    held = {"t": TableState(exists=True, txn_version=5, version=10, marks={5: "aaaa"})}
    check_targets(plan([(5, [])], 4, 9), held, {5: "aaaa"})
    check_targets(plan([(5, [])], 4, 9), {"t": TableState(exists=True, txn_version=5, version=10)}, {5: "b"})
    with pytest.raises(TargetIntegrityError) as refused:
        check_targets(plan([(5, []), (6, [])], 4, 9), held, {5: "bbbb", 6: "cccc"})
    text = str(refused.value)
    other = "from another read of the source (read aaaa; the window to merge now is read bbbb)"
    assert f"holds window 5 of this sync {other}" in text, text
    assert "restored from an older backup" in text and "copy that store into this one" in text, text


@pytest.mark.parametrize("mode", ["mirror", "soft_delete", "history", "changelog"])
def test_a_window_the_table_holds_but_the_store_discarded_is_refused_where_it_would_append_twice(
    mode: str,
) -> None:
    """A merge killed after its commit of window 5, whose staged files were then lost: the store
    discarded 5 and window 6 reads its changes again. A history or changelog table would hold
    them twice, so it is refused naming the remedy; a mirror or soft_delete table takes them as
    the same upserts. A window the plan holds (a rerun) is not such a window."""
    from airflow_provider_vitess.exceptions import TargetIntegrityError
    from airflow_provider_vitess.merge.job.integrity import check_targets
    from airflow_provider_vitess.merge.job.steps import TableState
    from airflow_provider_vitess.merge.modes import MODE_PROPERTY

    target = {
        "table": "t",
        "path": "/d/t",
        "key_columns": ["id"],
        "key_from_source": ["id"],
        "shape": {"mode": mode},
    }
    plan = MergePlan.from_json(
        json.dumps(
            {
                "sync_id": "s1",
                "windows": [{"seq": 6, "manifest_path": "/m"}],
                "targets": {"t": {**target, "last_merged_seq": 4, "last_delta_version": 9}},
            }
        )
    )
    built = {MODE_PROPERTY: mode}  # the table was built in the mode
    holds_5 = {"t": TableState(exists=True, txn_version=5, version=10, marks={5: "aaaa"}, properties=built)}
    rerun = dataclasses.replace(plan, windows=(WindowToMerge(5, "/m5"), *plan.windows))
    check_targets(rerun, holds_5, {5: "aaaa", 6: "bbbb"})
    if mode in ("mirror", "soft_delete"):
        check_targets(plan, holds_5, {6: "bbbb"})
        return
    with pytest.raises(TargetIntegrityError) as refused:
        check_targets(plan, holds_5, {6: "bbbb"})
    text = str(refused.value)
    assert "holds window 5 of this sync, which the checkpoint store discarded" in text, text
    assert f"a {mode} table would hold them twice" in text, text
    assert '{"resnapshot_tables": ["t"]}' in text, text


def test_a_windows_mark_names_its_read_and_parses_back() -> None:
    from airflow_provider_vitess.merge.job.marks import commit_mark, parse_mark, read_id
    from airflow_provider_vitess.staging.manifest import Manifest

    def manifest(seq: int, end: Vgtid) -> Manifest:
        return Manifest("s1", seq, START, end, end, {})

    one, again, other = manifest(5, _end(20)), manifest(5, _end(20)), manifest(5, _end(21))
    assert read_id(one) == read_id(again) != read_id(other)
    assert parse_mark(commit_mark(one)) == (5, read_id(one))
    for text in (None, "", "not json", "[1]", '{"vitess_window": true, "read": "x"}', '{"read": "x"}'):
        assert parse_mark(text) is None, text


def _end(n: int) -> Vgtid:
    return Vgtid.from_json(
        f'[{{"keyspace":"customer","shard":"0","gtid":"MariaDB/0-1-{n}","table_p_ks":[]}}]'
    )


def _manifest(stage: Path, seq: int) -> str:
    """A real staged window (no rows): the merge checks a window's files before submitting it."""
    return WindowStager(str(stage), "s1", seq).finish(START, END, END).path


def _staged_backlog(store: CheckpointStore, stage: Path, windows: int, keys: KeyChoice = BY_ID) -> list[int]:
    """Catch-up windows 2.. staged one after the other by one run (each from the last's end)."""
    seqs = []
    for i in range(windows):
        start = END if i == 0 else _end(10 + i)
        seq = store.plan_window("s1", WindowKind.CATCHUP, start, _end(100))
        stats = {"keys": {"t": keys.to_dict()}}
        store.mark_staged("s1", seq, _end(11 + i), _manifest(stage, seq), stats)
        seqs.append(seq)
    return seqs


def _report(plan: MergePlan) -> MergeReport:
    return MergeReport(
        plan.sync_id,
        tuple(
            WindowResult(w.seq, (TableResult("t", "/delta/t", TableStatus.WRITTEN, delta_version=w.seq),))
            for w in plan.windows
        ),
    )


def test_staged_windows_are_merged_by_one_job_and_committed_one_by_one_in_order(
    store: CheckpointStore, tmp_path: Path
) -> None:
    _committed_snapshot(store)
    seqs = _staged_backlog(store, tmp_path, 3)
    plans: list[MergePlan] = []

    def submit(plan: MergePlan) -> MergeReport:
        plans.append(plan)
        return _report(plan)

    outcome = MergeRunner(store, "s1", "/delta", holder="merge").run(submit)
    assert [[w.seq for w in p.windows] for p in plans] == [[2, 3, 4]]  # one Spark job
    assert (outcome.seqs, outcome.seq, outcome.committed_seq) == (tuple(seqs), 4, 4)
    assert store.committed("s1") == (_end(13), 4)
    assert [store.window("s1", s).state for s in seqs] == [WindowState.COMMITTED] * 3
    assert store.target_versions("s1")["t"].merged_seq == 4
    assert outcome.message == f"committed window(s) 2, 3, 4 at {_end(13).to_json()}"


def test_each_merged_windows_version_is_recorded_with_its_format_and_iceberg_snapshot(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """What the job reports of each commit (an Iceberg table's snapshot id) is what the store
    keeps for the consistent cut, window by window; the cut's SQL names the snapshot."""
    _committed_snapshot(store)
    _staged_backlog(store, tmp_path, 2)

    def iceberg(plan: MergePlan) -> MergeReport:
        assert plan.table_format == "iceberg"

        def written(seq: int) -> TableResult:
            return TableResult(
                "t",
                plan.targets["t"].path,
                TableStatus.WRITTEN,
                table_version=seq + 10,
                table_format="iceberg",
                snapshot_id=880000 + seq,
            )

        return MergeReport(plan.sync_id, tuple(WindowResult(w.seq, (written(w.seq),)) for w in plan.windows))

    MergeRunner(store, "s1", "/wh/ns", holder="merge", table_format="iceberg").run(iceberg)
    at_2, at_3 = (consistent_cut(store, "s1", window=seq).tables["t"] for seq in (2, 3))
    assert (at_2.path, at_2.version, at_2.table_format, at_2.snapshot_id) == (
        "/wh/ns/t",
        12,
        "iceberg",
        880002,
    )
    assert (at_3.version, at_3.table_format, at_3.snapshot_id) == (13, "iceberg", 880003)
    catalog = "vitess_c5fb2bb54259"  # "vitess_" and the first 12 hex digits of sha256("/wh")
    assert cut_sql(consistent_cut(store, "s1")) == {
        "t": f"SELECT * FROM `{catalog}`.`ns`.`t` VERSION AS OF 880003"
    }


def test_a_merge_killed_between_windows_commits_what_is_merged_and_merges_the_rest(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _committed_snapshot(store)
    _staged_backlog(store, tmp_path, 3)
    commit = store.commit

    def killed_at_3(sync_id: str, seq: int) -> Vgtid:
        if seq == 3:
            raise KeyboardInterrupt("killed")  # after window 3 was recorded MERGED
        return commit(sync_id, seq)

    monkeypatch.setattr(store, "commit", killed_at_3)
    with pytest.raises(KeyboardInterrupt):
        MergeRunner(store, "s1", "/delta", holder="merge").run(_report)
    states = [store.window("s1", s).state for s in (2, 3, 4)]
    assert states == [WindowState.COMMITTED, WindowState.MERGED, WindowState.STAGED]
    assert store.committed("s1")[1] == 2
    monkeypatch.setattr(store, "commit", commit)

    plans: list[MergePlan] = []

    def submit(plan: MergePlan) -> MergeReport:
        plans.append(plan)
        return _report(plan)

    outcome = MergeRunner(store, "s1", "/delta", holder="merge").run(submit)
    # Window 3's rows are in Delta: committed without a job; only window 4 is submitted again
    # (Delta's transaction version makes it a no-op there if the killed job had written it).
    assert [[w.seq for w in p.windows] for p in plans] == [[4]]
    assert outcome.seqs == (3, 4)
    assert store.committed("s1") == (_end(13), 4)


def test_a_chain_merges_only_windows_staged_with_the_same_keys(
    store: CheckpointStore, tmp_path: Path
) -> None:
    _committed_snapshot(store)
    _staged_backlog(store, tmp_path, 1)
    seq = store.plan_window("s1", WindowKind.CATCHUP, _end(11), _end(100))
    store.mark_staged("s1", seq, _end(12), _manifest(tmp_path, seq), {"keys": {"t": BY_CODE.to_dict()}})
    plans: list[MergePlan] = []

    def submit(plan: MergePlan) -> MergeReport:
        plans.append(plan)
        return _report(plan)

    assert MergeRunner(store, "s1", "/delta", holder="merge").run(submit).seqs == (2,)
    assert MergeRunner(store, "s1", "/delta", holder="merge").run(submit).seqs == (3,)
    assert [(p.windows[0].seq, p.targets["t"].key_columns) for p in plans] == [(2, ("id",)), (3, ("code",))]


def test_a_snapshot_and_discarded_windows_are_deleted_once_a_later_window_is_committed(
    store: CheckpointStore, tmp_path: Path
) -> None:
    stage = tmp_path / "stage"

    def staged(seq: int) -> str:
        manifest = _manifest(stage, seq)
        (stage / "s1" / f"window={seq:010d}" / "t").mkdir(parents=True)
        (stage / "s1" / f"window={seq:010d}" / "t" / "part-00001.parquet").write_bytes(b"x")
        return manifest

    runner = MergeRunner(store, "s1", "/delta", holder="merge")
    seq = store.plan_window("s1", WindowKind.SNAPSHOT, START)
    store.mark_staged("s1", seq, END, staged(seq))
    runner.run(_report)
    assert (stage / "s1" / "window=0000000001").exists()  # the only copy of the tables' state
    seq = store.plan_window("s1", WindowKind.CATCHUP, END, _end(100))
    store.mark_staged("s1", seq, _end(11), staged(seq))
    store.discard_unmerged("s1", "files lost")  # window 2: its changes are read again by window 3
    seq = store.plan_window("s1", WindowKind.CATCHUP, END, _end(100))
    store.mark_staged("s1", seq, _end(11), staged(seq))
    runner.run(_report)
    # Not 20 windows later: the snapshot's copy and the discarded window are read by no merge.
    assert sorted(p.name for p in (stage / "s1").iterdir()) == ["window=0000000003"]


@pytest.mark.parametrize("loss", ["part deleted", "part truncated", "manifest deleted"])
def test_a_staged_window_whose_files_are_lost_goes_back_to_capture_whichever_merge_meets_it(
    store: CheckpointStore, tmp_path: Path, loss: str
) -> None:
    """A merge cannot bring lost files back, so a rerun of it would fail forever: the window is
    discarded (with the staged windows after it) for the next catch-up to read again, the task
    fails saying so, and its retry finds nothing to merge."""
    _committed_snapshot(store)
    seq = store.plan_window("s1", WindowKind.CATCHUP, END, _end(100))
    stager = WindowStager(str(tmp_path), "s1", seq)
    stager.set_schema("customer", "t", [query_pb2.Field(name="id", type=query_pb2.INT64)])
    stager.add_change("customer", "t", "-80", Operation.INSERT, 1, 1, None, (7,))
    manifest = stager.finish(END, _end(100), _end(11))
    store.mark_staged("s1", seq, _end(11), manifest.path, {"keys": {"t": BY_ID.to_dict()}})
    window = tmp_path / "s1" / f"window={seq:010d}"
    part = window / manifest.tables["t"].parts[0].path
    if loss == "part deleted":
        part.unlink()
    elif loss == "part truncated":
        part.write_bytes(part.read_bytes()[:10])
    else:
        (window / "_manifest.json").unlink()

    with pytest.raises(
        StagedWindowLostError, match=rf"catchup window {seq} was staged but .*: it was discarded"
    ):
        MergeRunner(store, "s1", "/delta", holder="merge_snapshot").run(_never)
    assert store.window("s1", seq).state is WindowState.FAILED
    assert store.committed("s1") == (END, 1) and store.open_window("s1") is None
    assert not window.exists(), "the lost window's remains were left behind"
    assert not is_permanent(StagedWindowLostError("x")), "its retry must run"
    outcome = MergeRunner(store, "s1", "/delta", holder="merge_snapshot").run(_never)
    assert (outcome.seq, outcome.committed_seq) == (None, 1)


def test_a_syncs_records_stay_bounded_per_window_over_chains_and_time(tmp_path: Path) -> None:
    """200 tables (the bench keyspace's size), 9 runs staging chains of 3 and of 1 window (20
    windows in all): what each window keeps and the rows the store holds stay flat, and the
    plan grows with the chain only."""
    from sqlalchemy import func, select

    from airflow_provider_vitess.checkpoints.models import TableProgressRow, WindowPartRow, WindowRow

    tables = [f"t{i:03d}" for i in range(200)]
    keys = {t: KeyChoice(t, ("id",), ("id",), "PRIMARY", "primary key", ("id",)).to_dict() for t in tables}
    store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    store.ensure_sync("s1", "customer", tables, {"keys": keys})
    seq = store.plan_window("s1", WindowKind.SNAPSHOT, START)
    for t in tables:
        store.update_progress("s1", seq, t, phase="copied", key_columns=["id"], key_source="primary key")
    store.mark_staged("s1", seq, END, _manifest(tmp_path, seq))
    store.mark_merged("s1", seq, dict.fromkeys(tables, 1))
    store.commit("s1", seq)

    def report(plan: MergePlan) -> MergeReport:
        return MergeReport(
            plan.sync_id,
            tuple(
                WindowResult(
                    w.seq,
                    tuple(
                        TableResult(t, f"/delta/{t}", TableStatus.WRITTEN, delta_version=w.seq)
                        for t in tables
                    ),
                )
                for w in plan.windows
            ),
        )

    plans: list[MergePlan] = []

    def submit(plan: MergePlan) -> MergeReport:
        plans.append(plan)
        return report(plan)

    def rows(model: type) -> int:
        with store.engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(model)) or 0)

    runner = MergeRunner(store, "s1", "/delta", holder="merge", keep_window_records=10)
    end, kept_sizes, counts = END, [], []
    for run in range(9):
        for _ in range(3 if run % 2 == 0 else 1):  # a backlog: one run, three windows, one job
            seq = store.plan_window("s1", WindowKind.CATCHUP, end, _end(10_000))
            for t in tables:
                store.update_progress("s1", seq, t, phase="streaming")
            end = _end(100 + seq)
            store.mark_staged("s1", seq, end, _manifest(tmp_path, seq), {"keys": keys})
        outcome = runner.run(submit)
        assert outcome.report is not None and [w.seq for w in outcome.report.windows] == list(outcome.seqs)
        kept_sizes += [len(json.dumps(store.window("s1", s).stats)) for s in outcome.seqs]
        counts.append((rows(WindowRow), rows(TableProgressRow), rows(WindowPartRow)))
    # Each window keeps its own results: the same size in a chain of three as alone.
    assert len(kept_sizes) == 19
    assert max(kept_sizes) < 1.01 * min(kept_sizes), (min(kept_sizes), max(kept_sizes))
    # The newest 10 windows and the snapshot (the tables' latest progress is in the newest).
    assert counts[-1] == counts[4] == (10, 10 * 200, 0), counts
    assert store.committed("s1")[1] == 20 and store.window("s1", 20).state is WindowState.COMMITTED
    # A plan names its windows and 200 tables, whatever the sync's age.
    sizes = {n: {len(p.to_json()) for p in plans if len(p.windows) == n} for n in (1, 3)}
    assert all(max(s) < 1.02 * min(s) for s in sizes.values()), sizes
