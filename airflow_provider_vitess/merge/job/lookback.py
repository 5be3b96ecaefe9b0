"""Earlier windows' events that a window's per-key rule needs (see :mod:`.window_rows`).

vtgate moves a row between shards as a DELETE on one shard and an INSERT on the other: two shard
commits, milliseconds apart. A window's stop position is read shard by shard, so it can fall
between the two: the INSERT lands in window N, the DELETE in window N+1. Merged alone, window N+1
would see only the DELETE and remove a row that the other shard holds. So when a window is merged
into a table, the job also reads the events of earlier windows that can hold a move's other half:
as their shards' last events they say which shard still holds a key the window deletes. The
look-back ends at a snapshot of the table (a copy decides every key it has).

Which events of an earlier window count is bounded by what the shards agree on, the window's
positions, not by comparing one shard's commit seconds with another's: each shard's MySQL stamps
its commits with its own clock, and primaries whose clocks disagree by more than a few seconds
would put the INSERT half outside a bound in seconds and lose the row (issue 38; detecting such a
skew and failing would stop the sync where this rule simply merges it right, so it is not the
design). A window that read every shard to its stop ends at one instant on every shard (the stop
is read from vtgate at once): a move split by it has its other half among its shard's last events
before that instant, so of such a window each shard's events of the table within
:data:`CONTEXT_SECONDS` of that shard's own newest one in it count (one clock per comparison).
A window that ended early (``max_events``, ``max_seconds``) was cut by the read's merge in commit
seconds, where the shards' clocks meet: each of its events counts (:attr:`Reach.WHOLE`), and so
do the windows before it back to one that reached its stop (the halves of a move are in windows
with no stop reached between them). A snapshot's binlog events count whole too (its shards'
streams end together only when none lags). Beyond those windows, events committed
:data:`CONTEXT_SECONDS` before the window's first commit onwards count as well
(:attr:`Reach.SECONDS`: the earlier rule, for copies of a grouped snapshot and windows from before
these stats).

How far back the seconds rule looks is decided from what the staged files record, without reading
rows: a Parquet footer's min/max of ``_commit_ts`` per part, and the newest source time each
window's read saw (its stats' ``source_ts_max``: commits and heartbeats, the tablets' clocks).
Every event of a window, and of every window before it, committed before that time, so once a
window's is before the cut-off, no earlier window can hold an event after it. (Manifests written
before that stat existed are bounded by their ``created_at``, the capturing worker's clock.)

Pure selection logic plus two small readers of staged metadata; the Spark side is in :mod:`.window_step`.
(:data:`MAX_WINDOWS_BACK` is staging's: retention keeps that many windows for this look-back.)
"""

from __future__ import annotations

import datetime
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.parquet as pq

from airflow_provider_vitess.exceptions import InvalidVgtidError
from airflow_provider_vitess.staging import arrow_types as A
from airflow_provider_vitess.staging.manifest import GROUP_READS, Manifest
from airflow_provider_vitess.staging.retention import MAX_WINDOWS_BACK
from airflow_provider_vitess.vgtid import Vgtid

log = logging.getLogger(__name__)

# The two commits of a move are milliseconds apart, and a stop is read from every shard at once;
# seconds leave room for a slow commit. Compared within one shard's clock (module docstring), and
# across shards' clocks only where nothing else bounds the look-back (Reach.SECONDS).
CONTEXT_SECONDS = 5
# The shards' MySQL servers (and, for an old manifest's created_at, the capturing worker) keep
# clocks of their own: allow them to differ.
CLOCK_SKEW_SECONDS = 60
# _seq of context events is shifted below the window's own: k windows back, k * this much lower
# (window_rows.read_window).
SEQ_SHIFT = 1 << 40


class Reach(enum.Enum):
    """Which of an earlier window's events of the table count (module docstring)."""

    SECONDS = "seconds"  # committed at or after ``since``
    # ... or within CONTEXT_SECONDS of the newest event of their own shard in the window
    SHARD_NEWEST = "shard_newest"
    WHOLE = "whole"  # every binlog event (a copied row, commit second 0, as by SECONDS)


@dataclass(frozen=True)
class ContextWindow:
    """An earlier window whose events of ``table`` count as ``reach`` says: at or after ``since``
    (a commit second), and with :attr:`Reach.SHARD_NEWEST` or :attr:`Reach.WHOLE` more."""

    manifest: Manifest
    back: int  # 1 for the window just before
    since: int
    reach: Reach = Reach.SECONDS


def created_epoch(manifest: Manifest) -> float | None:
    """When the manifest was written (seconds since the epoch), if it says."""
    try:
        created = datetime.datetime.fromisoformat(manifest.created_at)
    except ValueError:
        return None
    if created.tzinfo is None:
        created = created.replace(tzinfo=datetime.timezone.utc)
    return created.timestamp()


def read_by_epoch(manifest: Manifest) -> float | None:
    """When, at the latest, every event of the window (and of the windows before it) committed:
    the newest source time its read saw; for an older manifest, when it was written."""
    source = manifest.source_ts_max
    return float(source) if source is not None else created_epoch(manifest)


