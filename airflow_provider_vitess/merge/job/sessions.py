"""Work on independent Delta tables at once, each piece on a Spark session of its own.

A merge's tables are independent (each has its own Delta log and transaction id), so the job
reads their states and merges them concurrently: Spark's scheduler fills the executors with
several small tables' tasks while each table's driver-side work (planning, Delta's log and
commit) waits. A MERGE's transaction id is session configuration, which threads must not
share: each running piece holds a session, given back when it ends. Classic sessions come from
``spark.newSession()`` (one application); Spark Connect ones from the caller's maker, which
also stops them (:func:`.connect.remote_sessions`).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Tables worked on at once unless the job is told otherwise: enough to keep a small cluster's
# executors busy between one table's driver-side steps; each adds a session, a thread and the
# table's Delta snapshot to the driver, which hundreds at once (a snapshot of a large keyspace)
# would exhaust for no gain.
DEFAULT_PARALLELISM = 8

T = TypeVar("T")
R = TypeVar("R")


class TableSessions:
    """Up to ``parallelism`` sessions (``spark`` the first), made as the work needs them.
    ``activate`` makes a session the running thread's (:meth:`.delta_access.DeltaAccess.activate`:
    Delta's threads in a classic driver need it)."""

    def __init__(
        self,
        spark: SparkSession,
        new_session: Callable[[], SparkSession] | None = None,
        parallelism: int | None = None,
        activate: Callable[[SparkSession], None] = lambda _: None,
    ) -> None:
        self.spark = spark
        self._activate = activate
        self._new = new_session
        self.parallelism = max(1, parallelism or DEFAULT_PARALLELISM)
        self._free: queue.SimpleQueue[SparkSession] = queue.SimpleQueue()
        self._free.put(spark)
        self._made = 1

    def map(self, work: Callable[[SparkSession, T], R], items: Mapping[str, T]) -> dict[str, R]:
        """``work(session, item)`` for each table's item, up to ``parallelism`` at once (one:
        in this thread, on ``spark``). The first failure is raised once every started piece has
        ended (no commit is abandoned half-way)."""
        workers = min(len(items), self.parallelism)
        if workers <= 1:
            return {table: work(self.spark, item) for table, item in items.items()}
        while self._made < workers:  # made here, in the caller's thread (Connect's active session)
            self._free.put(self._new() if self._new else self.spark.newSession())
            self._made += 1

        def on_a_session(item: T) -> R:
            session = self._free.get()
            try:
                self._activate(session)
                return work(session, item)
            finally:
                self._free.put(session)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="merge") as pool:
            futures = {table: pool.submit(on_a_session, item) for table, item in items.items()}
            wait(futures.values())
        return {table: future.result() for table, future in futures.items()}
