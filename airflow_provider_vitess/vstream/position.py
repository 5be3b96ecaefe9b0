"""The keyspace's current position on every shard: a window's stop, the poking sensor's "now",
the trigger's lag check. One request and one rule for all of them, blocking or asyncio.

vtgate answers a VStream from ``current`` with a VGTID event listing every shard, but a shard
whose stream has not started yet still shows ``current``: the position is the first VGTID event
in which none does. Heartbeats are asked for so a quiet keyspace still answers.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from airflow_provider_vitess._proto import vtgate_pb2
from airflow_provider_vitess.decoding.events import EventDecoder, VgtidEvent
from airflow_provider_vitess.exceptions import VStreamDeadlineError, VStreamError
from airflow_provider_vitess.vgtid import CURRENT, Vgtid
from airflow_provider_vitess.vstream.reader import OpenStream, RetryPolicy, VStreamReader
from airflow_provider_vitess.vstream.request import StreamTarget


class AsyncStreams(Protocol):
    """What the asyncio lookup needs (``hooks.aio.AsyncVStreamClient``)."""

    def vstream(self, request: vtgate_pb2.VStreamRequest, timeout: float | None = None) -> Any: ...


def position_request(keyspace: str, target: StreamTarget) -> vtgate_pb2.VStreamRequest:
    """A stream of the whole keyspace from ``current``, with a heartbeat every second."""
    return target.request(Vgtid.for_keyspace(keyspace), heartbeat_interval=1)


def full_position(event: object) -> Vgtid | None:
    """The position an event gives when it is a VGTID naming a position on every shard."""
    if not isinstance(event, VgtidEvent):
        return None
    vgtid = event.to_vgtid()
    if vgtid.shard_gtids and all(sg.gtid not in ("", CURRENT) for sg in vgtid.shard_gtids):
        return vgtid
    return None


def _no_position(keyspace: str, target: StreamTarget, timeout: float, last: str = "") -> VStreamError:
    return VStreamDeadlineError(
        f"keyspace {keyspace!r}: vtgate gave no position for every shard within {timeout:g}s "
        f"(is vtgate reachable, and are the keyspace's {target.tablet_type} tablets serving?){last}"
    )


def capture_stop_position(
    open_stream: OpenStream, keyspace: str, *, target: StreamTarget | None = None, timeout: float = 60.0
) -> Vgtid:
    """The keyspace's current position on every shard: a window's stop.

    The whole probe, reconnects included, ends by ``timeout`` (a dead or black-holed link
    cannot hold it longer).
    """
    target = target or StreamTarget()
    probe = position_request(keyspace, target)
    reader = VStreamReader(
        open_stream,
        vgtid=probe.vgtid,
        tablet_type=probe.tablet_type,
        flags=probe.flags,
        idle_timeout=min(timeout, 10.0),
        deadline=time.monotonic() + timeout,
        retry=RetryPolicy(max_elapsed=timeout),
    )
    events = reader.events()
    last = ""
    try:
        for event in events:
            position = full_position(event)
            if position is not None:
                return position
    except VStreamDeadlineError as exc:
        last = f"; {exc}"  # names the last error vtgate answered with, if any
    finally:
        events.close()
    raise _no_position(keyspace, target, timeout, last)


async def current_position(
    client: AsyncStreams, keyspace: str, target: StreamTarget, timeout: float = 30.0
) -> Vgtid:
    """:func:`capture_stop_position` over ``grpc.aio`` (one call, bounded by ``timeout``)."""
    call = client.vstream(position_request(keyspace, target), timeout=timeout)
    decoder = EventDecoder()
    try:
        responses: AsyncIterator[vtgate_pb2.VStreamResponse] = call
        async for response in responses:
            for ev in response.events:
                position = full_position(decoder.decode(ev))
                if position is not None:
                    return position
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    finally:
        call.cancel()
    raise _no_position(keyspace, target, timeout)
