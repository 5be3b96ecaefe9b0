"""One writer at a time, fenced: a capture process that stalls past its lock's expiry (SIGSTOP)
while another run takes the sync over cannot write anything after it wakes (SIGCONT): every
store write under the lock names the lock's token and is refused once the lock changed hands,
and its staged files never take the names of the new holder's. The window the new holder
stages equals the source, row for row, with no row staged twice.

The store here is a SQLite file, whose locks are the file's: a process frozen inside a store
transaction would block every other process's reads and writes ("database is locked"), which
is SQLite's nature and not what is tested. So each freeze lands where the frozen process holds
no store lock (checked by taking the file's exclusive lock; if it is held, the process runs on
a moment and is frozen again).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import load_manifest
from tests.support import capture_child
from tests.support.big_table import BIG_ROWS, copied_rows, select_all, staged_rows
from tests.support.capture_child import ChildSpec
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

SYNC = "fenced"


def _start(spec: ChildSpec) -> subprocess.Popen[str]:
    return capture_child.start("snapshot", spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stopped(proc: subprocess.Popen[str]) -> bool:
    """Whether ``proc`` is stopped (SIGSTOP); fails if it ended instead."""
    assert proc.poll() is None, f"the process ended ({proc.returncode}): {proc.communicate()[1][-3000:]}"
    state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def _freeze_outside_a_store_transaction(proc: subprocess.Popen[str], db: Path) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock on the SQLite store ``db``."""
    for _ in range(200):
        proc.send_signal(signal.SIGSTOP)
        _wait("the process to stop", lambda: _stopped(proc), timeout=10)
        probe = sqlite3.connect(db, timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN EXCLUSIVE")  # fails while any other process holds a lock on db
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError as err:
            assert "locked" in str(err), err
        finally:
            probe.close()
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError(f"pid {proc.pid} held the store's lock at every one of 200 freezes")


def _wait(what: str, done: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_stalled_holder_cannot_write_after_another_run_took_the_sync(
    vitess: LocalVitess,
    big_table: str,
    tmp_path: Path,
) -> None:
    connection = connection_uri_env("vitess_fenced", vitess)
    spec = ChildSpec.in_dir(tmp_path, SYNC, "commerce", ("big",), connection, lock_stale_seconds=3)
    db = tmp_path / "store.db"
    observer = CheckpointStore(spec.store_url)
    stalled = _start(spec)
    try:
        _wait("the first run to record some copied rows", lambda: copied_rows(observer, SYNC) >= 20_000)
        _freeze_outside_a_store_transaction(stalled, db)  # a frozen worker: no heartbeat, no progress
        first = observer.lock_holder(SYNC)
        assert first is not None and first.holder == f"pid {stalled.pid}"
        copied_before = copied_rows(observer, SYNC)
        time.sleep(4)  # past the lock's expiry

        # The new holder stops itself after copying 12,000 rows (two checkpoints): it is held
        # mid-copy while the old one wakes up, which must meet the sync taken, not finished.
        taker = _start(dataclasses.replace(spec, pause_after_rows=12_000))
        _wait("the second run to take the sync over and stop mid-copy", lambda: _stopped(taker), timeout=180)
        _freeze_outside_a_store_transaction(taker, db)  # its heartbeat thread may have been mid-write
        holder = observer.lock_holder(SYNC)
        assert holder is not None and holder.holder == f"pid {taker.pid}"
        assert copied_rows(observer, SYNC) > copied_before  # it copied on from the checkpoint
        stalled.send_signal(signal.SIGCONT)  # wakes up mid-copy of the new holder, still "holding"
        out, err = stalled.communicate(timeout=300)
        taker.send_signal(signal.SIGCONT)
        taken_out, taken_err = taker.communicate(timeout=600)
    finally:
        for proc in (stalled, locals().get("taker")):
            if isinstance(proc, subprocess.Popen) and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()

    assert stalled.returncode != 0, f"the stalled run went on writing:\n{out}\n{err[-3000:]}"
    # The run itself ended on the refusal of its next write (not only its heartbeat thread).
    refusal = [
        line
        for line in err.splitlines()
        if line.startswith("airflow_provider_vitess.exceptions.SyncLockedError:")
    ]
    assert refusal, err[-3000:]
    assert f"'pid {stalled.pid}' lost its lock: sync '{SYNC}' is locked by 'pid {taker.pid}'" in refusal[-1]
    assert "was refused and nothing of it was stored" in refusal[-1]
    assert taker.returncode == 0, taken_err[-3000:]
    assert json.loads(taken_out.strip().splitlines()[-1]) == {"seq": 1, "resumed": True}

    window = observer.window(SYNC, 1)
    assert window.state is WindowState.STAGED
    manifest = load_manifest(spec.staging, SYNC, 1)
    assert manifest is not None
    staged, n = staged_rows(manifest, "big")
    source = select_all(VitessHook("vitess_big"), "commerce", "big")
    assert staged == source
    assert n == len(source) == BIG_ROWS  # no row staged twice, none lost
