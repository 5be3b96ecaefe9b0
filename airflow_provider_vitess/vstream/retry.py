"""When a cut VStream is worth reopening, and how long to wait: one rule for every reader.

Both loops that reopen a VStream from their last position, the capture reader
(:mod:`.reader`, threads) and the changes trigger (``triggers/changes.py``, asyncio), classify
gRPC errors with :func:`is_transient` and pace their reconnects with :class:`Backoff`.

Transient (``tests/integration/test_faults.py`` cuts and stalls the real vtgate's connection
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

from collections.abc import Callable
from dataclasses import dataclass

import grpc

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
# v0.23 retries the tablet until its picker gives up and reports only that (CANCELLED "failed to
# find a PRIMARY tablet for VStream ... context has expired"), seen against the local vtgate.
_GONE_HINTS = ("errno 1236", "purged", "could not find gtid state")
_NO_TABLET_HINT = "failed to find a primary tablet for vstream"


def position_gone(details: str, *, started: bool) -> bool:
    """True when a final error may mean the stream's start position is no longer in the binlogs
    (``started``: the stream had already moved past its start, so the picker message is not it)."""
    text = details.lower()
    return any(h in text for h in _GONE_HINTS) or (not started and _NO_TABLET_HINT in text)
