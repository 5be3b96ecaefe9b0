"""Staged windows go once no later merge can read them (``staging/retention.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging.retention import (
    MAX_WINDOWS_BACK,
    prunable,
    prune_after_commit,
    prune_committed,
)


def _stage(root: Path, sync_id: str, seqs: range) -> None:
    for seq in seqs:
        part = root / sync_id / f"window={seq:010d}" / "t" / "part-00001.parquet"
        part.parent.mkdir(parents=True)
        part.write_bytes(b"x")
        (root / sync_id / f"window={seq:010d}" / "_manifest.json").write_text("{}")


def test_committed_windows_beyond_the_merge_look_back_are_deleted_the_rest_kept(tmp_path: Path) -> None:
    _stage(tmp_path, "s1", range(1, 31))
    _stage(tmp_path, "s2", range(1, 3))  # another sync's windows are not touched
    committed = 25
    gone = prune_committed(str(tmp_path), "s1", committed)
    # The next merge (window 26) may read back to window 26 - MAX_WINDOWS_BACK = 6: kept.
    assert gone == list(range(1, committed + 1 - MAX_WINDOWS_BACK)) == [1, 2, 3, 4, 5]
    left = sorted(int(p.name[7:]) for p in (tmp_path / "s1").iterdir())
    assert left == list(range(6, 31))  # 26..30 are not committed: never deleted
    assert len(list((tmp_path / "s2").iterdir())) == 2
    assert prune_committed(str(tmp_path), "s1", committed) == []  # a rerun finds nothing more
    assert prune_committed(str(tmp_path), "no-such-sync", committed) == []


def test_keep_may_grow_but_never_below_the_look_back() -> None:
    assert prunable(30, list(range(1, 31)), keep=25) == [1, 2, 3, 4, 5]
    assert prunable(10, list(range(1, 11))) == []
    with pytest.raises(StagingError, match="fewer than a merge may read back"):
        prunable(30, list(range(1, 31)), keep=MAX_WINDOWS_BACK - 1)


def test_prune_after_commit_reads_location_sync_and_seq_from_the_manifest_path(tmp_path: Path) -> None:
    _stage(tmp_path, "s1", range(1, 24))
    manifest = tmp_path / "s1" / f"window={23:010d}" / "_manifest.json"
    assert prune_after_commit(str(manifest)) == [1, 2, 3]
    assert prune_after_commit(f"file://{manifest}") == []
    with pytest.raises(StagingError, match="not a staged window's manifest path"):
        prune_after_commit(str(tmp_path / "s1" / "elsewhere.json"))
