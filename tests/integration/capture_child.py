"""Runs one capture (snapshot or catch-up window) in a process of its own, so tests can SIGKILL it.

Usage: python -m tests.integration.capture_child snapshot|catchup <spec json>
The spec JSON holds the sync spec, the store URL and the Airflow connection (as env).
Prints one JSON line with the outcome when it finishes. With ``"kill_after_journal": true`` it
SIGKILLs itself at the first row of a new shard staged after a reshard's journal (printing
``KILLED-AFTER-JOURNAL`` first): the journal is staged, the window not STAGED yet. With
``"pause_after_rows": n`` it SIGSTOPs itself once it has copied n rows.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from datetime import timedelta
from typing import Any

from airflow_provider_vitess.capture.progress import ProgressTracker
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vstream.window import ReadBounds, WindowReader


def _kill_after_journal() -> None:
    pass_journal = WindowReader._pass_journal

    def passing(reader: WindowReader, unit: Any, journal: Any) -> None:
        pass_journal(reader, unit, journal)
        new_shards = {sg.shard for sg in journal.shard_gtids}
        add_rows = reader._stager.add_rows

        def adding(keyspace: str, table: str, shard: str, *rest: Any) -> None:
            add_rows(keyspace, table, shard, *rest)
            if shard in new_shards:
                print(f"KILLED-AFTER-JOURNAL at a row of {keyspace}/{shard}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        reader._stager.add_rows = adding  # type: ignore[method-assign,assignment]

    WindowReader._pass_journal = passing  # type: ignore[method-assign,assignment]


def _pause_after_rows(rows: int) -> None:
    """SIGSTOP this process once this run has copied ``rows`` rows (printing
    ``PAUSED-AFTER-ROWS`` first): a test holds it there mid-copy, holding the sync's lock."""
    add_copied = ProgressTracker.add_copied
    copied = [0]

    def adding(tracker: ProgressTracker, table: str, n: int) -> None:
        add_copied(tracker, table, n)
        copied[0] += n
        if copied[0] - n < rows <= copied[0]:
            print(f"PAUSED-AFTER-ROWS {copied[0]}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    ProgressTracker.add_copied = adding  # type: ignore[method-assign,assignment]


def main() -> None:
    kind, raw = sys.argv[1], json.loads(sys.argv[2])
    os.environ.update(raw["env"])
    # To stderr: stdout carries the outcome line (and Airflow's logging config would print there).
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    if raw.get("kill_after_journal"):
        _kill_after_journal()
    if raw.get("pause_after_rows"):
        _pause_after_rows(int(raw["pause_after_rows"]))
    spec = SyncSpec(
        sync_id=raw["sync_id"],
        keyspace=raw["keyspace"],
        tables=tuple(raw["tables"]),
        staging_location=raw["staging"],
    )
    store = CheckpointStore(raw["store_url"])
    runner = CaptureRunner(
        VitessHook(raw["conn_id"]),
        store,
        spec,
        holder=f"pid {os.getpid()}",
        lock_stale_after=timedelta(seconds=raw.get("lock_stale_seconds", 120)),
    )
    if kind == "snapshot":
        outcome = runner.snapshot(checkpoint_every_rows=raw.get("checkpoint_every_rows", 5000))
    else:
        outcome = runner.catch_up(ReadBounds(max_events=raw.get("max_events")))
    print(json.dumps({"seq": outcome.seq, "resumed": outcome.resumed}), flush=True)


if __name__ == "__main__":
    main()
