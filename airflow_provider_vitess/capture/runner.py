"""Both jobs of one sync on one object: what tools, tests and benchmarks drive (the operators
use :class:`~.snapshot.SnapshotRun` and :class:`~.catch_up.CatchUpRun`, one each)."""

from __future__ import annotations

from airflow_provider_vitess.capture.catch_up import BacklogOutcome, CatchUpRun
from airflow_provider_vitess.capture.outcome import SnapshotNeed, WindowOutcome
from airflow_provider_vitess.capture.snapshot import CHECKPOINT_EVERY_ROWS, SnapshotRun
from airflow_provider_vitess.capture.spec import SyncSpec

__all__ = [
    "CHECKPOINT_EVERY_ROWS",
    "BacklogOutcome",
    "CaptureRunner",
    "SnapshotNeed",
    "SyncSpec",
    "WindowOutcome",
]


class CaptureRunner(SnapshotRun, CatchUpRun):
    """A sync's snapshot and catch-up runs (see :class:`~.run.SyncRun` for the arguments)."""
