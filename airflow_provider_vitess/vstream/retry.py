"""When a cut VStream is worth reopening, how long to wait, and the error that ends it: one
rule for every reader.

Both loops that reopen a VStream from their last position, the capture reader
(:mod:`.reader`, threads) and the changes trigger (``triggers/changes.py``, asyncio), hand each
gRPC error to one :class:`Reconnects`: it classifies the error (:func:`is_transient`), paces the
reconnects (:class:`Backoff`), and names a final error with its remedy (:func:`stream_error`).

Transient (``tests/integration/operations/test_faults.py`` cuts and stalls the real vtgate's connection
through a proxy; what it saw is marked *seen*):

* ``UNAVAILABLE``: the connection died. *Seen*: "Stream removed (Socket closed)" on a cut,
  "Stream removed (ping timeout)" when keepalive gave up a black-holed connection.
* ``UNKNOWN`` "stream timeout" / "vstream ended unexpectedly", and ``CANCELLED`` "client
  connection is closing": vtgate's own stream to a tablet broke (tablet restart, reparent) and
  vtgate passes the error on; a new stream from the last VGTID goes on. Not reproducible here
  (the local vtcombo runs vtgate and its tablets in one process): taken from vtgate's source.
* ``INTERNAL`` naming the transport (a reset HTTP/2 stream); other ``INTERNAL`` errors are
  server bugs or a resharding that needs a new stream (vtgate's own rule), so final.
* ``RESOURCE_EXHAUSTED`` (server overload), except gRPC's own message-size limit, which fails
  the same way every time; ``ABORTED``.
* ``DEADLINE_EXCEEDED``: the stream calls of this provider carry no deadline (liveness comes
  from vtgate's heartbeats and gRPC keepalive), so one comes from a proxy or the server side.
  A caller that bounds its own call with a deadline says ``retry_deadline_exceeded=False``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.exceptions import ShardsGoneError, VitessConnectionError, VStreamError

SC = grpc.StatusCode
AUTH_CODES = frozenset({SC.UNAUTHENTICATED, SC.PERMISSION_DENIED})
_TRANSIENT = frozenset({SC.UNAVAILABLE, SC.RESOURCE_EXHAUSTED, SC.ABORTED})
_TRANSPORT_HINTS = (
    "rst_stream",
    "stream reset",
    "transport",
    "goaway",
    "connection reset",
    "socket closed",
    "stream removed",
)
# vtgate's messages when its stream from a tablet breaks (vtgate/vstream_manager.go, grpc-go).
_UNKNOWN_HINTS = ("stream timeout", "vstream ended unexpectedly")
_CANCELLED_HINTS = ("client connection is closing",)
_TOO_LARGE_HINTS = ("larger than max", "message too large", "exceeds maximum")
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class RetryPolicy:
    """How to reconnect after transient errors (seconds throughout)."""

    max_attempts: int = 10
    max_elapsed: float = 600.0
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2  # each delay is scaled by a random factor in [1 - jitter, 1 + jitter]
    retry_deadline_exceeded: bool = True

    def delay(self, attempt: int, rand: float) -> float:
        """Delay before reconnect number ``attempt`` (1-based), ``rand`` uniform in [0, 1)."""
        base = self.initial_delay * self.multiplier ** min(attempt - 1, _MAX_EXPONENT)
        scaled = min(base, self.max_delay) * (1.0 + self.jitter * (2.0 * rand - 1.0))
        return max(0.0, min(scaled, self.max_delay))


def rpc_status(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """``(code, details)`` of a gRPC error (a real call's error is also a ``grpc.Call``)."""
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return (code if isinstance(code, grpc.StatusCode) else None), (details or str(err) or "no details")


def code_name(code: grpc.StatusCode | None) -> str:
    return code.name if code is not None else "UNKNOWN"


def is_transient(code: grpc.StatusCode | None, details: str, policy: RetryPolicy) -> bool:
    """True when reopening the stream from the last VGTID may succeed."""
    text = details.lower()
    if code == SC.RESOURCE_EXHAUSTED and any(h in text for h in _TOO_LARGE_HINTS):
        return False
    if code in _TRANSIENT:
        return True
    if code == SC.INTERNAL:
        return any(h in text for h in _TRANSPORT_HINTS)
    if code == SC.UNKNOWN:
        return any(h in text for h in _UNKNOWN_HINTS)
    if code == SC.CANCELLED:
        return any(h in text for h in _CANCELLED_HINTS)
    return code == SC.DEADLINE_EXCEEDED and policy.retry_deadline_exceeded


class Backoff:
    """Counts reconnects in a row without progress; says how long to wait, or that it is over.

    ``progress()`` (a new VGTID, a heartbeat) resets it: a long stream survives occasional cuts,
    one that fails again and again at the same place gives up.
    """

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float], rand: Callable[[], float]) -> None:
        self.policy, self._clock, self._rand = policy, clock, rand
        self.failures = 0
        self.elapsed = 0.0
        self._first: float | None = None

    def progress(self) -> None:
        self.failures, self._first = 0, None

    def next_delay(self) -> float | None:
        """Seconds to wait before the next reconnect, or None when the policy is exhausted."""
        now = self._clock()
        if self._first is None:
            self._first = now
        self.failures += 1
        self.elapsed = now - self._first
        delay = self.policy.delay(self.failures, self._rand())
        if self.failures > self.policy.max_attempts or self.elapsed + delay > self.policy.max_elapsed:
            return None
        return delay


