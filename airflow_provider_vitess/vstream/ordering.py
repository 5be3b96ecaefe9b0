"""Deterministic cross-shard order: per-shard transactions, k-way merged by commit time.

vtgate interleaves shards in arrival order, which differs from run to run. A window must stage
the same rows in the same order every time it is re-read from the same start (retries are then
deterministic), so we impose our own order: ``(commit timestamp, shard, position in shard)``.

Two pieces, both pure:

* :class:`TransactionAssembler` groups one stream's events into :class:`ShardTransaction` units:
  ``BEGIN … COMMIT`` of one shard (large transactions span several responses and may interleave
  with other shards' events), or a lone position/marker event. Each unit carries its shard's
  VGTID entry, i.e. the shard's position *after* the unit.
* :class:`ShardMerger` buffers units per shard and releases them in merged order as soon as no
  other shard can still produce an earlier unit: that shard's watermark (the order time of its
  latest unit) has passed, or it reached its stop. A vtgate heartbeat never releases a unit: it
  is vtgate's wall clock, and a shard's next unit can carry an older second (a transaction's
  binlog events carry its statements' start, and a re-read gets heartbeats at other moments);
  released on one, that unit would sort differently when read again. Every shard a window still
  waits for has units before its stop, so the wait always ends. Memory is bounded in bytes
  (rows as a second guard, :class:`~.spill.MemoryLimits`): past ``max_buffered_bytes`` buffered
  units (and, in the assembler, a transaction past ``transaction_bytes`` as it arrives) move to
  spill files (:mod:`.spill`), so the order never depends on memory. ``close()`` on both frees
  what they still hold (an early stop, an error), spill files included.

Checkpoint positions come from released units only (:meth:`ShardMerger.released_positions`):
vtgate's own VGTID also covers shards whose units are still buffered here, so checkpointing it
could skip them after a crash.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import (
    BeginEvent,
    CommitEvent,
    CopyCompletedEvent,
    DdlEvent,
    HeartbeatEvent,
    JournalEvent,
    RawRows,
    RowEvent,
    VgtidEvent,
    VStreamEvent,
)
from airflow_provider_vitess.vstream.spill import MemoryLimits, SpillableEvents

ShardKey = tuple[str, str]  # (keyspace, shard)

_EVENT_BYTES = 300  # an event's Python objects (dataclass, strings, RawRows), roughly
_DECODED_ROW_BYTES = 200  # a decoded row's tuples and values, roughly (tests' events only)


def event_bytes(event: VStreamEvent) -> int:
    """What a buffered event holds in memory: its rows' serialized bytes (what the reader
    keeps, :class:`~..decoding.events.RawRows`) plus its objects. Cheap: no per-row work."""
    if isinstance(event, RowEvent):
        changes = event.changes
        if isinstance(changes, RawRows):
            return _EVENT_BYTES + len(changes.data)
        return _EVENT_BYTES + _DECODED_ROW_BYTES * len(changes)
    if isinstance(event, DdlEvent):
        return _EVENT_BYTES + len(event.statement)
    return _EVENT_BYTES


@dataclass(slots=True)
class ShardTransaction:
    """One shard's unit of change, in that shard's binlog order."""

    keyspace: str
    shard: str
    commit_ts: int  # seconds, as the source stamped it (0 when the stream gives none)
    order_ts: int  # commit_ts made non-decreasing per shard: what the merge orders by
    shard_pos: int  # ordinal of this unit within its shard since the merger started
    # FIELD/ROW/DDL/... in shard order (no BEGIN/COMMIT/VGTID); may live on disk (see spill)
    events: SpillableEvents = field(default_factory=SpillableEvents)
    position: binlogdata_pb2.ShardGtid | None = None  # the shard's position after this unit
    rows: int = 0
    journal: binlogdata_pb2.Journal | None = None  # a reshard/MoveTables journal in this unit

    @property
    def key(self) -> ShardKey:
        return (self.keyspace, self.shard)

    @property
    def sort_key(self) -> tuple[int, str, str, int]:
        return (self.order_ts, self.keyspace, self.shard, self.shard_pos)


@dataclass(slots=True)
class _Open:
    events: SpillableEvents = field(default_factory=SpillableEvents)
    commit_ts: int = 0
    rows: int = 0
    in_transaction: bool = False
    position: binlogdata_pb2.ShardGtid | None = None
    journal: binlogdata_pb2.Journal | None = None


class TransactionAssembler:
    """Turns a stream of events into completed per-shard units: ``push`` returns the units the
    event completed."""

    def __init__(self, limits: MemoryLimits | None = None) -> None:
        limits = limits or MemoryLimits()
        self._open: dict[ShardKey, _Open] = {}
        # A transaction larger than these goes to disk as it arrives.
        self._spill_bytes, self._spill_rows = limits.transaction_bytes, limits.transaction_rows
        self._spill_dir = limits.spill_dir
        self.discarded_rows = 0  # rows of partial transactions dropped at a re-sent BEGIN
        self.spilled_transactions = 0  # transactions that went to disk as they arrived

    def _new(self, commit_ts: int = 0) -> _Open:
        return _Open(events=SpillableEvents(self._spill_dir), commit_ts=commit_ts)

    def close(self) -> None:
        """Frees the transactions still open (their spill files too): the read is over."""
        for unit in self._open.values():
            unit.events.close()
        self._open.clear()

    def open_shards(self) -> set[ShardKey]:
        """Shards with a transaction begun and not yet committed."""
        return {k for k, o in self._open.items() if o.in_transaction}

    def push(self, event: VStreamEvent) -> list[ShardTransaction]:
        if isinstance(event, HeartbeatEvent):
            return []  # vtgate's, of no shard: it completes no unit
        key = (event.keyspace, event.shard)
        unit = self._open.get(key)
        if unit is None:
            unit = self._open[key] = self._new()
        if event.timestamp:
            unit.commit_ts = max(unit.commit_ts, event.timestamp)
        if isinstance(event, BeginEvent):
            if unit.in_transaction:
                # vtgate never nests transactions: a BEGIN inside one is the reader's resumed
                # stream sending the cut transaction again from its start (it resumes from the
                # last VGTID, which precedes that BEGIN). Its rows so far would be staged twice.
                self.discarded_rows += unit.rows
                unit.events.close()
                unit = self._open[key] = self._new(event.timestamp)
            unit.in_transaction = True
            return []
        if isinstance(event, VgtidEvent):
            for sg in event.vgtid.shard_gtids:
                if (sg.keyspace, sg.shard) == key:
                    unit.position = sg
            # Outside a transaction a VGTID closes a unit of its own (copy batches, DDL, skips).
            return [] if unit.in_transaction else self._close(key)
        if isinstance(event, CommitEvent):
            return self._close(key)
        rows = len(event.changes) if isinstance(event, RowEvent) else 0
        events = unit.events
        events.append(event, rows, event_bytes(event))
        unit.rows += rows
        if events.memory_bytes > self._spill_bytes or events.memory_rows > self._spill_rows:
            self.spilled_transactions += not events.spilled
            events.spill()
        if isinstance(event, JournalEvent):
            unit.journal = event.journal
        if isinstance(event, CopyCompletedEvent | JournalEvent) and not unit.in_transaction:
            return self._close(key)  # markers: keep them in their shard's order, release promptly
        return []

    def _close(self, key: ShardKey) -> list[ShardTransaction]:
        unit = self._open.pop(key)
        return [
            ShardTransaction(
                keyspace=key[0],
                shard=key[1],
                commit_ts=unit.commit_ts,
                order_ts=unit.commit_ts,  # made monotone by the merger
                shard_pos=0,
                events=unit.events,
                position=unit.position,
                rows=unit.rows,
                journal=unit.journal,
            )
        ]


@dataclass
class MergeStats:
    max_skew_seconds: int = 0  # largest gap between the most and least advanced active shard
    spilled_units: int = 0  # units moved to disk to keep the buffer under its bound
    late_units: int = 0  # units that arrived after a later one had been released
    units_released: int = 0
    rows_released: int = 0


class ShardMerger:
    """K-way merge of per-shard units by ``(order_ts, keyspace, shard, shard_pos)``.

    :param shards: the shards that must be waited for (``mark_done`` releases one of them).
    :param max_buffered_bytes: bytes held in memory (see :func:`event_bytes`); past it, or past
        ``max_buffered_rows``, buffered units move to disk (the order is never given up for memory).
    :param ordered: False passes units through in arrival order (a snapshot's copy: copied keys
        are disjoint across shards, and each shard's own order is kept anyway).
    """

    def __init__(
        self,
        shards: Iterable[ShardKey],
        *,
        max_buffered_bytes: int = MemoryLimits.max_buffered_bytes,
        max_buffered_rows: int = MemoryLimits.max_buffered_rows,
        ordered: bool = True,
    ) -> None:
        self._ordered = ordered  # False: units pass straight through, in arrival order
        self._queues: dict[ShardKey, deque[ShardTransaction]] = {k: deque() for k in shards}
        self._watermark: dict[ShardKey, int] = {}
        self._next_pos: dict[ShardKey, int] = {}
        self._done: set[ShardKey] = set()
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._max_buffered_rows = max_buffered_rows
        self._max_buffered_bytes = max_buffered_bytes
        self._last_released: tuple[int, str, str, int] | None = None
        self._released_positions: dict[ShardKey, binlogdata_pb2.ShardGtid] = {}
        self.stats = MergeStats()

    @property
    def buffered_rows(self) -> int:
        return self._buffered_rows

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    def close(self) -> None:
        """Frees the units still buffered (their spill files too): the read is over, and what
        was not released is read again by the next window."""
        for queue in self._queues.values():
            for unit in queue:
                unit.events.close()
            queue.clear()
        self._buffered_rows = self._buffered_bytes = 0

    @property
    def idle(self) -> bool:
        """Nothing released with a position yet and nothing held: the read has not moved."""
        return not self._released_positions and not any(self._queues.values())

    def released_positions(self) -> dict[ShardKey, binlogdata_pb2.ShardGtid]:
        """Per shard, the position after its last released unit: a safe resume point."""
        return dict(self._released_positions)

    def push(self, unit: ShardTransaction) -> Iterator[ShardTransaction]:
        key = unit.key
        queue = self._queues.setdefault(key, deque())
        unit.order_ts = max(unit.commit_ts, self._watermark.get(key, 0))
        unit.shard_pos = self._next_pos.get(key, 0)
        self._next_pos[key] = unit.shard_pos + 1
        self._watermark[key] = unit.order_ts
        if self._last_released is not None and unit.sort_key < self._last_released:
            self.stats.late_units += 1
        queue.append(unit)
        self._buffered_rows += unit.events.memory_rows
        self._buffered_bytes += unit.events.memory_bytes
        self._note_skew()
        if not self._ordered:
            yield self._pop(unit)
            return
        yield from self._release()

    def join(self, key: ShardKey, watermark: int) -> None:
        """A shard that starts mid-merge (a reshard's new shard), known to send nothing earlier
        than ``watermark``: from now on the merge waits for it."""
        self._queues.setdefault(key, deque())
        self._watermark[key] = max(self._watermark.get(key, 0), watermark)

    def mark_done(self, key: ShardKey) -> Iterator[ShardTransaction]:
        """The shard reached its stop: it no longer holds the others back."""
        self._done.add(key)
        yield from self._release()

    def drain(self) -> Iterator[ShardTransaction]:
        """Everything still buffered, in merged order (end of window)."""
        while True:
            head = self._earliest()
            if head is None:
                return
            yield self._pop(head)

    def _earliest(self) -> ShardTransaction | None:
        heads = [q[0] for q in self._queues.values() if q]
        return min(heads, key=lambda u: u.sort_key) if heads else None

    def _safe(self, unit: ShardTransaction) -> bool:
        for key, queue in self._queues.items():
            if key == unit.key or key in self._done or queue:
                continue  # a non-empty queue's head is already compared by _earliest
            mark = self._watermark.get(key)
            if mark is None or (mark, key) <= (unit.order_ts, unit.key):
                return False  # that shard may still send a unit that sorts first
        return True

    def _release(self) -> Iterator[ShardTransaction]:
        while True:
            head = self._earliest()
            if head is None or not self._safe(head):
                break
            yield self._pop(head)
        self._spill_over_bound()

    def _over_bound(self) -> bool:
        return (
            self._buffered_bytes > self._max_buffered_bytes or self._buffered_rows > self._max_buffered_rows
        )

    def _spill_over_bound(self) -> None:
        if not self._over_bound():
            return
        # Largest in-memory units first: fewest files for the most memory.
        queued = sorted(
            (u for q in self._queues.values() for u in q),
            key=lambda u: (-u.events.memory_bytes, -u.events.memory_rows),
        )
        for unit in queued:
            if not self._over_bound():
                break
            events = unit.events
            rows, nbytes = events.memory_rows, events.memory_bytes
            if rows or nbytes:
                events.spill()
                self._buffered_rows -= rows
                self._buffered_bytes -= nbytes
                self.stats.spilled_units += 1

    def _pop(self, unit: ShardTransaction) -> ShardTransaction:
        self._queues[unit.key].popleft()
        self._buffered_rows -= unit.events.memory_rows
        self._buffered_bytes -= unit.events.memory_bytes
        self._last_released = unit.sort_key
        if unit.position is not None:
            self._released_positions[unit.key] = unit.position
        self.stats.units_released += 1
        self.stats.rows_released += unit.rows
        return unit

    def _note_skew(self) -> None:
        active = [ts for key, ts in self._watermark.items() if key not in self._done]
        if len(active) > 1:
            self.stats.max_skew_seconds = max(self.stats.max_skew_seconds, max(active) - min(active))
