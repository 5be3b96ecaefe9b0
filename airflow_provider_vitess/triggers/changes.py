"""``VitessChangesTrigger``: waits in the triggerer until a sync's tables change in Vitess.

It opens one VStream (``grpc.aio``) from the sync's committed VGTID with the sync's table
filter and fires on the first change of those tables (:mod:`..vstream.changes`): a ROW event,
a FIELD or DDL event of one of them, or a JOURNAL (reshard) of the keyspace. vtgate filters
the stream, so a quiet table costs one idle stream kept alive by vtgate's heartbeats, however
busy the other tables of the server are. With ``lag_threshold`` set it also fires when some
shard's current position is more than that many transactions past the committed one.

The trigger takes the keyspace's current position when it starts watching. At ``timeout_at``
it reports ``timeout`` ("no change") only if its stream read up to that position; a stream still
behind it (other tables' traffic on the shard takes longer to scan than the timeout) fires a
``scan_unfinished`` change instead, so the run goes on and its catch-up reads the rest.

A ``timeout`` event says how far "no change" holds: ``watched_to``, the position its stream
read up to, and ``watched_at``, when that position was taken (this host's clock, just before it
asked): the sensor records it as the sync's freshness (``checkpoints/freshness.record_quiet``).

The trigger holds only the connection id: the triggerer rebuilds the hook and reads the
connection itself (asynchronously), so no credential is ever serialized. Transient gRPC
errors reopen the stream from the last VGTID seen (no change before it, so nothing is lost);
other errors end the trigger with an ``error`` event that the sensor raises. Cancelling the
trigger (task cleared, timeout, triggerer shutdown) cancels the call and closes the channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import grpc
import grpc.aio
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_vitess._proto import vtgate_pb2
from airflow_provider_vitess.decoding.events import EventDecoder
from airflow_provider_vitess.exceptions import (
    VitessProviderError,
    VStreamError,
    is_permanent,
)
from airflow_provider_vitess.hooks.aio import AsyncVStreamClient
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.changes import (
    Change,
    ChangeDetector,
    lag_verdict,
    start_verdict,
    unscanned_verdict,
)
from airflow_provider_vitess.vstream.position import current_position
from airflow_provider_vitess.vstream.request import StreamTarget
from airflow_provider_vitess.vstream.retry import Reconnects, RetryPolicy
from airflow_provider_vitess.vstream.source_clock import SourceClock


class VitessChangesTrigger(BaseTrigger):
    """Fires once the tables of a sync have changes after ``start_vgtid``.

    :param vitess_conn_id: the ``vitess`` connection (looked up in the triggerer).
    :param keyspace: the sync's keyspace.
    :param tables: the sync's tables (bare names).
    :param start_vgtid: the committed VGTID, as JSON (:meth:`Vgtid.to_json`).
    :param lag_threshold: also fire when a shard is more than this many transactions behind
        (its current position vs ``start_vgtid``, whatever tables they touched); None: never.
    :param heartbeat_interval: seconds between vtgate heartbeats on the idle stream.
    :param lag_check_interval: seconds between two lag checks (with ``lag_threshold``).
    :param max_reconnects: reconnects in a row without progress before giving up.

    The event payload is ``{"status": "change", "reason": ..., "table": ..., "shard": ...,
    "commit_ts": ...}`` (see :meth:`Change.summary`), ``{"status": "timeout", ...}`` at
    ``timeout_at``, or ``{"status": "error", "message": ..., "permanent": bool}``.
    """

    def __init__(
        self,
        *,
        vitess_conn_id: str,
        keyspace: str,
        tables: Sequence[str],
        start_vgtid: str,
        lag_threshold: int | None = None,
        heartbeat_interval: int = 10,
        lag_check_interval: float = 60.0,
        max_reconnects: int = 10,
        timeout_at: float | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        super().__init__()
        if not tables:
            raise ValueError("VitessChangesTrigger needs at least one table")
        if heartbeat_interval < 1:
            raise ValueError("heartbeat_interval must be at least 1 second")
        self.vitess_conn_id = vitess_conn_id
        self.keyspace = keyspace
        self.tables = list(tables)
        self.start_vgtid = start_vgtid
        self.lag_threshold = lag_threshold
        self.heartbeat_interval = int(heartbeat_interval)
        self.lag_check_interval = float(lag_check_interval)
        self.max_reconnects = int(max_reconnects)
        # Wall-clock deadline (epoch seconds): ``dag.test()`` runs triggers inline and does not
        # enforce the deferral timeout, so the trigger ends the wait itself.
        self.timeout_at = timeout_at
        # Tables under column control: the key columns streamed (capture/columns.watched_columns).
        self.columns = {t: list(c) for t, c in (columns or {}).items()}
        self.streams_opened = 0  # for tests and logs: 1 + reconnects
        # The error of the last failed stream while no stream has answered since: a wait that
        # ends in that state ends in an error, not in "no change".
        self._failing: str | None = None
        # What the wait must read up to before "no change" is an answer, and how far it read.
        self._watch_stop: Vgtid | None = None
        self._watch_stop_at: datetime | None = None  # the source time it stands for
        self._read: tuple[ChangeDetector, Vgtid] | None = None  # the detector and its start

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "vitess_conn_id": self.vitess_conn_id,
                "keyspace": self.keyspace,
                "tables": list(self.tables),
                "start_vgtid": self.start_vgtid,
                "lag_threshold": self.lag_threshold,
                "heartbeat_interval": self.heartbeat_interval,
                "lag_check_interval": self.lag_check_interval,
                "max_reconnects": self.max_reconnects,
                "timeout_at": self.timeout_at,
                "columns": self.columns,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            if self.timeout_at is None:
                change = await self.wait_for_change()
            else:
                left = max(0.0, self.timeout_at - time.time())
                change = await asyncio.wait_for(self.wait_for_change(), timeout=left)
        except asyncio.TimeoutError:
            if self._failing is not None:
                message = (
                    f"could not watch {self._describe()}: vtgate did not answer until the sensor's "
                    f"timeout ({self._failing})"
                )
                self.log.error("%s", message)
                yield TriggerEvent({"status": "error", "message": message, "permanent": False})
                return
            read_to = self._read[0].resume_from(self._read[1]) if self._read is not None else None
            unscanned = unscanned_verdict(self.keyspace, read_to, self._watch_stop)
            if unscanned is not None:
                self.log.warning(
                    "The sensor's timeout ended the read of %s at %s, before the position of its "
                    "start (%s): the run goes on, its catch-up reads the rest",
                    self._describe(),
                    read_to.to_json() if read_to is not None else "its start",
                    self._watch_stop.to_json() if self._watch_stop is not None else "not known yet",
                )
                yield TriggerEvent({"status": "change", **unscanned.summary()})
                return
            self.log.info("No change to %s before the sensor's timeout", self._describe())
            event: dict[str, Any] = {"status": "timeout", "message": f"no change to {self._describe()}"}
            if self._watch_stop is not None and self._watch_stop_at is not None:
                # Read up to it (unscanned_verdict): no change before the moment it was taken.
                event["watched_from"] = self.start_vgtid
                event["watched_to"] = self._watch_stop.to_json()
                event["watched_at"] = self._watch_stop_at.isoformat()
            yield TriggerEvent(event)
            return
        except (VitessProviderError, grpc.RpcError) as exc:
            self.log.error("Watching %s for changes failed: %s", self._describe(), exc)
            yield TriggerEvent({"status": "error", "message": str(exc), "permanent": is_permanent(exc)})
            return
        self.log.info("Change found for %s: %s", self._describe(), change.summary())
        yield TriggerEvent({"status": "change", **change.summary()})

    def _describe(self) -> str:
        return f"keyspace {self.keyspace!r} tables {', '.join(self.tables)}"

    # ----- the watch ----------------------------------------------------------------------

    async def wait_for_change(self) -> Change:
        """Streams until the first change (or lag) and returns it; cancellable at any await."""
        start = Vgtid.from_json(self.start_vgtid)
        verdict = start_verdict(start, self.keyspace)
        if verdict is not None:
            return verdict
        hook = VitessHook(self.vitess_conn_id)
        detector = ChangeDetector(self.keyspace, self.tables)
        reconnects = Reconnects(
            RetryPolicy(max_attempts=self.max_reconnects),
            self._describe(),
            auth_hint=f" (check the user and password of connection {self.vitess_conn_id!r})",
        )
        self._failing = "no connection to vtgate yet"
        async with AsyncVStreamClient(hook) as client:
            self._failing = None
            target = StreamTarget.of(hook.config)  # read by connect()
            self._read = (detector, start)
            next_lag_check = time.monotonic() if self.lag_threshold is not None else float("inf")
            while True:
                resume = detector.resume_from(start)
                call = client.vstream(self._request(target, resume))
                self.streams_opened += 1
                self.log.info(
                    "Watching %s from %s (stream %d)", self._describe(), resume.to_json(), self.streams_opened
                )
                decoder = EventDecoder()  # a new stream sends its FIELD events again
                try:
                    if self._watch_stop is None:
                        # "No change" needs a read up to here (see the module docstring); its
                        # errors are the stream's (reconnects, the credentials hint).
                        # The lag first: a replica's position is as old as it (its SQL in a
                        # thread; none for a primary). Not known: no freshness is claimed.
                        kind = target.tablet_type
                        clock = await asyncio.to_thread(_source_clock, hook, self.keyspace, kind)
                        self._watch_stop = await current_position(client, self.keyspace, target)
                        self._watch_stop_at, _ = clock.time_of(
                            self._watch_stop, f"the changes trigger of {self._describe()}"
                        )
                    async for response in call:
                        change = detector.scan(decoder.decode(ev) for ev in response.events)
                        if change is not None:
                            return change
                        reconnects.progress()  # any response proves the stream healthy (heartbeats too)
                        self._failing = None
                        if time.monotonic() >= next_lag_check:
                            lag = await self._check_lag(client, target, start)
                            if lag is not None:
                                return lag
                            next_lag_check = time.monotonic() + self.lag_check_interval
                    raise VStreamError(f"vtgate ended the VStream of {self._describe()} unexpectedly")
                except grpc.aio.AioRpcError as err:
                    code, details = err.code(), err.details() or "no details"
                    self._failing = f"gRPC status {code.name}: {details}"
                    self.log.warning("VStream of %s cut (%s: %s)", self._describe(), code.name, details)
                    at = resume.to_proto()
                    delay = reconnects.after(
                        code, details, start=start.to_proto(), resume=at, started=at != start
                    )
                    if isinstance(delay, Exception):
                        raise delay from None
                    self.log.info("Reconnect %d in %.1fs", reconnects.backoff.failures, delay)
                    await asyncio.sleep(delay)
                finally:
                    call.cancel()

    def _request(self, target: StreamTarget, resume: Vgtid) -> vtgate_pb2.VStreamRequest:
        return target.request(
            resume,
            self.tables,
            self.columns,
            heartbeat_interval=self.heartbeat_interval,
            # A reshard is a change: without its journal vtgate would switch shards silently.
            include_reshard_journal_events=True,
        )

    async def _check_lag(
        self, client: AsyncVStreamClient, target: StreamTarget, start: Vgtid
    ) -> Change | None:
        current = await current_position(client, self.keyspace, target)
        change = lag_verdict(start, current, self.lag_threshold)
        self.log.info(
            "Lag check for %s: %s",
            self._describe(),
            "over the threshold" if change is not None else f"within {self.lag_threshold} transactions",
        )
        return change


def _source_clock(hook: VitessHook, keyspace: str, tablet_type: str) -> SourceClock:
    """The tablets' lag (``vstream/source_clock.py``), and the hook's SQL engine closed after it:
    the trigger asks nothing more over SQL (its stream has an asyncio channel of its own)."""
    try:
        return SourceClock.read(hook, keyspace, tablet_type)
    finally:
        hook.close()
