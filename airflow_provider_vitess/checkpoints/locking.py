"""The per-sync lock: one row per sync whose primary key makes a second INSERT fail.

Portable on purpose (no advisory locks, no ``SELECT ... FOR UPDATE``): the INSERT fails on the
primary key on SQLite, MariaDB/MySQL and PostgreSQL alike. A holder that stopped heartbeating
(a killed Airflow worker) is taken over by a conditional ``UPDATE ... WHERE heartbeat_at <
cutoff`` whose row count says who won when two takers race.

Staleness is judged with the callers' clocks (UTC): keep ``stale_after`` far above any clock skew
between workers and far above the heartbeat interval.

Fencing: each taking of the lock gets a new random token. A holder that stalled past
``stale_after`` (a stopped VM, a long GC pause) and wakes after another run took the sync over
still believes it holds the lock; so every store write made under the lock first runs
:func:`fence` in the same transaction: an ``UPDATE`` of the lock row that matches the holder's
token (and refreshes its heartbeat). No match, no write: the transaction is rolled back with
:class:`SyncLockedError`. The ``UPDATE`` also locks the row until the write commits, so a
taker's conditional ``UPDATE`` waits for it and then finds a fresh heartbeat: a takeover can
never fall between the check and the write.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Engine, Table, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints.models import LockRow
from airflow_provider_vitess.checkpoints.states import LockInfo, lock_is_stale
from airflow_provider_vitess.exceptions import SyncLockedError

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER = timedelta(minutes=10)
# What the capture and merge tasks use (docs/troubleshooting.md, docs/design.md say so): a killed
# task's sync is free again after 2 minutes without heartbeat.
TASK_STALE_AFTER = timedelta(minutes=2)
_LOCK = cast(Table, LockRow.__table__)
Clock = Callable[[], datetime]


class SyncLock:
    """A held lock; call :meth:`heartbeat` well within ``stale_after`` while working."""

    def __init__(self, engine: Engine, clock: Clock, sync_id: str, holder: str, token: str) -> None:
        self._engine, self._clock = engine, clock
        self.sync_id, self.holder, self.token = sync_id, holder, token

    def heartbeat(self) -> None:
        """Refresh the lock; raises SyncLockedError if it was taken over meanwhile."""
        with self._engine.begin() as conn:
            fence(conn, self, self._clock(), "heartbeat")

    def release(self) -> bool:
        return release(self._engine, self.sync_id, self.token)


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
        now, token = clock(), uuid.uuid4().hex
        try:
            with engine.begin() as conn:
                conn.execute(
                    insert(_LOCK).values(
                        sync_id=sync_id, holder=holder, acquired_at=now, heartbeat_at=now, token=token
                    )
                )
            return SyncLock(engine, clock, sync_id, holder, token)
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
                .values(holder=holder, acquired_at=now, heartbeat_at=now, token=token)
            ).rowcount
        if taken == 1:
            log.warning("%r took over a stale lock: %s", holder, current.describe())
            return SyncLock(engine, clock, sync_id, holder, token)
        # Another taker won, or the holder heartbeated just now: look again.
    raise SyncLockedError(f"sync {sync_id!r}: {holder!r} could not take the lock, it keeps changing hands")


def fence(conn: Connection, lock: SyncLock, now: datetime, what: str) -> None:
    """In the caller's transaction: refresh ``lock``'s heartbeat if it is still held with its
    token, else raise SyncLockedError (the caller's transaction, and its write, roll back)."""
    fresh = conn.execute(
        update(_LOCK)
        .where(_LOCK.c.sync_id == lock.sync_id, _LOCK.c.token == lock.token)
        .values(heartbeat_at=now)
    ).rowcount
    if fresh == 1:
        return
    row = conn.execute(select(_LOCK).where(_LOCK.c.sync_id == lock.sync_id)).first()
    now_held = (
        LockInfo(row.sync_id, row.holder, row.acquired_at, row.heartbeat_at).describe()
        if row is not None
        else f"sync {lock.sync_id!r} is not locked"
    )
    raise SyncLockedError(
        f"{lock.holder!r} lost its lock: {now_held}. It stalled past the lock's expiry and another "
        f"run took sync {lock.sync_id!r} over, so its {what} was refused and nothing of it was "
        "stored; nothing to repair, the run holding the sync goes on from the checkpoint"
    )


def release(engine: Engine, sync_id: str, token: str) -> bool:
    """Release our lock; False if it was no longer ours (another holder's lock is never deleted)."""
    with engine.begin() as conn:
        deleted = conn.execute(delete(_LOCK).where(_LOCK.c.sync_id == sync_id, _LOCK.c.token == token))
    return deleted.rowcount == 1


@contextmanager
def heartbeating(lock: SyncLock, every_seconds: float) -> Iterator[None]:
    """Heartbeats ``lock`` from a thread every ``every_seconds`` for the block, so a killed
    holder's lock goes stale soon while a live one keeps it however long its work takes."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_seconds):
            try:
                lock.heartbeat()
            except Exception as exc:  # taken over: the holder's own writes now fail too
                log.error("lost the lock of sync %r: %s", lock.sync_id, exc)
                return

    beater = threading.Thread(target=beat, name="sync-lock-heartbeat", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()
