"""A backlog longer than one window, read by one run as consecutive bounded windows.

A sync that comes back after an outage has hours of changes to read. One window is bounded
(``max_events``: what one merge applies and what a killed read re-reads), so one window per run
would take as many runs as the backlog has windows. Instead a catch-up run stages window after
window while its time budget (``max_seconds``) lasts: window N+1 starts at window N's end VGTID
and reads towards the same stop position (the keyspace's position when the run's first window
was planned), so a run ends once it reached where the source was when it started, even under a
steady write load. The merge task then merges every STAGED window in one Spark job, in order,
each its own Delta commit (transaction version = its seq), and commits them one by one.

Every window is a normal window of the state machine (PLANNED -> STAGED), recorded before the
next is planned, so a kill at any point leaves at most one PLANNED window (resumed by the next
run) behind STAGED ones (kept). See docs/design.md, "Long backlogs".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_vitess.capture.outcome import WindowOutcome
from airflow_provider_vitess.capture.runner import CaptureRunner
from airflow_provider_vitess.checkpoints import WindowState
from airflow_provider_vitess.vstream.window import ReadBounds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BacklogOutcome:
    """The windows one run staged (or found staged), in order, and why it read no further."""

    windows: tuple[WindowOutcome, ...]
    stopped: str  # "caught up", or the bound that ended the run

    @property
    def last(self) -> WindowOutcome:
        return self.windows[-1]

    @property
    def rows(self) -> int:
        return sum(w.manifest.rows for w in self.windows)


def _window_bounds(bounds: ReadBounds, remaining: float | None) -> ReadBounds:
    return ReadBounds(max_events=bounds.max_events, max_seconds=remaining)


def catch_up_backlog(
    runner: CaptureRunner,
    bounds: ReadBounds | None = None,
    *,
    max_windows: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BacklogOutcome:
    """Stage catch-up windows of at most ``bounds.max_events`` changes each until the sync
    reaches the stop position of its first window, the run's ``bounds.max_seconds`` are spent
    (they bound the whole run: each window reads for what is left of them), or ``max_windows``
    windows were staged. The first window is :meth:`CaptureRunner.catch_up`'s: a resumed or an
    already staged window counts as the run's first (one that an earlier run's budget ended
    early is followed by more windows, as one that ``max_events`` ended)."""
    bounds = bounds or ReadBounds()
    started = clock()

    def remaining() -> float | None:
        return None if bounds.max_seconds is None else bounds.max_seconds - (clock() - started)

    runner.recheck_staged()  # a chain an earlier run staged: a lost window is read again
    outcomes = [runner.catch_up(_window_bounds(bounds, remaining()))]
    while True:
        last = outcomes[-1].manifest
        reason = str(last.stats.get("stopped_early") or "")
        left = remaining()
        lag = dict(last.stats.get("shard_lag_transactions") or {})
        if not reason or not any(lag.values()):
            # It reached its stop (a bound may have been met on its very last transaction).
            stopped = "caught up"
            break
        if left is not None and left <= 0:
            stopped = f"max_seconds={bounds.max_seconds:g}"
            break
        if max_windows is not None and len(outcomes) >= max_windows:
            stopped = f"max_windows={max_windows}"
            break
        if last.end_vgtid == last.start_vgtid:
            # The merge order held every unit back (another shard behind): the next run goes on.
            # (A time bound never cuts a transaction: it reads on to its end.)
            stopped = "no progress"
            break
        if any(w.state is WindowState.MERGED for w in runner.store.open_windows(runner.spec.sync_id)):
            # A merge killed before committing: no window may follow until it is committed
            # (the merge task does that first thing); the run's windows are merged meanwhile.
            stopped = "an unfinished merge"
            break
        # The same stop: the run catches up to where the source was when it started. After a
        # reshard the stop may name retired shards: ask vtgate for a fresh one instead.
        stop = None if last.stats.get("retired_shards") else last.stop_vgtid
        log.info(
            "sync %r window %d ended at %s with more to read; staging the next window",
            runner.spec.sync_id,
            outcomes[-1].seq,
            reason,
        )
        outcomes.append(runner.catch_up(_window_bounds(bounds, left), extend=True, stop=stop))
    return BacklogOutcome(tuple(outcomes), stopped)
