"""One VStream call as an iterator of typed events, reconnecting from the last VGTID.

The reader does no I/O of its own: ``open_stream(request)`` (``VitessHook.open_vstream_raw``:
the channel, credentials and deadline) returns an iterator of responses, each a serialized
``VStreamResponse`` (read through :mod:`.wire`'s views, so no row is parsed here) or an already
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
cuts, while a stream that fails again and again at the same place gives up.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError

from airflow_provider_vitess._proto import binlogdata_pb2, topodata_pb2, vtgate_pb2
from airflow_provider_vitess.exceptions import ShardsGoneError, VitessConnectionError, VStreamError
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream import wire
from airflow_provider_vitess.vstream.events import Event, EventDecoder, HeartbeatEvent, VgtidEvent

log = logging.getLogger(__name__)

OpenStream = Callable[[vtgate_pb2.VStreamRequest], Iterable[vtgate_pb2.VStreamResponse | bytes]]

SC = grpc.StatusCode
_TRANSIENT = frozenset({SC.UNAVAILABLE, SC.RESOURCE_EXHAUSTED, SC.ABORTED})
_AUTH = frozenset({SC.UNAUTHENTICATED, SC.PERMISSION_DENIED})
# INTERNAL is usually a server bug or a resharding that needs a new stream (vtgate's rule), but
# gRPC also reports a reset HTTP/2 stream as INTERNAL: those are cuts, retried.
_TRANSPORT_HINTS = (
    "rst_stream",
    "stream reset",
    "transport",
    "goaway",
    "connection reset",
    "socket closed",
    "stream removed",
)
# gRPC's own receive limit says RESOURCE_EXHAUSTED too, but it fails the same way every time.
_TOO_LARGE_HINTS = ("larger than max", "message too large", "exceeds maximum")
_MAX_EXPONENT = 64
# vtgate's answer to a VGTID naming a shard the keyspace no longer has (Reshard completed and the
# old shard deleted): "shard provided in VGTID, 0, not found in the customer keyspace".
_SHARD_NOT_FOUND = re.compile(r"shard provided in VGTID, ([^,\s]+), not found in the (\S+) keyspace")


@dataclass(frozen=True)
class RetryPolicy:
    """How to reconnect after transient errors (seconds throughout)."""

    max_attempts: int = 10
    max_elapsed: float = 600.0
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2  # each delay is scaled by a random factor in [1 - jitter, 1 + jitter]
    retry_deadline_exceeded: bool = False

    def delay(self, attempt: int, rand: float) -> float:
        """Delay before reconnect number ``attempt`` (1-based), ``rand`` uniform in [0, 1)."""
        base = self.initial_delay * self.multiplier ** min(attempt - 1, _MAX_EXPONENT)
        scaled = min(base, self.max_delay) * (1.0 + self.jitter * (2.0 * rand - 1.0))
        return max(0.0, min(scaled, self.max_delay))


def _status(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    # A grpc.RpcError raised by a real call is also a grpc.Call; be lenient with others.
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return (code if isinstance(code, grpc.StatusCode) else None), (details or str(err) or "no details")


def is_transient(code: grpc.StatusCode | None, details: str, policy: RetryPolicy) -> bool:
    """True when reopening the stream from the last VGTID may succeed."""
    text = details.lower()
    if code == SC.RESOURCE_EXHAUSTED and any(h in text for h in _TOO_LARGE_HINTS):
        return False
    if code in _TRANSIENT:
        return True
    if code == SC.INTERNAL:
        return any(h in text for h in _TRANSPORT_HINTS)
    return code == SC.DEADLINE_EXCEEDED and policy.retry_deadline_exceeded


def _code_name(code: grpc.StatusCode | None) -> str:
    return code.name if code is not None else "UNKNOWN"


def _tablet_type(value: int | str) -> topodata_pb2.TabletType:
    wrapper = topodata_pb2.TabletType
    try:
        number = (
            wrapper.Value(value.upper()) if isinstance(value, str) else wrapper.Value(wrapper.Name(value))
        )
        return cast(topodata_pb2.TabletType, number)
    except ValueError:
        names = ", ".join(topodata_pb2.TabletType.keys())
        raise ValueError(f"unknown tablet type {value!r}; expected one of {names}") from None


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
        retry: RetryPolicy | None = None,
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
        self._template = vtgate_pb2.VStreamRequest(tablet_type=_tablet_type(tablet_type))
        if filter is not None:
            self._template.filter.CopyFrom(filter)
        if flags is not None:
            self._template.flags.CopyFrom(flags)
        self._policy = retry or RetryPolicy()
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
        failures = 0  # reconnects in a row without progress
        first_failure: float | None = None
        while True:
            stream: Iterable[vtgate_pb2.VStreamResponse | bytes] | None = None
            try:
                stream = self._open_stream(self.build_request(self.resume_vgtid))
                for response in stream:
                    vevents = self._parse(response).events if isinstance(response, bytes) else response.events
                    for vevent in vevents:
                        event = self._decoder.decode(vevent)
                        if isinstance(event, VgtidEvent):
                            self._last_vgtid = event.vgtid
                            failures, first_failure = 0, None
                        elif isinstance(event, HeartbeatEvent):
                            failures, first_failure = 0, None
                        yield event
                return
            except grpc.RpcError as err:
                code, details = _status(err)
                if not is_transient(code, details, self._policy):
                    raise self._fatal(code, details) from err
                now = self._clock()
                if first_failure is None:
                    first_failure = now
                failures += 1
                delay = self._policy.delay(failures, self._rand())
                elapsed = now - first_failure
                if failures > self._policy.max_attempts or elapsed + delay > self._policy.max_elapsed:
                    raise self._exhausted(code, details, failures - 1, elapsed) from err
                log.warning(
                    "VStream (%s) cut with gRPC status %s: %s; reconnect %d/%d in %.2fs from %s",
                    self._describe(),
                    _code_name(code),
                    details,
                    failures,
                    self._policy.max_attempts,
                    delay,
                    "the last VGTID" if self._last_vgtid is not None else "the start position",
                )
                self.reconnects += 1
                self._sleep(delay)
            finally:
                # Ends the server side too when the consumer stops early or an error escapes.
                cancel = getattr(stream, "cancel", None)
                if callable(cancel):
                    cancel()

    def _parse(self, data: bytes) -> Any:
        try:
            return wire.parse_response(data)
        except DecodeError as err:
            raise VStreamError(
                f"VStream for {self._describe()}: vtgate sent a response ({len(data)} bytes) that is "
                f"not a VStreamResponse: {err}"
            ) from err

    def _fatal(self, code: grpc.StatusCode | None, details: str) -> Exception:
        name = _code_name(code)
        gone = _SHARD_NOT_FOUND.search(details)
        if gone is not None:
            shards = ", ".join(f"{sg.keyspace}/{sg.shard}" for sg in self.resume_vgtid.shard_gtids)
            return ShardsGoneError(
                f"VStream for {self._describe()}: the position names shard {gone[2]}/{gone[1]}, which "
                f"keyspace {gone[2]} no longer has (position shards: {shards}). The keyspace was "
                "resharded and its old shards deleted before the sync read past the reshard, so the "
                "changes since the position are gone. Remedy: snapshot the sync again (a new "
                "snapshot replaces the target); in future, let a catch-up window run after "
                "SwitchTraffic and before the old shards are deleted (Reshard complete / DeleteShards). "
                f"vtgate said: gRPC status {name}: {details}"
            )
        if code in _AUTH:
            return VitessConnectionError(
                f"vtgate refused the VStream for {self._describe()} (gRPC status {name}): {details}"
            )
        hint = ""
        if code == SC.RESOURCE_EXHAUSTED:
            hint = " (raise the gRPC channel's max receive message length)"
        return VStreamError(f"VStream for {self._describe()} failed with gRPC status {name}: {details}{hint}")

    def _exhausted(
        self, code: grpc.StatusCode | None, details: str, attempts: int, elapsed: float
    ) -> Exception:
        message = (
            f"VStream for {self._describe()} gave up after {attempts} reconnect attempts in "
            f"{elapsed:.1f}s without progress; last error: gRPC status {_code_name(code)}: {details}"
        )
        if code in (SC.UNAVAILABLE, SC.DEADLINE_EXCEEDED):
            return VitessConnectionError(message)
        return VStreamError(message)
