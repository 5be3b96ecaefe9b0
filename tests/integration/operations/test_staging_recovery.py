"""A staged but uncommitted window whose files are lost or corrupt is read again, not wedged.

Real vtgate, real checkpoint store (SQLite), real local staging; the merge side is the store's
own ``mark_merged`` + ``commit`` (what the merge task records once Delta has the window).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import read_table
from airflow_provider_vitess.staging.manifest import Manifest
from airflow_provider_vitess.vstream.window import ReadBounds
from tests.support import fault_rows
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration


def _changes(manifest: Manifest) -> list[tuple[Any, ...]]:
    if fault_rows.TABLE not in manifest.tables:
        return []  # a window that read only other tables' transactions
    rows = read_table(manifest, fault_rows.TABLE).to_pylist()
    return sorted((r["_op"], r["id"], r["payload"]) for r in rows)


def _snapshotted(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sync_id: str, rng: random.Random
) -> tuple[VitessHook, CheckpointStore, CaptureRunner]:
    """A fresh table with 10 rows, snapshotted and committed by sync ``sync_id``."""
    env, value = connection_uri_env("vitess_recovery", vitess)
    monkeypatch.setenv(env, value)
    hook = VitessHook("vitess_recovery")
    fault_rows.setup_table(hook)
    fault_rows.insert_rows(hook, rng, range(1, 11))
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    spec = SyncSpec(sync_id, "customer", (fault_rows.TABLE,), str(tmp_path / "staging"))
    runner = CaptureRunner(hook, store, spec, holder="test")
    snap = runner.snapshot()
    store.mark_merged(spec.sync_id, snap.seq)
    store.commit(spec.sync_id, snap.seq)
    return hook, store, runner


@pytest.mark.parametrize("loss", ["part corrupt", "part missing", "manifest missing"])
def test_lost_or_corrupt_staged_window_is_discarded_and_read_again(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any, loss: str
) -> None:
    rng = random.Random(7)
    hook, store, runner = _snapshotted(vitess, monkeypatch, tmp_path, "recover", rng)
    spec = runner.spec

    fault_rows.insert_rows(hook, rng, range(11, 31))
    first = runner.catch_up()
    expected = _changes(first.manifest)
    assert len(expected) == 20
    wdir = tmp_path / "staging" / "recover" / f"window={first.seq:010d}"
    part = next(wdir.glob(f"{fault_rows.TABLE}/part-*.parquet"))
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
    rng = random.Random(8)
    hook, store, runner = _snapshotted(vitess, monkeypatch, tmp_path, "chain", rng)
    spec = runner.spec
    for first in range(101, 161, 10):  # 6 transactions of 10 rows, in different commit seconds
        fault_rows.insert_rows(hook, rng, range(first, first + 10))
        time.sleep(1.1)  # (units of one second may be released together, past max_events)

    chain = runner.backlog(ReadBounds(max_events=10))
    assert chain.stopped == "caught up"
    assert len(chain.windows) >= 2, [w.manifest.rows for w in chain.windows]
    ends = [w.manifest.end_vgtid for w in chain.windows[:-1]]
    assert [w.manifest.start_vgtid for w in chain.windows[1:]] == ends
    expected = sorted(r for w in chain.windows for r in _changes(w.manifest))
    assert len(expected) == 60 and len(set(expected)) == 60
    seqs = [w.seq for w in chain.windows]
    assert [w.seq for w in store.open_windows(spec.sync_id)] == seqs  # STAGED, for one merge

    # The merge failed and, meanwhile, the first window's manifest was lost: the windows from it
    # on are discarded (they start where it ends) and read again from the committed position.
    # (catch_up checks only the latest STAGED window: the backlog run rechecks the others.)
    (tmp_path / "staging" / "chain" / f"window={seqs[0]:010d}" / "_manifest.json").unlink()
    again = runner.backlog(ReadBounds(max_events=10))
    assert [store.window(spec.sync_id, s).state for s in seqs] == [WindowState.FAILED] * len(seqs)
    assert again.windows[0].seq == seqs[-1] + 1 and again.windows[0].result is not None
    assert again.windows[0].manifest.start_vgtid == chain.windows[0].manifest.start_vgtid
    assert sorted(r for w in again.windows for r in _changes(w.manifest)) == expected
    assert [w.seq for w in store.open_windows(spec.sync_id)] == [w.seq for w in again.windows]
