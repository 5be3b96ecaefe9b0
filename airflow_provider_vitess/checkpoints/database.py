"""``StoreDatabase``: the checkpoint store's database, its schema, and the per-sync lock that
fences every write to it (the base of :class:`~.store.CheckpointStore`).

The lock and the write transactions live together because the lock's whole point is the fence:
while a process holds a sync's lock through :meth:`StoreDatabase.lock`, each of its write
transactions first checks that the lock is still its own (``locking.fence``), so a holder that
was taken over (it stalled past ``stale_after``) can never write over its successor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints import locking, models, schema
from airflow_provider_vitess.checkpoints.locking import DEFAULT_STALE_AFTER, SyncLock
from airflow_provider_vitess.checkpoints.states import LockInfo

log = logging.getLogger(__name__)


def default_url() -> str:
    """A SQLite file next to Airflow's own files: works out of the box on a single machine."""
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")
    return f"sqlite:///{home / 'vitess_sync.db'}"


class StoreDatabase:
    """One store database (any SQLAlchemy URL); call :meth:`migrate` once before use."""

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        clock: Callable[[], datetime] = models.utcnow,
    ) -> None:
        if engine is not None and url is not None:
            raise ValueError("pass either a database URL or an engine, not both")
        self._owns_engine = engine is None
        self.engine = (
            engine if engine is not None else create_engine(url or default_url(), pool_pre_ping=True)
        )
        # Injected so tests can age a lock without sleeping; must return aware UTC times.
        self._clock = clock
        # The lock held through :meth:`lock`: while set, every write checks it (``_begin``).
        self._fence: SyncLock | None = None

    @contextmanager
    def _begin(self, what: str) -> Iterator[Connection]:
        """A write transaction; under a held lock, fenced by it (see ``locking.fence``)."""
        with self.engine.begin() as conn:
            if self._fence is not None:
                locking.fence(conn, self._fence, self._clock(), what)
            yield conn

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    # -- schema -------------------------------------------------------------------------------

    def migrate(self, wait_seconds: float = 60.0) -> str:
        """Upgrade the schema to the newest revision (idempotent, safe to race); returns it."""
        return schema.migrate(self.engine, wait_seconds)

    def schema_revision(self) -> str | None:
        return schema.schema_revision(self.engine)

    # -- the per-sync lock --------------------------------------------------------------------

    def lock_holder(self, sync_id: str) -> LockInfo | None:
        return locking.lock_holder(self.engine, sync_id)

    def acquire_lock(
        self, sync_id: str, holder: str, stale_after: timedelta = DEFAULT_STALE_AFTER
    ) -> SyncLock:
        """Take the sync's lock (or a stale one over); SyncLockedError names the current holder."""
        return locking.acquire(self.engine, self._clock, sync_id, holder, stale_after)

    @contextmanager
    def lock(
        self, sync_id: str, holder: str, stale_after: timedelta = DEFAULT_STALE_AFTER
    ) -> Iterator[SyncLock]:
        """Hold the sync's lock for the block; released on exit, exceptions included. Every
        write of this store inside the block is fenced by the lock: refused once another holder
        took the sync over.

        ``holder`` should say who to wait for, e.g. ``"dag_id/run_id/try 2"``.
        """
        handle = self.acquire_lock(sync_id, holder, stale_after)
        outer, self._fence = self._fence, handle
        try:
            yield handle
        finally:
            self._fence = outer
            if not handle.release():
                log.warning("%r no longer held the lock of sync %r at release", holder, sync_id)

    @contextmanager
    def hold(
        self, sync_id: str, holder: str, stale_after: timedelta = DEFAULT_STALE_AFTER
    ) -> Iterator[SyncLock]:
        """:meth:`lock`, heartbeating from a thread every third of ``stale_after``: a killed
        holder's lock goes stale quickly (a rerun takes it over), a live one keeps it however
        long its work takes."""
        with (
            self.lock(sync_id, holder, stale_after) as handle,
            locking.heartbeating(handle, stale_after.total_seconds() / 3),
        ):
            yield handle
