"""The consistent cut's rules on a real (SQLite) checkpoint store: which version each table has at
a window, idle tables carried forward, refusals named, and pruning that keeps the oldest cut whole."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.consistent_reads import consistent_cut
from airflow_provider_vitess.exceptions import CutUnavailableError
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
PATHS = {"a": "/lake/a", "b": "/lake/b"}


def _vgtid(n: int) -> Vgtid:
    return Vgtid((ShardGtid("ks", "0", f"MariaDB/0-1-{n}"),))


class Sync:
    def __init__(self, tmp_path: Path) -> None:
        self.now = T0
        self.store = CheckpointStore(f"sqlite:///{tmp_path / 'store.db'}", clock=lambda: self.now)
        self.store.migrate()
        self.store.ensure_sync("s", "ks", ["a", "b"], {})
        self.end = 0

    def window(self, targets: dict[str, int | None], *, commit: bool = True) -> int:
        kind = WindowKind.SNAPSHOT if self.end == 0 else WindowKind.CATCHUP
        seq = self.store.plan_window("s", kind, _vgtid(self.end))
        self.end += 1
        self.store.mark_staged("s", seq, _vgtid(self.end), f"/stage/{seq}/_manifest.json")
        self.now += timedelta(minutes=1)
        self.store.mark_merged("s", seq, targets, paths=PATHS)
        if commit:
            self.store.commit("s", seq)
        return seq

    def cut(self, **kw: object) -> tuple[int, dict[str, tuple[int, int]]]:
        taken = consistent_cut(self.store, "s", **kw)  # type: ignore[arg-type]
        return taken.seq, {t: (v.version, v.seq) for t, v in taken.tables.items()}


@pytest.fixture
def sync(tmp_path: Path) -> Sync:
    return Sync(tmp_path)


def test_each_table_has_the_version_of_its_latest_write_at_or_before_the_window(sync: Sync) -> None:
    with pytest.raises(CutUnavailableError, match="no committed window yet"):
        sync.cut()
    sync.window({"a": 0, "b": 0})  # 1: the snapshot
    sync.window({"a": 1})  # 2: b idle
    sync.window({"b": 1})  # 3: a idle
    sync.window({"a": 2, "b": 2})  # 4
    assert sync.cut(window=1) == (1, {"a": (0, 1), "b": (0, 1)})
    assert sync.cut(window=2) == (2, {"a": (1, 2), "b": (0, 1)})
    assert sync.cut(window=3) == (3, {"a": (1, 2), "b": (1, 3)})
    assert sync.cut() == (4, {"a": (2, 4), "b": (2, 4)})
    # By time: windows were merged at T0+1, +2, +3, +4 minutes.
    assert sync.cut(as_of=T0 + timedelta(minutes=2, seconds=30))[0] == 2
    with pytest.raises(CutUnavailableError, match="no window it keeps versions for was merged by"):
        sync.cut(as_of=T0)


def test_a_window_not_committed_is_refused_and_not_in_the_committed_cut(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0})
    sync.window({"a": 1, "b": 1}, commit=False)  # MERGED: in Delta, not committed
    assert sync.cut() == (1, {"a": (0, 1), "b": (0, 1)})
    with pytest.raises(CutUnavailableError, match=r"window 2 is not committed .*committed up to window 1"):
        sync.cut(window=2)


def test_a_table_without_a_delta_table_is_left_out(sync: Sync) -> None:
    sync.window({"a": 0, "b": None})  # b's snapshot was empty: no Delta table
    assert sync.cut() == (1, {"a": (0, 1)})


def test_pruning_keeps_the_oldest_kept_cut_whole_and_refuses_older_ones(sync: Sync) -> None:
    sync.window({"a": 0, "b": 0})  # 1
    sync.window({"a": 1})  # 2
    sync.window({"a": 2})  # 3
    sync.window({"a": 3})  # 4
    sync.store.prune_windows("s", keep=2)  # keeps windows 3 and 4
    assert sync.cut(window=3) == (3, {"a": (2, 3), "b": (0, 1)}), "b's version from window 1 stays"
    with pytest.raises(CutUnavailableError, match=r"window 2 is older than the oldest window .* \(3\)"):
        sync.cut(window=2)
    # The next capture task rewrites the sync's config: the limit is not in it, so it stays.
    sync.store.ensure_sync("s", "ks", ["a", "b"], {"staging": "/stage"})
    with pytest.raises(CutUnavailableError, match=r"window 2 is older than the oldest window .* \(3\)"):
        sync.cut(window=2)
