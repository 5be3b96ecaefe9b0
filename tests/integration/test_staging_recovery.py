"""A staged but uncommitted window whose files are lost or corrupt is read again, not wedged.

Real vtgate, real checkpoint store (SQLite), real local staging; the merge side is the store's
own ``mark_merged`` + ``commit`` (what the merge task records once Delta has the window).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.capture.backlog import catch_up_backlog
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import read_table
from airflow_provider_vitess.staging.manifest import Manifest
from airflow_provider_vitess.vstream.window import ReadBounds
from tests.conftest import LocalVitess, connection_uri_env
from tests.integration import test_faults as faults

pytestmark = pytest.mark.integration


def _changes(manifest: Manifest) -> list[tuple[Any, ...]]:
    rows = read_table(manifest, faults.TABLE).to_pylist()
    return sorted((r["_op"], r["id"], r["payload"]) for r in rows)


@pytest.mark.parametrize("loss", ["part corrupt", "part missing", "manifest missing"])
def test_lost_or_corrupt_staged_window_is_discarded_and_read_again(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any, loss: str
) -> None:
    env, value = connection_uri_env("vitess_recovery", vitess)
    monkeypatch.setenv(env, value)
    hook = VitessHook("vitess_recovery")
    faults._setup(hook)
    rng = random.Random(7)
    faults._insert(hook, rng, range(1, 11))
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec("recover", "customer", (faults.TABLE,), str(tmp_path / "staging"))
    runner = CaptureRunner(hook, store, spec, holder="test")
    snap = runner.snapshot()
    store.mark_merged(spec.sync_id, snap.seq)
    store.commit(spec.sync_id, snap.seq)

    faults._insert(hook, rng, range(11, 31))
    first = runner.catch_up()
    expected = _changes(first.manifest)
    assert len(expected) == 20
    wdir = tmp_path / "staging" / "recover" / f"window={first.seq:010d}"
    part = next(wdir.glob(f"{faults.TABLE}/part-*.parquet"))
    if loss == "part corrupt":
        part.write_bytes(part.read_bytes()[:-10] + b"0123456789")
    elif loss == "part missing":
        part.unlink()
    else:
        (wdir / "_manifest.json").unlink()

    with caplog.at_level(logging.WARNING):
        again = runner.catch_up()
    assert again.seq == first.seq + 1 and again.result is not None  # a new window, really read
    assert store.window(spec.sync_id, first.seq).state is WindowState.FAILED
    assert "discarding it and reading its changes again" in caplog.text
    assert not wdir.exists()  # nothing of the lost window is left for a merge to trip on
    assert _changes(again.manifest) == expected
    assert again.manifest.start_vgtid == first.manifest.start_vgtid


def test_a_backlog_is_staged_as_a_chain_and_a_lost_window_in_it_is_read_again_with_the_rest(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env, value = connection_uri_env("vitess_recovery", vitess)
    monkeypatch.setenv(env, value)
    hook = VitessHook("vitess_recovery")
    faults._setup(hook)
    rng = random.Random(8)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec("chain", "customer", (faults.TABLE,), str(tmp_path / "staging"))
    runner = CaptureRunner(hook, store, spec, holder="test")
    snap = runner.snapshot()
    store.mark_merged(spec.sync_id, snap.seq)
    store.commit(spec.sync_id, snap.seq)
    for first in range(1, 61, 5):  # 12 transactions of 5 rows
        faults._insert(hook, rng, range(first, first + 5))

    chain = catch_up_backlog(runner, ReadBounds(max_events=15))
    assert chain.stopped == "caught up"
    assert len(chain.windows) >= 3, [w.manifest.rows for w in chain.windows]
    ends = [w.manifest.end_vgtid for w in chain.windows[:-1]]
    assert [w.manifest.start_vgtid for w in chain.windows[1:]] == ends
    expected = sorted(r for w in chain.windows for r in _changes(w.manifest))
    assert len(expected) == 60 and len(set(expected)) == 60
    seqs = [w.seq for w in chain.windows]
    assert [w.seq for w in store.open_windows(spec.sync_id)] == seqs  # STAGED, for one merge

    # The merge failed and, meanwhile, the second window's manifest was lost: the windows from it
    # on are discarded (they start where it ends) and read again from the first window's end.
    (tmp_path / "staging" / "chain" / f"window={seqs[1]:010d}" / "_manifest.json").unlink()
    again = catch_up_backlog(runner, ReadBounds(max_events=15))
    assert [store.window(spec.sync_id, s).state for s in seqs[1:]] == [WindowState.FAILED] * (len(seqs) - 1)
    assert again.windows[0].seq == seqs[0] and again.windows[0].result is None  # kept, not re-read
    assert again.windows[1].manifest.start_vgtid == chain.windows[0].manifest.end_vgtid
    assert sorted(r for w in again.windows for r in _changes(w.manifest)) == expected
    assert [w.seq for w in store.open_windows(spec.sync_id)] == [w.seq for w in again.windows]
