"""A fault-injecting TCP proxy between a test's client and the real local vtgate.

It forwards real bytes both ways (gRPC over HTTP/2, plaintext or TLS alike: it never looks
inside) and, on command from the test thread, injures the connections:

* ``cut_after(n)``: once ``n`` more bytes have gone from vtgate to the client, every open
  connection is aborted (the client sees the socket die mid-stream). ``n`` is where a seeded
  test wants the cut: inside a copy, inside a large transaction.
* ``stall()``: the connections open now stop forwarding in both directions but stay open (a
  black-holed network path: nothing is closed, nothing arrives, keepalive pings go unanswered);
  connections opened later flow normally. ``resume()`` lets the stalled ones go again.
* ``slow(bytes_per_second)``: every connection forwards at most that rate towards the client.

The proxy runs its own asyncio loop on a daemon thread; commands are thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

_CHUNK = 16 << 10


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    flowing: asyncio.Event = field(default_factory=asyncio.Event)

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()


@dataclass
class ProxyStats:
    connections: int = 0
    bytes_down: int = 0  # vtgate -> client, over the proxy's life
    cuts: int = 0  # connections aborted by cut_after
    stalled: int = 0  # connections stalled by stall()


class FaultProxy:
    """``FaultProxy(upstream_port)``; ``start()`` returns the local port to connect to."""

    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self._host, self._upstream_port = host, upstream_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._cut_budget: int | None = None
        self._rate: float | None = None
        self.stats = ProxyStats()
        self.port = 0

    # ----- control (any thread) ------------------------------------------------------------

    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self._listen())
        return self.port

    def stop(self) -> None:
        """Close the listener and every connection (vtgate unreachable from then on); again: no-op."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def cut_after(self, n: int) -> None:
        """Abort every connection once ``n`` more bytes have been forwarded to the client."""
        self._loop.call_soon_threadsafe(setattr, self, "_cut_budget", n)

    def disarm(self) -> None:
        """Forget a ``cut_after`` that has not fired yet."""
        self._loop.call_soon_threadsafe(setattr, self, "_cut_budget", None)

    def stall(self) -> None:
        def stall() -> None:
            for conn in self._conns:
                conn.flowing.clear()
                self.stats.stalled += 1

        self._loop.call_soon_threadsafe(stall)

    def resume(self) -> None:
        def resume() -> None:
            for conn in self._conns:
                conn.flowing.set()

        self._loop.call_soon_threadsafe(resume)

    def slow(self, bytes_per_second: float | None) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_rate", bytes_per_second)

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # ----- the loop ------------------------------------------------------------------------

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self._host, self._upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        conn = _Conn(client_w, up_w)
        conn.flowing.set()
        self._conns.add(conn)
        self.stats.connections += 1
        try:
            await asyncio.gather(
                self._pump(conn, client_r, up_w, down=False), self._pump(conn, up_r, client_w, down=True)
            )
        finally:
            self._conns.discard(conn)
            conn.abort()

    async def _pump(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, down: bool
    ) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                await conn.flowing.wait()
                if not data:
                    writer.close()
                    return
                if down and self._cut_budget is not None:
                    if len(data) >= self._cut_budget:
                        data = data[: self._cut_budget]
                        writer.write(data)
                        self.stats.bytes_down += len(data)
                        await writer.drain()
                        self._cut_all()
                        return
                    self._cut_budget -= len(data)
                writer.write(data)
                await writer.drain()
                if down:
                    self.stats.bytes_down += len(data)
                    if self._rate:
                        await asyncio.sleep(len(data) / self._rate)
        except (ConnectionError, OSError):
            conn.abort()

    def _cut_all(self) -> None:
        self._cut_budget = None
        for conn in list(self._conns):
            conn.abort()
            self.stats.cuts += 1
