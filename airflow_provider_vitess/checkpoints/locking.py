"""The per-sync lock: one row per sync whose primary key makes a second INSERT fail.

Portable on purpose (no advisory locks, no ``SELECT ... FOR UPDATE``): the INSERT fails on the
primary key on SQLite, MariaDB/MySQL and PostgreSQL alike. A holder that stopped heartbeating
(a killed Airflow worker) is taken over by a conditional ``UPDATE ... WHERE heartbeat_at <
cutoff`` whose row count says who won when two takers race.

Staleness is judged with the callers' clocks (UTC): keep ``stale_after`` far above any clock skew
between workers and far above the heartbeat interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Engine, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints.models import LockRow
from airflow_provider_vitess.checkpoints.states import LockInfo, lock_is_stale
from airflow_provider_vitess.exceptions import SyncLockedError

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER = timedelta(minutes=10)
_LOCK = cast(Table, LockRow.__table__)
Clock = Callable[[], datetime]


class SyncLock:
    """A held lock; call :meth:`heartbeat` well within ``stale_after`` while working."""

    def __init__(self, engine: Engine, clock: Clock, sync_id: str, holder: str) -> None:
        self._engine, self._clock = engine, clock
        self.sync_id, self.holder = sync_id, holder

    def heartbeat(self) -> None:
        heartbeat(self._engine, self._clock(), self.sync_id, self.holder)

    def release(self) -> bool:
        return release(self._engine, self.sync_id, self.holder)


def lock_holder(engine: Engine, sync_id: str) -> LockInfo | None:
    with engine.connect() as conn:
        row = conn.execute(select(_LOCK).where(_LOCK.c.sync_id == sync_id)).first()
    return None if row is None else LockInfo(row.sync_id, row.holder, row.acquired_at, row.heartbeat_at)


def acquire(engine: Engine, clock: Clock, sync_id: str, holder: str, stale_after: timedelta) -> SyncLock:
    """Take the sync's lock, or take it over if its holder stopped heartbeating.

    Any other fresh holder, the same holder text included, is refused: a retried task whose
    previous try may still be running must not share the sync with it.
    """
    for _ in range(3):
        now = clock()
        try:
            with engine.begin() as conn:
                conn.execute(
                    insert(_LOCK).values(sync_id=sync_id, holder=holder, acquired_at=now, heartbeat_at=now)
                )
            return SyncLock(engine, clock, sync_id, holder)
        except IntegrityError:
            pass  # held: look at the holder below
        current = lock_holder(engine, sync_id)
        if current is None:
            continue  # released between our INSERT and our SELECT
        if not lock_is_stale(current.heartbeat_at, now, stale_after):
            raise SyncLockedError(f"{current.describe()}; {holder!r} cannot take it")
        with engine.begin() as conn:
            taken = conn.execute(
                update(_LOCK)
                .where(_LOCK.c.sync_id == sync_id, _LOCK.c.heartbeat_at < now - stale_after)
                .values(holder=holder, acquired_at=now, heartbeat_at=now)
            ).rowcount
        if taken == 1:
            log.warning("%r took over a stale lock: %s", holder, current.describe())
            return SyncLock(engine, clock, sync_id, holder)
        # Another taker won, or the holder heartbeated just now: look again.
    raise SyncLockedError(f"sync {sync_id!r}: {holder!r} could not take the lock, it keeps changing hands")


def heartbeat(engine: Engine, now: datetime, sync_id: str, holder: str) -> None:
    """Refresh the lock; raises SyncLockedError if it was taken over meanwhile."""
    with engine.begin() as conn:
        fresh = conn.execute(
            update(_LOCK).where(_LOCK.c.sync_id == sync_id, _LOCK.c.holder == holder).values(heartbeat_at=now)
        ).rowcount
    if fresh != 1:
        current = lock_holder(engine, sync_id)
        now_held = current.describe() if current else f"sync {sync_id!r} is not locked"
        raise SyncLockedError(f"{holder!r} lost its lock: {now_held}")


def release(engine: Engine, sync_id: str, holder: str) -> bool:
    """Release our lock; False if it was no longer ours (another holder's lock is never deleted)."""
    with engine.begin() as conn:
        deleted = conn.execute(delete(_LOCK).where(_LOCK.c.sync_id == sync_id, _LOCK.c.holder == holder))
    return deleted.rowcount == 1
