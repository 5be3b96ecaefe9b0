"""The catch-up job: one bounded window from the committed position, or a chain of them.

A window reads from the committed VGTID to the stop position captured when it was planned and
stored with it, so a rerun of a killed window reads exactly the same changes again.

A backlog longer than one window (``max_events``) is read by one run as a chain: window N+1
starts at window N's end and reads towards the same stop, while the run's ``max_seconds`` last;
the merge task merges the chain in one Spark job, each window its own Delta commit. Every window
is recorded STAGED before the next is planned, so a kill leaves at most one PLANNED window
behind STAGED ones. See docs/design.md, "Long backlogs".
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.capture.outcome import WindowOutcome
from airflow_provider_vitess.capture.run import SyncRun
from airflow_provider_vitess.checkpoints import WindowKind, WindowState
from airflow_provider_vitess.checkpoints.freshness import STOP_TAKEN_AT
from airflow_provider_vitess.exceptions import CheckpointError
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.source_clock import stop_and_time
from airflow_provider_vitess.vstream.window import ReadBounds, WindowReader

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


class CatchUpRun(SyncRun):
    """The catch-up task's run: a window, or a backlog's chain of windows."""

    def backlog(
        self,
        bounds: ReadBounds | None = None,
        *,
        max_windows: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> BacklogOutcome:
        """Stage catch-up windows of at most ``bounds.max_events`` changes each until the sync
        reaches the stop position of its first window, the run's ``bounds.max_seconds`` are spent
        (they bound the whole run: each window reads for what is left of them), or ``max_windows``
        windows were staged. The first window is :meth:`catch_up`'s: a resumed or an
        already staged window counts as the run's first (one that an earlier run's budget ended
        early is followed by more windows, as one that ``max_events`` ended)."""
        bounds = bounds or ReadBounds()
        started = clock()

        def remaining() -> float | None:
            return None if bounds.max_seconds is None else bounds.max_seconds - (clock() - started)

        self.recheck_staged()  # a chain an earlier run staged: a lost window is read again
        outcomes = [self.catch_up(_window_bounds(bounds, remaining()))]
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
            if any(w.state is WindowState.MERGED for w in self.store.open_windows(self.spec.sync_id)):
                # A merge killed before committing: no window may follow until it is committed
                # (the merge task does that first thing); the run's windows are merged meanwhile.
                stopped = "an unfinished merge"
                break
            # The same stop: the run catches up to where the source was when it started. After a
            # reshard the stop may name retired shards: ask vtgate for a fresh one instead.
            stop = None if last.stats.get("retired_shards") else last.stop_vgtid
            log.info(
                "sync %r window %d ended at %s with more to read; staging the next window",
                self.spec.sync_id,
                outcomes[-1].seq,
                reason,
            )
            outcomes.append(self.catch_up(_window_bounds(bounds, left), extend=True, stop=stop))
        return BacklogOutcome(tuple(outcomes), stopped)

    def catch_up(
        self, bounds: ReadBounds | None = None, *, extend: bool = False, stop: Vgtid | None = None
    ) -> WindowOutcome:
        """Stage one catch-up window (or resume the unfinished one, or return it if staged).

        ``extend``: when the sync's latest window is a STAGED catch-up, plan the next window
        from its end instead of returning it, up to ``stop`` (default: the keyspace's position
        now); how one run reads a long backlog as several windows (:mod:`.backlog`).
        """
        spec = self.spec
        chosen_keys = self._check_source(reuse=extend)  # a backlog's later window: its run's check
        with self._locked():
            found = self._window_to_read(
                WindowKind.CATCHUP, chosen_keys, lambda: self._plan_catch_up(stop), extend=extend
            )
            if isinstance(found, WindowOutcome):
                return found
            window, resumed = found
            seq, start, stop = window.seq, window.start_vgtid, window.stop_vgtid
            if stop is None:
                raise CheckpointError(f"sync {spec.sync_id!r} catch-up window {seq} has no stop position")
            # A catch-up window is short: a rerun reads it again from its start, whole.
            WindowStager.discard_uncommitted(
                spec.staging_location, spec.sync_id, seq, [], storage_options=spec.storage_options
            )
            stager = self._stager(seq, spec.tables)
            reader = self._catch_up_reader(stager, start, stop, bounds)
            return self._stage(seq, WindowKind.CATCHUP, resumed, reader, stager, start, stop)

    def _catch_up_reader(
        self, stager: WindowStager, start: Vgtid, stop: Vgtid, bounds: ReadBounds | None
    ) -> WindowReader:
        """The read of a catch-up window (or a group's part of one) from ``start`` to ``stop``."""
        spec = self.spec
        flags = self._target.flags(
            heartbeat_interval=spec.heartbeat_interval, minimize_skew=spec.minimize_skew
        )
        return self._reader(
            stager,
            spec.tables,
            start,
            stop,
            flags=flags,
            bounds=bounds or ReadBounds(),
            copied_at=self._copied_at,
        )

    def _plan_catch_up(self, stop: Vgtid | None) -> int:
        """A new window from the committed position (or the end of the STAGED windows before
        it) to ``stop`` (default: the keyspace's position now)."""
        start = self.store.next_catchup_start(self.spec.sync_id)
        if start is None:
            raise CheckpointError(f"sync {self.spec.sync_id!r} has no committed position: snapshot it first")
        self._check_keyspace(start, "the committed position")
        stats: dict[str, Any] = {}
        if stop is None:
            stop, taken_at, stats = self._take_stop()
        else:  # a backlog's next window: the stop (and its time) of the window before
            before = self.store.open_windows(self.spec.sync_id)
            taken = before[-1].stats.get(STOP_TAKEN_AT) if before else None
            taken_at = datetime.datetime.fromisoformat(taken) if taken else None
        return self.store.plan_window(
            self.spec.sync_id, WindowKind.CATCHUP, start, stop, taken_at, stats=stats
        )

    def _take_stop(self) -> tuple[Vgtid, datetime.datetime | None, dict[str, Any]]:
        """The keyspace's position now (a new window's stop), the source's time it stands for
        (its *as of* once a window reaches it; None: not known, the sync keeps its time) and
        what to record about that time in the window's stats: a replica's position is as old
        as its lag (``vstream/source_clock.py``)."""
        return stop_and_time(
            self.hook,
            self.spec.keyspace,
            self._target.tablet_type,
            self._stop_position,
            f"sync {self.spec.sync_id!r}: the stop position",
        )

    def recheck_staged(self) -> list[int]:
        """Under the lock: every STAGED window before the latest one (a chain no merge took yet;
        the latest is checked when a catch-up finds it) still has its files. The first that does
        not is discarded with the windows after it (``WindowBook.discard_lost``); returns the
        seqs left STAGED before it."""
        with self._locked():
            kept: list[int] = []
            for window in self.store.open_windows(self.spec.sync_id)[:-1]:
                if window.state is WindowState.STAGED:
                    if self._windows.already_staged(window) is None:
                        break
                    kept.append(window.seq)
            return kept
