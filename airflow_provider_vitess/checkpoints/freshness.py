"""How old a sync's data is: the time its committed position stands for ("as of").

Every transaction the source committed before a sync's *as of* time is in its Delta tables.
A window reads every table of the sync to one end position, so one time serves all of them:

* a catch-up window that reached its stop: the moment the stop position was taken (the worker's
  clock just before it asked vtgate for the keyspace's current position; ``STOP_TAKEN_AT`` in
  the window's stats). A quiet table is as fresh as a busy one: the stop is taken every run.
  The later windows of one backlog share the first one's stop, and its time. A stop read from
  REPLICA or RDONLY tablets is as old as their replication lag: its time is lowered by the lag
  (``vstream/source_clock.py``), and none is recorded when the lag is not known
  (``STOP_LAG_UNKNOWN``): the window then keeps the sync's time, never the worker's clock.
* a catch-up window cut short (``max_events``, ``max_seconds``, shards behind its stop): the
  time the sync had before it. Never later than the truth, at worst older, until a window of the
  chain reaches the stop.
* a snapshot: the moment it was planned (its copy holds everything committed before); copied
  from REPLICA or RDONLY tablets, the source's time then (``STOP_TAKEN_AT``, lowered as above),
  or none when the lag is not known.
* a quiet source, between commits: the changes sensor that streamed the sync's tables from the
  committed position up to the keyspace's position and found no change proves that every
  transaction before that position, so before the moment it was taken, is in the targets; it
  moves *as of* there (:func:`record_quiet`), with no window. Without it a quiet source's runs
  skip their catch-up and merge, and *as of* would stand still until the next commit.

Times are the worker's (UTC); a replica's lag, measured on the tablets, is a duration.
"Seconds behind" is then the worker's now minus *as of*: both ends on one clock, so a skew
between the source's clock and the worker's neither makes it negative nor adds to it; only the
worker clock's own error counts (one NTP-synced host: milliseconds).

A freshness objective (``freshness_sla``, seconds, given to the merge task) is breached when the
data is older than that: kept with the committed position, so the status page can say so while
the sync's tasks fail (a stalled sync). A quiet source is never a breach: its runs move the time.
The merge task reports a breach of the window it committed (a warning, ``breached`` in its
result) and still succeeds: what it committed is there, and its asset events must reach the
table's consumers. Only a catch-up window can breach it there (:func:`window_breached`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, or_, select, update

from airflow_provider_vitess.checkpoints.models import CheckpointRow
from airflow_provider_vitess.checkpoints.states import WindowKind
from airflow_provider_vitess.vgtid import Vgtid

STOP_TAKEN_AT = "stop_taken_at"  # window stats: the source time of the stop position (ISO 8601, UTC)
STOP_LAG_UNKNOWN = "stop_lag_unknown"  # window stats: why a replica's lag, so that time, is not known
_CHECKPOINT = cast(Table, CheckpointRow.__table__)


def window_as_of(kind: WindowKind, stats: Mapping[str, Any], created_at: datetime) -> datetime | None:
    """The *as of* time of a window's end position (see the module), or None when the window
    does not move it (a catch-up window that ended before its stop)."""
    taken = stats.get(STOP_TAKEN_AT)
    if kind is WindowKind.SNAPSHOT:
        # A copy from a replica: its source time, if known (STOP_LAG_UNKNOWN: not claimed).
        if taken:
            return datetime.fromisoformat(str(taken))
        return None if stats.get(STOP_LAG_UNKNOWN) else created_at
    lag = stats.get("shard_lag_transactions") or {}
    if not taken or (stats.get("stopped_early") and any(lag.values())):
        return None
    return datetime.fromisoformat(str(taken))


def seconds_behind(as_of: datetime | None, now: datetime) -> float | None:
    """How many seconds ``now`` is past ``as_of`` (never negative)."""
    return None if as_of is None else round(max(0.0, (now - as_of).total_seconds()), 3)


def breached(as_of: datetime | None, sla: float | None, now: datetime) -> bool:
    """Is the data older than its objective? (No objective, or no data yet: no.)"""
    behind = seconds_behind(as_of, now)
    return sla is not None and behind is not None and behind > sla


def window_breached(kind: WindowKind, as_of: datetime | None, sla: float | None, now: datetime) -> bool:
    """Does the window the merge task just committed breach the objective? Catch-up windows
    only: a snapshot's *as of* is when it was planned, and a first copy (or a re-copy) takes as
    long as the tables take; the objective is meant for what follows, the run's own catch-up."""
    return kind is WindowKind.CATCHUP and breached(as_of, sla, now)


def record_sla(engine: Engine, sync_id: str, sla: float | None) -> None:
    """Keep the merge task's objective with the sync's committed position (status page)."""
    with engine.begin() as conn:
        conn.execute(update(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id).values(freshness_sla=sla))


def record_quiet(engine: Engine, sync_id: str, watched_from: Vgtid, taken_at: datetime) -> datetime | None:
    """A read of the sync's tables from ``watched_from`` up to a position taken at ``taken_at``
    found no change: moves the committed position's *as of* to ``taken_at`` if the sync is still
    committed at ``watched_from`` (a window committed since has a time of its own) and never
    backwards. Returns the time the sync had when it moved, else None (nothing written)."""
    with engine.begin() as conn:
        row = conn.execute(select(_CHECKPOINT).where(_CHECKPOINT.c.sync_id == sync_id)).first()
        if row is None or row.as_of is None or row.as_of >= taken_at:
            return None
        committed = Vgtid.from_json(row.committed_vgtid)
        if not (committed.has_reached(watched_from) and watched_from.has_reached(committed)):
            return None
        moved = conn.execute(
            update(_CHECKPOINT)
            .where(
                _CHECKPOINT.c.sync_id == sync_id,
                _CHECKPOINT.c.committed_seq == row.committed_seq,  # no commit in between
                or_(_CHECKPOINT.c.as_of.is_(None), _CHECKPOINT.c.as_of < taken_at),
            )
            .values(as_of=taken_at)
        ).rowcount
        return cast(datetime, row.as_of) if moved == 1 else None
