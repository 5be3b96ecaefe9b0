"""When a snapshot's copy is over, counted by the reader per shard and per call, not by vtgate.

vtgate (v0.23, ``vstream_manager.isCopyFullyCompleted``) sends its stream-wide COPY_COMPLETED
only once *every* shard of the call sent its own COPY_COMPLETED in that same call. A call that
the reader reopens after a cut (from the last VGTID) copies nothing on a shard whose entry has a
position and no table last-PKs (vttablet's ``uvstreamer.init``): that shard finished before the
cut, now only streams, never sends COPY_COMPLETED again, so the stream-wide event never comes,
while heartbeats keep the call alive and the read waited forever. So:

* Each (re)opened call copies on the shards whose entry has no position yet, or has table
  last-PKs, or on every shard when the request names ``tables_to_copy`` (vttablet's rule). The
  copy is over when each of those shards sent its COPY_COMPLETED in the current call.
* A shard that would not copy although its copy is not known to be over would skip what it has
  not copied yet: vttablet names the copy's position in a VGTID before the table's first rows
  and last key (``sendFieldEvent``), and vtgate drops a finished table's last key before the
  next table starts. The reopened call asks that shard, and only it, for its copy again from
  the start (its position emptied); rows it had staged are staged again, which is harmless
  (the merge keeps each key's last event).

Which tables a *killed* snapshot's rerun may leave out of ``tables_to_copy`` is another question,
answered from the checkpointed positions alone (``CopiedTables``): the rerun starts from one of
them, so what it may skip must be copied up to that position, on every shard. vttablet copies
its tables one at a time, in sorted order (``uvstreamer.buildTablePlan``, ``copy``), each shard
on its own: a shard whose entry names table X in copy is past every table sorted before X, and a
table it named and names no more is over there. A shard that has sent no position yet, or one
that names no table, has copied nothing this tells of, however far the other shards are.

After a re-snapshot of some tables, the catch-ups that read the stretch before their copy again
skip those tables' changes the copy holds (``CopyPositions``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2
from airflow_provider_vitess.vgtid import Vgtid, position_contains
from airflow_provider_vitess.vstream.ordering import ShardKey

log = logging.getLogger(__name__)


def _key(sg: binlogdata_pb2.ShardGtid) -> ShardKey:
    return (sg.keyspace, sg.shard)


def _copies(sg: binlogdata_pb2.ShardGtid, flags: vtgate_pb2.VStreamFlags) -> bool:
    """Does vttablet run a copy phase for this shard entry of a request?"""
    return not sg.gtid or bool(sg.table_p_ks) or bool(flags.tables_to_copy)


class CopyState:
    """A snapshot read's copy, per shard: what each call copies and what was seen to finish.

    ``opening(request)`` before every call (it may restart a shard's copy), ``position(vgtid)``
    for each VGTID event, ``shard_copied(key)`` for each shard's COPY_COMPLETED; ``complete``
    says the copy is over.
    """

    def __init__(self, tables: Sequence[str]) -> None:
        self._tables = tuple(tables)
        self._copying: set[ShardKey] | None = None  # None: no call opened yet
        self._started: dict[ShardKey, set[str]] = {}  # tables seen with a last-PK, per shard
        self._finished: dict[ShardKey, set[str]] = {}  # ... and later seen without one
        self._shard_done: set[ShardKey] = set()  # sent COPY_COMPLETED (all its tables copied)

    @property
    def complete(self) -> bool:
        return self._copying is not None and not self._copying

    @property
    def copying(self) -> set[ShardKey]:
        """Shards whose copy in the current call has not finished yet."""
        return set(self._copying or ())

    def _copied_all(self, key: ShardKey) -> bool:
        return key in self._shard_done or set(self._tables) <= self._finished.get(key, set())

    def in_copy(self, key: ShardKey) -> str | None:
        """The table the shard copies now: the one its position names with a last key, else the
        first of the others it has not finished, in vttablet's (sorted) order; None if unknown."""
        if key in self._shard_done:
            return None
        finished = self._finished.get(key, set())
        named = self._started.get(key, set()) - finished
        left = sorted(named or set(self._tables) - finished)
        return left[0] if left else None

    def opening(self, request: vtgate_pb2.VStreamRequest) -> None:
        """A call is about to be opened with ``request``: a shard whose copy is not known to be
        over and that would not copy is asked for its copy again; notes which shards copy."""
        flags, entries = request.flags, request.vgtid.shard_gtids
        for sg in entries:
            if not _copies(sg, flags) and not self._copied_all(_key(sg)):
                log.warning(
                    "the snapshot's stream reopens at %s/%s's position %s, which names no table "
                    "in copy although its copy is not over: that shard copies again from the start",
                    sg.keyspace,
                    sg.shard,
                    sg.gtid,
                )
                sg.gtid = ""
        self._copying = {_key(sg) for sg in entries if _copies(sg, flags)}

    def position(self, vgtid: binlogdata_pb2.VGtid) -> None:
        """A VGTID event: a table that had a last-PK on a shard and has none now is copied there."""
        for sg in vgtid.shard_gtids:
            key = _key(sg)
            in_progress = {pk.table_name for pk in sg.table_p_ks}
            started = self._started.setdefault(key, set())
            self._finished.setdefault(key, set()).update(started - in_progress)
            started |= in_progress

    def shard_copied(self, key: ShardKey) -> None:
        self._shard_done.add(key)
        if self._copying is not None:
            self._copying.discard(key)

    def retired(self, keys: Iterable[ShardKey]) -> None:
        """Shards a reshard's journal ended: they send nothing more."""
        if self._copying is not None:
            self._copying.difference_update(keys)


class CopiedTables:
    """The tables a snapshot's checkpointed positions show copied on every shard: a rerun from
    the newest of them passes the others as ``tables_to_copy``.

    :param copying: the tables this run copies (its ``tables_to_copy``, else all of them).
    :param copied: tables an earlier run of the snapshot found copied everywhere already.
    """

    def __init__(self, copying: Iterable[str], copied: Iterable[str] = ()) -> None:
        self._copying = frozenset(copying)
        self._copied = frozenset(copied)
        self._named: dict[ShardKey, set[str]] = {}  # tables each shard's entries named in copy

    def at(self, position: Vgtid) -> frozenset[str]:
        """A checkpoint at ``position``: the tables copied on each of its shards up to it."""
        over: frozenset[str] | None = None
        for sg in position.shard_gtids:
            in_copy = {pk.table_name for pk in sg.table_last_pks}
            named = self._named.setdefault((sg.keyspace, sg.shard), set())
            named |= in_copy
            # Sorted like vttablet sorts them (Go compares UTF-8 bytes: the same order as str's).
            furthest = max(named, default=None)
            here = named - in_copy
            if furthest is not None:
                here |= {t for t in self._copying if t < furthest}
            over = frozenset(here) if over is None else over & here
        return self._copied | (over or frozenset())


class CopyPositions:
    """Where tables re-snapshotted while the others kept the sync's position were copied: their
    changes up to there are in their copy already, and may not even be stageable (rows logged
    before an incompatible DDL), so a catch-up skips them, for those tables only."""

    def __init__(self, positions: Mapping[str, Vgtid]) -> None:
        self._positions = dict(positions)

    def holding(self, keyspace: str, shard: str, position: binlogdata_pb2.ShardGtid | None) -> frozenset[str]:
        """The tables whose copy holds a unit that left ``shard`` at ``position``."""
        if not self._positions or position is None:
            return frozenset()
        return frozenset(
            table
            for table, copied in self._positions.items()
            if (at := copied.shard(keyspace, shard)) is not None
            and at.gtid
            and position_contains(at.gtid, position.gtid)
        )
