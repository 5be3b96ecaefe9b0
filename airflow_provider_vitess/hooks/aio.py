"""VStream over ``grpc.aio`` for code that runs in an event loop (triggers in the triggerer).

Same connection, same channel options (message size, keepalives, TLS server name), same TLS
files and the same credentials metadata as :class:`VitessHook`'s blocking client, so a trigger
reaches vtgate exactly the way the task's hook does. The connection is looked up with Airflow's
async API (``aget_connection``): a blocking lookup inside the triggerer's loop would stall every
other trigger of the process.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

import grpc
import grpc.aio

from airflow_provider_vitess._proto import vtgate_pb2
from airflow_provider_vitess.hooks.channel import new_channel, not_answering
from airflow_provider_vitess.hooks.connection_config import VitessConnectionConfig
from airflow_provider_vitess.hooks.vitess import VSTREAM_METHOD, VitessHook

log = logging.getLogger(__name__)


VStreamCall = grpc.aio.UnaryStreamCall[vtgate_pb2.VStreamRequest, vtgate_pb2.VStreamResponse]


async def aload_config(hook: VitessHook) -> VitessConnectionConfig:
    """The hook's connection config, looked up without blocking the loop (then cached on the hook)."""
    if "config" not in hook.__dict__:
        conn = await hook.aget_connection(hook.vitess_conn_id)
        # Fills the hook's cached_property, so its helpers (options, flags, metadata) use it too.
        hook.__dict__["config"] = VitessConnectionConfig.from_parts(
            host=conn.host, port=conn.port, login=conn.login, password=conn.password, extra=conn.extra_dejson
        )
    return hook.config


class AsyncVStreamClient:
    """One ``grpc.aio`` channel to vtgate; ``async with`` opens and checks it, and closes it.

    :param hook: the ``VitessHook`` of the connection (only its configuration is used).
    """

    def __init__(self, hook: VitessHook) -> None:
        self.hook = hook
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> AsyncVStreamClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> grpc.aio.Channel:
        if self._channel is not None:
            return self._channel
        cfg = await aload_config(self.hook)
        channel: grpc.aio.Channel = new_channel(cfg, grpc.aio)
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=cfg.timeout_seconds)
        except asyncio.TimeoutError:
            await channel.close(None)
            # Its TLS diagnosis is a blocking handshake: off the triggerer's event loop.
            raise await asyncio.to_thread(not_answering, cfg) from None
        except BaseException:
            await channel.close(None)
            raise
        self._channel = channel
        return channel

    def vstream(self, request: vtgate_pb2.VStreamRequest, timeout: float | None = None) -> VStreamCall:
        """Starts one VStream call: ``async for`` its responses, ``cancel()`` it when done."""
        if self._channel is None:
            raise RuntimeError("AsyncVStreamClient.vstream() before connect()")
        method = self._channel.unary_stream(
            VSTREAM_METHOD,
            request_serializer=vtgate_pb2.VStreamRequest.SerializeToString,
            response_deserializer=vtgate_pb2.VStreamResponse.FromString,
        )
        call: VStreamCall = method(
            self.hook.with_caller(request), timeout=timeout, metadata=self.hook.call_metadata()
        )
        return call

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close(None)
