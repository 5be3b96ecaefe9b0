"""The source's own time at a position read from a replica: what a stop's *as of* can claim.

A window's stop (and the changes sensor's "now") is the position of the tablets the connection
streams from (``tablet_type``). On a PRIMARY that position holds every transaction committed
before the moment it was taken. On a REPLICA or RDONLY tablet it holds only what the tablet has
applied: a replica 30 minutes behind gives a position 30 minutes old, and the worker's clock at
that moment would report it fresh (``checkpoints/freshness.py``). So for those types the time is
the source's: the worker's clock *before* the tablets' lag was asked, minus the largest lag any
tablet of that type reports for a shard of the position, minus one second (the lag comes in
whole seconds). Read before the position is taken, never after: a tablet's applied position only
grows, so the position taken next holds at least what the tablet held when it reported its lag;
a lag read after it would credit a replica that caught up in between with its new position.

The lag is vtgate's ``SHOW VITESS_REPLICATION_STATUS`` (one row per REPLICA/RDONLY tablet it
watches, ``ReplicationLag`` in seconds): the tablet's replication tracker when one runs
(``--heartbeat-enable``: measured against the primary's own heartbeat writes, the soundest;
``--enable-replication-reporter``: polling), else the tablet's mysqld ``Seconds_Behind_Master``,
which vtgate asks as the tablets' app user (on MariaDB 10.5+ that user needs the ``SLAVE
MONITOR`` privilege; MySQL's ``REPLICATION CLIENT``). It is as true as what the tablets report:
a tracker's value is from its last health report (``--health-check-interval``), and
``Seconds_Behind_Master`` reads 0 on a replica whose link to its primary is cut without a word
until ``slave_net_timeout``. When a tablet's lag cannot be read (no such tablet for a shard,
replication stopped: ``NULL``, vtgate could not ask: ``-1``), no time is claimed: the caller keeps
the time the sync had (never the worker's clock), and the reason is logged and recorded.

Why not the VStream's own event timestamps: a binlog event's ``timestamp`` is its commit time on
the primary, but a stop is taken on a quiet keyspace as often as on a busy one, and a quiet
replica sends no event whose time says how far it has applied: the tablets' HEARTBEAT events carry
the tablet's clock now, not the primary's time of the last transaction applied.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy

from airflow_provider_vitess.checkpoints.freshness import STOP_LAG_UNKNOWN
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.vgtid import Vgtid

log = logging.getLogger(__name__)

# Window stats: the tablet type a stop was read from and the lag its time was lowered by (or,
# STOP_LAG_UNKNOWN, why none is known).
STOP_TABLET_TYPE = "stop_tablet_type"
STOP_LAG_SECONDS = "stop_lag_seconds"
_LAG_GRAIN = 1.0  # ReplicationLag is whole seconds, cut down: the truth is up to 1 s more


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class SourceClock:
    """The worker's time and the tablets' lag, read just before a position is taken."""

    tablet_type: str
    asked_at: datetime.datetime  # the worker's clock before the lag was asked
    lags: Mapping[str, list[float]] = field(default_factory=dict)  # shard -> its tablets' lags
    unreadable: Mapping[str, str] = field(default_factory=dict)  # shard -> why a lag is unknown
    failure: str | None = None  # the lag could not be asked at all

    @classmethod
    def read(
        cls,
        hook: VitessClient,
        keyspace: str,
        tablet_type: str,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> SourceClock:
        """Call right before taking the position (see the module)."""
        tablet_type = tablet_type.upper()
        asked_at = clock()
        if tablet_type == "PRIMARY":
            return cls(tablet_type, asked_at)
        try:
            with hook.connect_sql() as conn:
                rows = conn.exec_driver_sql("SHOW VITESS_REPLICATION_STATUS").mappings().all()
        except sqlalchemy.exc.SQLAlchemyError as exc:
            return cls(tablet_type, asked_at, failure=f"SHOW VITESS_REPLICATION_STATUS failed: {exc}")
        lags: dict[str, list[float]] = {}
        unreadable: dict[str, str] = {}
        for row in rows:
            if str(row["Keyspace"]) != keyspace or str(row["TabletType"]).upper() != tablet_type:
                continue
            shard, raw = str(row["Shard"]), str(row["ReplicationLag"])
            try:
                lag = float(raw)
            except ValueError:
                lag = -1.0
            if lag < 0:
                # -1: vtgate could not ask the tablet (none of that type serves in its health
                # check yet, or SHOW SLAVE STATUS failed); NULL: mysqld knows no lag.
                why = " (vtgate could not ask it)" if raw == "-1" else ""
                unreadable[shard] = (
                    f"tablet {row['Alias']} reports lag {raw!r}{why} (replication {row['ReplicationHealth']})"
                )
            else:
                lags.setdefault(shard, []).append(lag)
        return cls(tablet_type, asked_at, lags, unreadable)

    def lag_of(self, stop: Vgtid) -> float | str:
        """The largest lag of the stop's shards' tablets of the type (seconds), or why it is
        not known."""
        if self.failure is not None:
            return self.failure
        shards = sorted({sg.shard for sg in stop.shard_gtids})
        bad = [f"{s}: {self.unreadable[s]}" for s in shards if s in self.unreadable]
        bad += [
            f"{s}: no {self.tablet_type} tablet in vtgate's list"
            for s in shards
            if s not in self.lags and s not in self.unreadable
        ]
        if bad:
            return "; ".join(dict.fromkeys(bad))
        return max(max(self.lags[s]) for s in shards)

    def time_of(self, stop: Vgtid, what: str) -> tuple[datetime.datetime | None, dict[str, Any]]:
        """The source time ``stop`` (taken after :meth:`read`) stands for, and what to record
        with it (window stats). None when the lag is not known: logged, naming ``what``."""
        if self.tablet_type == "PRIMARY":
            return self.asked_at, {}
        lag = self.lag_of(stop)
        if isinstance(lag, str):
            log.warning(
                "%s: the replication lag of the %s tablets it was read from is not known (%s): no "
                "freshness is claimed for it (its data keeps the time it had). Remedy: "
                "replication running, and vtgate able to ask the tablets (SHOW VITESS_REPLICATION_"
                "STATUS; on MariaDB the tablets' app user needs SLAVE MONITOR)",
                what,
                self.tablet_type,
                lag,
            )
            return None, {STOP_TABLET_TYPE: self.tablet_type, STOP_LAG_UNKNOWN: lag}
        at = self.asked_at - datetime.timedelta(seconds=lag + _LAG_GRAIN)
        log.info(
            "%s: read from %s tablets %g s behind their primary: its data is as of %s",
            what,
            self.tablet_type,
            lag,
            at.isoformat(),
        )
        return at, {STOP_TABLET_TYPE: self.tablet_type, STOP_LAG_SECONDS: lag}


def stop_and_time(
    hook: VitessClient, keyspace: str, tablet_type: str, take: Callable[[], Vgtid], what: str
) -> tuple[Vgtid, datetime.datetime | None, dict[str, Any]]:
    """The position ``take`` gives (taken after the lag was read), the source time it stands for
    (None: not known) and what to record with it (see :meth:`SourceClock.time_of`)."""
    clock = SourceClock.read(hook, keyspace, tablet_type)
    stop = take()
    at, stats = clock.time_of(stop, what)
    return stop, at, stats