# A start position whose binlogs were purged: the tablet says so (MySQL error 1236), but vtgate
# v0.23 retries the tablet until its picker gives up and reports only that (CANCELLED "error
# starting stream from shard GTID keyspace:"ks" shard:"-80" gtid:"...": failed to find a PRIMARY
# tablet for VStream ... context has expired"), seen against the local vtgate.
_GONE_HINTS = ("errno 1236", "purged", "could not find gtid state")
_NO_TABLET_HINT = "failed to find a primary tablet for vstream"
_STARTING_AT = re.compile(
    r'starting stream from shard GTID keyspace:"([^"]*)" shard:"([^"]*)" gtid:"([^"]*)"'
)


def position_gone(details: str, *, start: binlogdata_pb2.VGtid, started: bool) -> bool:
    """True when a final error may mean the stream's start position is no longer in the binlogs.

    The picker's message means it when the shard it names could not start from where this
    stream started on it (the other shards may have moved on: ``started`` says only that some
    shard did); without a shard named, only when the stream never moved past ``start``."""
    text = details.lower()
    if any(h in text for h in _GONE_HINTS):
        return True
    if _NO_TABLET_HINT not in text:
        return False
    at = _STARTING_AT.search(details)
    if at is None:
        return not started
    return any((sg.keyspace, sg.shard, sg.gtid) == (at[1], at[2], at[3]) for sg in start.shard_gtids)


# The way out when the changes since a position are gone: a snapshot of every table is a new start
# (its copy's position is the stream's next start), the way a sync began.
SNAPSHOT_EVERY_TABLE = (
    'snapshot the sync again: trigger its DAG with {"resnapshot_tables": [...]} naming every table '
    "of the sync (a copy of every table is a new start, the stream resumes past it)"
)

# vtgate's answer to a VGTID naming a shard the keyspace no longer has (Reshard completed and the
# old shard deleted): "shard provided in VGTID, 0, not found in the customer keyspace".
_SHARD_NOT_FOUND = re.compile(r"shard provided in VGTID, ([^,\s]+), not found in the (\S+) keyspace")


def stream_error(
    code: grpc.StatusCode | None,
    details: str,
    what: str,
    *,
    start: binlogdata_pb2.VGtid,
    resume: binlogdata_pb2.VGtid,
    started: bool,
    auth_hint: str = "",
) -> Exception:
    """The error that ends a stream of ``what`` on a final gRPC error, with its remedy.

    ``start``/``resume``: where the stream started and would resume; ``started``: it moved past
    its start. ``auth_hint`` follows a refusal of the credentials (e.g. the connection to check).
    """
    name = code_name(code)
    gone = _SHARD_NOT_FOUND.search(details)
    if gone is not None:
        shards = ", ".join(f"{sg.keyspace}/{sg.shard}" for sg in resume.shard_gtids)
        return ShardsGoneError(
            f"VStream for {what}: the position names shard {gone[2]}/{gone[1]}, which "
            f"keyspace {gone[2]} no longer has (position shards: {shards}). The keyspace was "
            "resharded and its old shards deleted before the sync read past the reshard, so the "
            f"changes since the position are gone. Remedy: {SNAPSHOT_EVERY_TABLE}; in future, "
            "let a catch-up window run after SwitchTraffic and before the old shards are deleted "
            "(Reshard complete / DeleteShards). "
            f"vtgate said: gRPC status {name}: {details}"
        )
    if code in AUTH_CODES:
        return VitessConnectionError(
            f"vtgate refused the VStream for {what} (gRPC status {name}): {details}{auth_hint}"
        )
    hint = ""
    if code == SC.RESOURCE_EXHAUSTED:
        hint = " (raise the gRPC channel's max receive message length)"
    elif position_gone(details, start=start, started=started):
        at = ", ".join(f"{sg.keyspace}/{sg.shard}@{sg.gtid}" for sg in start.shard_gtids)
        hint = (
            f". The start position {at} may be gone from the source's binlogs (purged; the "
            "vttablet log then shows MySQL error 1236): if so the changes since it are lost to "
            f"VStream and the sync must be snapshotted again. Remedy: {SNAPSHOT_EVERY_TABLE}; in "
            "future, keep the binlogs longer than a sync may go unread (binlog_expire_logs_seconds)"
        )
    return VStreamError(f"VStream for {what} failed with gRPC status {name}: {details}{hint}")


class Reconnects:
    """One stream's reconnect decisions, for a blocking or an asyncio loop alike.

    After each gRPC error the loop asks :meth:`after`: the seconds to wait before reopening
    the stream from its last position, or the error to raise (final, or retries exhausted).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        *,
        auth_hint: str = "",
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.policy, self.what, self._auth_hint = policy, what, auth_hint
        self.backoff = Backoff(policy, clock, rand)

    def progress(self) -> None:
        """The stream is healthy (a new position, a heartbeat): the count starts over."""
        self.backoff.progress()

    def after(
        self,
        code: grpc.StatusCode | None,
        details: str,
        *,
        start: binlogdata_pb2.VGtid,
        resume: binlogdata_pb2.VGtid,
        started: bool,
    ) -> float | Exception:
        if not is_transient(code, details, self.policy):
            return stream_error(
                code,
                details,
                self.what,
                start=start,
                resume=resume,
                started=started,
                auth_hint=self._auth_hint,
            )
        delay = self.backoff.next_delay()
        if delay is not None:
            return delay
        message = (
            f"VStream for {self.what} gave up after {self.backoff.failures - 1} reconnect attempts in "
            f"{self.backoff.elapsed:.1f}s without progress; "
            f"last error: gRPC status {code_name(code)}: {details}"
        )
        if code in (SC.UNAVAILABLE, SC.DEADLINE_EXCEEDED):
            return VitessConnectionError(message)
        return VStreamError(message)