def commit_ts_range(manifest: Manifest, table: str) -> tuple[int, int] | None:
    """The smallest and largest ``_commit_ts`` of the table's staged rows, from the Parquet
    footers; None when the table has no rows here or a footer has no statistics."""
    tm = manifest.tables.get(table)
    if tm is None or not tm.parts:
        return None
    fs, root = manifest.window_path()
    low: int | None = None
    high: int | None = None
    for part in tm.parts:
        with fs.open(f"{root}/{part.path}", "rb") as f:
            meta = pq.ParquetFile(f).metadata
        if meta.num_rows == 0:
            continue
        index = meta.schema.names.index(A.COMMIT_TS)
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(index).statistics
            if stats is None or not stats.has_min_max:
                return None
            low = int(stats.min) if low is None else min(low, int(stats.min))
            high = int(stats.max) if high is None else max(high, int(stats.max))
    return None if low is None or high is None else (low, high)


def copy_ends(manifest: Manifest) -> dict[str, int]:
    """A snapshot copied by shard groups: per shard, when its group's copy ended (its part was
    staged: the group manifest's ``created_at``, seconds since the epoch, the worker's clock);
    empty for any other window. Each group's streams ran until its own copy was over, so a row
    moved out of a group's shard after that has its DELETE in the next window while its copy
    (commit second 0) is in this one: as look-back context, a copied row counts as committed at
    its group's end (give or take :data:`CLOCK_SKEW_SECONDS`: the worker's clock)."""
    if manifest.stop_vgtid is not None:
        return {}
    out: dict[str, int] = {}
    for read in manifest.stats.get(GROUP_READS) or ():
        ended = read.get("ended_at")
        for s in read.get("shards") or ():
            if ended is not None:
                out[str(s)] = int(ended)
    return out


def reached_stop(manifest: Manifest) -> bool:
    """Whether a catch-up window read every shard to its stop (an instant on every shard), not
    ended early by a bound; False for a snapshot (its streams end with the last copy) and for a
    position that cannot be compared."""
    stop = manifest.stop_vgtid
    if stop is None:
        return False
    for sg in manifest.end_vgtid.shard_gtids:
        target = stop.shard(sg.keyspace, sg.shard)
        if target is None:
            continue  # a shard a reshard retired: read to its journal, which ends it
        try:
            if not Vgtid((sg,)).has_reached(Vgtid((target,))):
                return False
        except InvalidVgtidError:
            return False
    return True


def context_windows(
    manifest: Manifest,
    table: str,
    first_commit_ts: int,
    load: Callable[[int], Manifest | None],
    ts_range: Callable[[Manifest, str], tuple[int, int] | None] = commit_ts_range,
) -> list[ContextWindow]:
    """The earlier windows (nearest first) whose events of ``table`` can decide the window's keys
    (module docstring): back to and including the nearest one that read every shard to its stop
    (:func:`reached_stop`), those that ended early whole, that one by its shards' newest events;
    before it, those with events committed at or after ``first_commit_ts - CONTEXT_SECONDS``.
    ``first_commit_ts`` is the window's first commit second for the table. ``load(seq)`` gives a
    window's manifest (None: not there any more)."""
    since = first_commit_ts - CONTEXT_SECONDS
    out: list[ContextWindow] = []
    # Until a window that reached its stop: positions bound the look-back, not seconds.
    by_position = True
    # The windows that count are the chain of merged windows: each catch-up starts where the
    # one merged before it ended. A discarded (FAILED) window is not in it: its changes were
    # read again by a later window. Its files are deleted (lost or corrupt ones) or left
    # (discarded by a re-snapshot): either way it is skipped, and the look-back goes on.
    expected = manifest.start_vgtid
    for back in range(1, MAX_WINDOWS_BACK + 1):
        seq = manifest.window_seq - back
        if seq < 1:  # windows are numbered from 1
            break
        earlier = load(seq)
        if earlier is None:
            # Discarded, or a snapshot deleted once the window after it committed (retention).
            log.info("table %s: window %d has no staged files; looking further back", table, seq)
            continue
        read_by = read_by_epoch(earlier)
        if not by_position and read_by is not None and read_by < since - CLOCK_SKEW_SECONDS:
            break  # written before the cut-off: it and every earlier window end before it
        if earlier.stop_vgtid is not None and earlier.end_vgtid != expected:
            log.info("table %s: window %d is not one the merges built on (discarded): skipped", table, seq)
            continue
        if earlier.end_vgtid == expected:
            expected = earlier.start_vgtid
        reach = Reach.SECONDS
        if by_position:
            reached = reached_stop(earlier)
            reach = Reach.SHARD_NEWEST if reached else Reach.WHOLE
            by_position = not reached
        if table not in earlier.tables or not earlier.tables[table].parts:
            pass
        elif reach is not Reach.SECONDS:
            out.append(ContextWindow(earlier, back, since, reach))
        else:
            found = ts_range(earlier, table)
            # A grouped snapshot's copies count as of their group's end (copy_ends; its clock).
            copied = max(copy_ends(earlier).values(), default=-CLOCK_SKEW_SECONDS) + CLOCK_SKEW_SECONDS
            if found is None or max(found[1], copied) >= since:  # unknown range: read it, the filter decides
                out.append(ContextWindow(earlier, back, since))
        if earlier.stop_vgtid is None:
            # A snapshot copied the table afresh: events before it were never read in full, and
            # the copy decides every key it has, so no earlier window counts.
            break
    return out
