"""``ChangeWatch``: "has the sync's tables changed since its committed VGTID?", read a bounded
stretch at a time from a worker (no triggerer).

The non-deferrable changes sensor pokes with it, and the follow task
(``operators/follow.py``) waits with it between two windows. Its first read takes the keyspace's
position (and the source time it stands for): a "no change" reads up to it, and later reads go
on from where the last one stopped, so a quiet stream is never read twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.changes import Change, ChangeDetector, lag_verdict, read_changes
from airflow_provider_vitess.vstream.position import capture_stop_position
from airflow_provider_vitess.vstream.request import StreamTarget
from airflow_provider_vitess.vstream.source_clock import stop_and_time

log = logging.getLogger(__name__)


class ChangeWatch:
    """Bounded reads for the first change of ``tables`` after a committed VGTID.

    :param what: who watches, for the messages (``"the changes sensor of sync 'orders'"``).
    :param read_seconds: the longest stream read of one :meth:`read_once`.
    :param lag_threshold: also report a change when a shard is more than this many transactions
        past the committed position (None: never).
    :param columns: tables under column control: their key columns only are streamed.
    """

    def __init__(
        self,
        keyspace: str,
        tables: Sequence[str],
        *,
        what: str,
        read_seconds: float,
        lag_threshold: int | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.keyspace, self.tables = keyspace, list(tables)
        self.what, self.read_seconds, self.lag_threshold = what, read_seconds, lag_threshold
        self.columns = dict(columns or {})
        # committed VGTID (JSON) -> a position read up to without a change.
        self._scanned: dict[str, Vgtid] = {}
        # The position of the first read (what "no change" must have read up to), the source
        # time it stands for, and how far the reads got.
        self.watch_stop: Vgtid | None = None
        self.watch_stop_at: datetime | None = None
        self.read_to: Vgtid | None = None

    def read_once(self, hook: VitessHook, committed: Vgtid) -> Change | None:
        """One bounded read through ``hook`` (the caller's to close): the first change between
        ``committed`` and now, or None."""
        target = StreamTarget.of(hook.config)

        def take() -> Vgtid:
            return capture_stop_position(
                hook.open_vstream_raw, self.keyspace, target=target, timeout=self.read_seconds
            )

        if self.watch_stop is None:
            # A replica's position is as old as its lag (None: not known, no freshness claimed).
            stop, taken_at, _ = stop_and_time(hook, self.keyspace, target.tablet_type, take, self.what)
        else:
            stop, taken_at = take(), self.watch_stop_at
        lag = lag_verdict(committed, stop, self.lag_threshold)
        if lag is not None:
            return lag
        if self.watch_stop is None:
            self.watch_stop, self.watch_stop_at = stop, taken_at
        start = self._scanned.get(committed.to_json(), committed)
        self.read_to = start
        if start.has_reached(stop):
            log.debug("No change: nothing was committed since %s", start.to_json())
            return None
        scan = read_changes(
            lambda request: hook.open_vstream_raw(request, timeout=self.read_seconds + 30),
            ChangeDetector(self.keyspace, self.tables),
            start,
            stop,
            target=target,
            seconds=self.read_seconds,
            columns=self.columns,
        )
        if scan.change is not None and not scan.reached_stop:
            return scan.change
        self._scanned[committed.to_json()] = self.read_to = scan.read_to
        if scan.reached_stop:
            log.debug("No change of the tables up to %s", stop.to_json())
        else:
            log.info(
                "No change of the tables within %gs of reading (read up to %s); the next read goes on",
                self.read_seconds,
                scan.read_to.to_json(),
            )
        return scan.change
