"""One VStream call as an iterator of typed events, reconnecting from the last VGTID.

The reader does no I/O of its own: ``open_stream(request)`` (``VitessHook.open_vstream_raw``:
the channel and credentials) returns an iterator of responses, each a serialized
``VStreamResponse`` (read through :mod:`..decoding.wire`'s views, so no row is parsed here) or an already
parsed one (``VitessHook.open_vstream``; unit tests pass a generator function of either).

Delivery is **at-least-once**. The only safe resume point is the latest VGTID event
(:attr:`VStreamReader.last_vgtid`); a transaction may span several responses with its VGTID at
the end. When a transient gRPC error cuts the stream, the reader reopens it from the last
VGTID, so every event after that VGTID and before the cut is delivered again: a transaction
that was partly delivered (BEGIN, some ROWs) starts again at its BEGIN. Consumers must treat a
BEGIN as "discard the open transaction's rows", or dedupe by position. The resumed stream sends
FIELD events again before its first rows, which refresh the row decoders. With no VGTID seen yet
the stream restarts from its start position (a snapshot restarts its copy). During the copy
phase vtgate sends VGTID events that carry each table's last copied key, so a resumed copy goes
on where it stopped instead of starting over.

Retries: exponential backoff with jitter, at most ``max_attempts`` reconnects and
``max_elapsed`` seconds in a row *without progress*. Progress (a new VGTID, or a heartbeat that
proves the connection was healthy) resets both counts, so a long stream survives occasional
cuts, while a stream that fails again and again at the same place gives up. Which gRPC errors
are transient: :mod:`.retry` (one rule, shared with the changes trigger).

Liveness: a call has no wall deadline (a healthy stream of a long backlog runs as long as it
needs). A dead connection is found by gRPC keepalive (the hook's channel options), and a stream
that asked vtgate for heartbeats and hears nothing for ``idle_timeout`` seconds (default: five
heartbeats, at least 10 s) is cancelled and reopened like a cut one. A bounded read (the
stop-position probe) passes ``deadline`` and gets :class:`VStreamDeadlineError` past it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2
from airflow_provider_vitess.decoding import copyrows
from airflow_provider_vitess.decoding.events import Event, EventDecoder, HeartbeatEvent, VgtidEvent
from airflow_provider_vitess.exceptions import VStreamDeadlineError, VStreamError
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.request import vstream_request
from airflow_provider_vitess.vstream.retry import (
    SC,
    Reconnects,
    RetryPolicy,
    code_name,
    is_transient,
    rpc_status,
)

__all__ = ["OpenStream", "RetryPolicy", "VStreamReader", "is_transient"]

log = logging.getLogger(__name__)

OpenStream = Callable[[vtgate_pb2.VStreamRequest], Iterable[vtgate_pb2.VStreamResponse | bytes]]

# How long a stream that asked for heartbeats may stay silent before it is taken for dead: a
# few missed heartbeats, never under the time a busy vtgate may take to send its first one.
_IDLE_HEARTBEATS = 5
_MIN_IDLE_SECONDS = 10.0


class _Watchdog:
    """Cancels a call that waits too long for its next response, or outlives its deadline.

    The reader marks when it starts waiting for a response (``waiting_since``) and clears the
    mark when one arrives, so time spent by the consumer between responses never counts. One
    thread per call, polling: marking costs the reader two attribute stores per response.
    """

    def __init__(self, stream: Any, idle: float | None, deadline: float | None) -> None:
        self.waiting_since: float | None = None
        self.fired: str | None = None  # "idle" or "deadline" once it cancelled the call
        self._stream, self._idle, self._deadline = stream, idle, deadline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if (idle is not None or deadline is not None) and callable(getattr(stream, "cancel", None)):
            self._thread = threading.Thread(target=self._watch, name="vstream-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        tick = min(1.0, (self._idle or 4.0) / 4)
        while not self._stop.wait(tick):
            now, waiting = time.monotonic(), self.waiting_since
            if self._deadline is not None and now >= self._deadline:
                self.fired = "deadline"
            elif self._idle is not None and waiting is not None and now - waiting > self._idle:
                self.fired = "idle"
            if self.fired:
                self._stream.cancel()
                return

    def stop(self) -> None:
        self._stop.set()


class VStreamReader:
    """Reads one VStream (possibly over several calls) as typed events.

    Start position: ``vgtid`` (a :class:`Vgtid` or ``binlogdata.VGtid``), or ``keyspace`` alone
    meaning all its shards from now on (``current``). For a snapshot pass
    ``Vgtid.for_keyspace(keyspace, "")``.
    """

    def __init__(
        self,
        open_stream: OpenStream,
        *,
        vgtid: Vgtid | binlogdata_pb2.VGtid | None = None,
        keyspace: str | None = None,
        filter: binlogdata_pb2.Filter | None = None,
        flags: vtgate_pb2.VStreamFlags | None = None,
        tablet_type: int | str = "PRIMARY",
        reshard_journals: bool = False,
        retry: RetryPolicy | None = None,
        idle_timeout: float | None = None,
        deadline: float | None = None,
        reset_connection: Callable[[], None] | None = None,
        on_open: Callable[[vtgate_pb2.VStreamRequest], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if vgtid is None:
            if not keyspace:
                raise ValueError("VStreamReader needs a start vgtid or a keyspace")
            vgtid = Vgtid.for_keyspace(keyspace)
        self._start = vgtid.to_proto() if isinstance(vgtid, Vgtid) else vgtid
        if not self._start.shard_gtids:
            raise ValueError("the start vgtid names no keyspace/shard")
        self._open_stream = open_stream
        self._template = vstream_request(
            tablet_type=tablet_type, filter=filter, flags=flags, reshard_journals=reshard_journals
        )
        self._policy = retry or RetryPolicy()
        heartbeat = self._template.flags.heartbeat_interval
        if idle_timeout is None and heartbeat:
            idle_timeout = max(_MIN_IDLE_SECONDS, _IDLE_HEARTBEATS * heartbeat)
        self._idle_timeout = idle_timeout  # None: no heartbeats asked for, keepalive alone
        self._deadline = deadline  # time.monotonic() value: the whole read ends by then
        self._reset_connection = reset_connection  # called when the stream is found dead
        # Sees (and may amend) each request before its call opens: a snapshot's copy state.
        self._on_open = on_open
        self._sleep, self._clock, self._rand = sleep, clock, rand
        self._decoder = EventDecoder(
            keyspace_in_table_names=not self._template.flags.exclude_keyspace_from_table_name
        )
        self._last_vgtid: binlogdata_pb2.VGtid | None = None
        self.reconnects = 0  # over the reader's life, for metrics

    @property
    def last_vgtid(self) -> binlogdata_pb2.VGtid | None:
        """The latest VGTID event seen: where a new stream may safely start."""
        return self._last_vgtid

    @property
    def resume_vgtid(self) -> binlogdata_pb2.VGtid:
        return self._last_vgtid if self._last_vgtid is not None else self._start

    def _describe(self) -> str:
        keyspaces = sorted({sg.keyspace for sg in self._start.shard_gtids})
        return f"keyspace {', '.join(keyspaces)}"

    def build_request(self, vgtid: binlogdata_pb2.VGtid) -> vtgate_pb2.VStreamRequest:
        request = vtgate_pb2.VStreamRequest()
        request.CopyFrom(self._template)
        request.vgtid.CopyFrom(vgtid)
        return request

    def events(self) -> Generator[Event, None, None]:
        """Yield events until the server ends the stream; reconnects on transient errors."""
        reconnects = Reconnects(self._policy, self._describe(), clock=self._clock, rand=self._rand)
        while True:
            stream: Iterable[vtgate_pb2.VStreamResponse | bytes] | None = None
            watchdog: _Watchdog | None = None
            try:
                request = self.build_request(self.resume_vgtid)
                if self._on_open is not None:
                    self._on_open(request)
                stream = self._open_stream(request)
                watchdog = _Watchdog(stream, self._idle_timeout, self._deadline)
                responses = iter(stream)
                while True:
                    watchdog.waiting_since = time.monotonic()
                    response = next(responses, None)
                    watchdog.waiting_since = None
                    if response is None:
                        return
                    vevents = self._parse(response) if isinstance(response, bytes) else response.events
                    for vevent in vevents:
                        event = self._decoder.decode(vevent)
                        if isinstance(event, VgtidEvent):
                            self._last_vgtid = event.vgtid
                            reconnects.progress()
                        elif isinstance(event, HeartbeatEvent):
                            reconnects.progress()
                        yield event
            except grpc.RpcError as err:
                code, details = rpc_status(err)
                fired = watchdog.fired if watchdog is not None else None
                if fired == "deadline":
                    raise VStreamDeadlineError(
                        f"VStream for {self._describe()} did not finish by its deadline"
                    ) from None
                if fired == "idle":
                    code = SC.UNAVAILABLE
                    details = (
                        f"no message from vtgate for {self._idle_timeout:g}s although heartbeats were "
                        "asked for: the connection is taken for dead"
                    )
                    if self._reset_connection is not None:
                        self._reset_connection()  # reopened on a new connection, not the dead one
                delay = reconnects.after(
                    code,
                    details,
                    start=self._start,
                    resume=self.resume_vgtid,
                    started=self._last_vgtid is not None,
                )
                if isinstance(delay, Exception):
                    raise delay from err
                if self._deadline is not None and time.monotonic() + delay >= self._deadline:
                    raise VStreamDeadlineError(
                        f"VStream for {self._describe()} did not finish by its deadline; last error: "
                        f"gRPC status {code_name(code)}: {details}"
                    ) from err
                log.warning(
                    "VStream (%s) cut with gRPC status %s: %s; reconnect %d/%d in %.2fs from %s",
                    self._describe(),
                    code_name(code),
                    details,
                    reconnects.backoff.failures,
                    self._policy.max_attempts,
                    delay,
                    "the last VGTID" if self._last_vgtid is not None else "the start position",
                )
                self.reconnects += 1
                self._sleep(delay)
            finally:
                if watchdog is not None:
                    watchdog.stop()
                # Ends the server side too when the consumer stops early or an error escapes.
                cancel = getattr(stream, "cancel", None)
                if callable(cancel):
                    cancel()

    def _parse(self, data: bytes) -> Sequence[Any]:
        """The response's view events, copy-phase rows gathered in blocks (:mod:`..decoding.copyrows`)."""
        try:
            return copyrows.gather(data)
        except DecodeError as err:
            raise VStreamError(
                f"VStream for {self._describe()}: vtgate sent a response ({len(data)} bytes) that is "
                f"not a VStreamResponse: {err}"
            ) from err
