"""A bounded read of VStream: from a start VGTID to a stop position, into a stager.

* **catch-up window**: from the committed VGTID until every shard has reached the stop captured
  when the window was planned (or earlier, at a unit boundary: ``max_events``/``max_seconds``).
  Units are merged across shards in a deterministic order (:mod:`.ordering`): a re-read stages
  the same rows with the same sequence numbers.
* **snapshot**: the copy phase from an empty position until every shard's copy is complete
  (counted here, across reconnects: :mod:`.copy_state`), checkpointed regularly with the VGTID
  and its table last-PKs so a killed snapshot resumes.

Only positions of units already handed to the stager are ever reported. A reshard's JOURNAL ends
its old shards; the new shards' units wait until it is staged, then join the position at the
journal's positions (docs/design.md, "Resharding").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2
from airflow_provider_vitess.decoding.events import (
    CopyCompletedEvent,
    DdlEvent,
    FieldEvent,
    HeartbeatEvent,
    JournalEvent,
    RowChange,
    RowEvent,
    VgtidEvent,
    VStreamEvent,
)
from airflow_provider_vitess.exceptions import VStreamError
from airflow_provider_vitess.vgtid import CURRENT, Vgtid, position_contains
from airflow_provider_vitess.vstream import copy_stall
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS
from airflow_provider_vitess.vstream.copy_state import CopyPositions, CopyState
from airflow_provider_vitess.vstream.ordering import (
    ShardKey,
    ShardMerger,
    ShardTransaction,
    TransactionAssembler,
    event_bytes,
)
from airflow_provider_vitess.vstream.position import capture_stop_position
from airflow_provider_vitess.vstream.reader import OpenStream, VStreamReader
from airflow_provider_vitess.vstream.request import table_filter
from airflow_provider_vitess.vstream.spill import MemoryLimits

# The probe and the filter are imported from here by older callers.
__all__ = ["ReadBounds", "ReadResult", "Stager", "WindowReader", "capture_stop_position", "table_filter"]

log = logging.getLogger(__name__)

# ReadResult.stats: the newest source time (seconds) the read saw (``Manifest.source_ts_max``).
SOURCE_TS_MAX = "source_ts_max"


class Stager(Protocol):
    """What a read hands its changes to (``airflow_provider_vitess.staging.WindowStager``)."""

    def set_schema(self, keyspace: str, table: str, fields: Sequence[Any], shard: str = "") -> None: ...

    def add_rows(
        self,
        keyspace: str,
        table: str,
        shard: str,
        commit_ts: int,
        first_seq: int,
        changes: Sequence[RowChange],
    ) -> None:
        """The changes of one ROW event, seqs ``first_seq``, +1... (``changes`` is usually
        :class:`~..decoding.events.RawRows`, still serialized)."""
        ...

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None: ...


@dataclass(frozen=True)
class ReadBounds:
    """Where a catch-up window may stop early (always at a unit boundary)."""

    max_events: int | None = None  # row changes staged
    max_seconds: float | None = None


@dataclass
class ReadResult:
    end_vgtid: Vgtid
    rows: int = 0
    units: int = 0
    ddls: list[str] = field(default_factory=list)
    rows_per_table: dict[str, int] = field(default_factory=dict)
    stopped_early: str | None = None  # why a catch-up window ended before its stop position
    journals: int = 0  # reshard JOURNAL events staged
    retired_shards: list[str] = field(default_factory=list)  # "keyspace/shard" left by a journal
    rows_behind_copy: int = 0  # changes of re-snapshotted tables their copy holds: skipped
    stats: dict[str, Any] = field(default_factory=dict)


class WindowReader:
    """Reads one window (or snapshot) and hands its units, in order, to a stager."""

    def __init__(
        self,
        open_stream: OpenStream,
        stager: Stager,
        *,
        keyspace: str,
        tables: Sequence[str],
        start: Vgtid,
        stop: Vgtid | None,
        bounds: ReadBounds = ReadBounds(),
        flags: vtgate_pb2.VStreamFlags | None = None,
        tablet_type: str = "PRIMARY",
        memory: MemoryLimits | None = None,
        checkpoint_every_rows: int = 0,
        checkpoint_every_bytes: int = 0,
        on_checkpoint: Callable[[Vgtid], None] | None = None,
        on_rows: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reset_connection: Callable[[], None] | None = None,
        copy_stall_seconds: float = COPY_STALL_SECONDS,
        copied_at: Mapping[str, Vgtid] | None = None,
        columns: Mapping[str, Sequence[str] | None] | None = None,
    ) -> None:
        self._snapshot = stop is None
        # Re-snapshotted tables' units their copy holds are skipped, for those tables only.
        self._copied_at = CopyPositions(copied_at or {})
        self._held_fields: dict[tuple[str, str, str], FieldEvent] = {}
        # The newest source time the read saw (commits and heartbeats, the tablets' clocks): a
        # merge's look-back bounds earlier windows by it, never by a worker's clock.
        self._source_ts_max = 0
        self._keyspace, self._tables = keyspace, tuple(tables)
        self._start, self._stop, self._bounds = start, stop, bounds
        self._stager = stager
        # A snapshot checkpoints by rows or by bytes, whichever comes first: with wide rows a
        # row count alone would let a kill recopy (and a part file grow to) gigabytes.
        self._checkpoint_every = checkpoint_every_rows
        self._checkpoint_every_bytes = checkpoint_every_bytes
        self._on_checkpoint, self._on_rows, self._clock = on_checkpoint, on_rows, clock
        # A snapshot's copy is over when each copying shard says so, counted across reconnects
        # (vtgate's stream-wide COPY_COMPLETED never comes after a reconnect: see copy_state).
        self._copy = CopyState(self._tables) if self._snapshot else None
        self._copy_stall_seconds = copy_stall_seconds
        self._copy_moved = clock()
        self._reader = VStreamReader(
            open_stream,
            vgtid=start,
            # Column control: per table, the only columns vttablet sends (capture/columns.py).
            filter=table_filter(tables, columns),
            flags=flags,
            tablet_type=tablet_type,
            # Without journals vtgate switches to the new shards silently, and the checkpoint
            # would keep the old shards forever (see the module docstring).
            reshard_journals=True,
            reset_connection=reset_connection,
            on_open=self._copy.opening if self._copy is not None else None,
        )
        # The shards the window reads now, each with the position it resumes from when it has
        # staged nothing yet; a staged journal replaces its participants by the new shards.
        self._shards: dict[ShardKey, binlogdata_pb2.ShardGtid] = {
            (sg.keyspace, sg.shard): sg for sg in start.to_proto().shard_gtids
        }
        # New shards of a journal not yet staged: their units wait here, in arrival order.
        self._held: dict[ShardKey, list[ShardTransaction]] = {}
        self._unheld: list[ShardTransaction] = []
        # A snapshot needs no cross-shard order (copied keys are disjoint), so units pass straight
        # through and each shard's resume position keeps moving; a catch-up window merges. The
        # merge waits for the start's shards only: new shards join when their journal is staged.
        memory = memory or MemoryLimits()
        self._merger = ShardMerger(
            list(self._shards),
            max_buffered_bytes=memory.max_buffered_bytes,
            max_buffered_rows=memory.max_buffered_rows,
            ordered=not self._snapshot,
        )
        self._assembler = TransactionAssembler(memory)
        self._done: set[ShardKey] = set()
        self._result = ReadResult(end_vgtid=start)
        self._seq = 0
        self._rows_since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        self._early_stop: str | None = None
        # Shards whose transaction was in flight when max_seconds ran out (None: not yet).
        self._finishing: set[ShardKey] | None = None
        self._read_past_bound = False

    @property
    def merge_stats(self) -> dict[str, int]:
        return vars(self._merger.stats).copy()

    def position(self) -> Vgtid:
        """Every shard read now, advanced to its last staged unit: a safe resume point.

        The start must name every shard (a snapshot starts from ``""`` per shard), so a shard
        that has staged nothing yet resumes from where it started; a new shard of a staged
        journal resumes from the position the journal gives it, and the journal's old shards
        are left out (vtgate would otherwise stream them again).
        """
        released = self._merger.released_positions()
        entries = [released.get(key, base) for key, base in self._shards.items()]
        return Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=entries))

    def run(self) -> ReadResult:
        """Reads to the stop (or the copy's end, or a bound). A long read wants the caller to
        keep the collector off the objects alive before it: ``utils.heap.frozen_heap``."""
        started = self._copy_moved = self._clock()
        if self._stop is not None:
            for sg in self._start.shard_gtids:
                # A start shard the stop does not name was resharded away: read to its journal.
                stop = self._stop.shard(sg.keyspace, sg.shard)
                if (
                    stop is not None
                    and sg.gtid not in ("", CURRENT)
                    and position_contains(sg.gtid, stop.gtid)
                ):
                    self._finish_shard((sg.keyspace, sg.shard))
        if self._stop is not None and self._all_done():
            return self._close(None)
        events = self._reader.events()
        try:
            for event in events:
                self._source_ts_max = max(self._source_ts_max, event.timestamp)
                for item in self._assembler.push(event):
                    if self._accept(item):
                        return self._close(None)
                    if self._early_stop is not None:
                        return self._close(self._early_stop)
                if self._copy is not None and self._copy_over(event):
                    return self._close(None)
                reason = self._bound_reached(started)
                if reason:
                    return self._close(reason)
        finally:
            events.close()
            self._release_buffers()
        raise VStreamError(
            f"keyspace {self._keyspace!r}: the VStream ended before the window's stop position"
        )

    # ----- internals -----------------------------------------------------------------------

    def _copy_over(self, event: VStreamEvent) -> bool:
        """A snapshot: is every shard's copy over (this event staged already)? Fails a copy
        that stopped moving while heartbeats keep its stream alive: never a silent wait."""
        assert self._copy is not None
        now = self._clock()
        if isinstance(event, HeartbeatEvent):
            if event.throttled:  # vttablet holds the copy back on purpose: waiting, not stuck
                self._copy_moved = now
        elif (event.keyspace, event.shard) in self._copy.copying:
            self._copy_moved = now
        if not self._copy.complete and now - self._copy_moved > self._copy_stall_seconds:
            # Stuck, not slow: no copy query Vitess lets run is cut by the default (copy_stall).
            in_copy = {shard: self._copy.in_copy((ks, shard)) for ks, shard in self._copy.copying}
            raise copy_stall.stalled(
                self._keyspace, in_copy, now - self._copy_moved, self._copy_stall_seconds
            )
        if isinstance(event, VgtidEvent):
            self._copy.position(event.vgtid)
        elif isinstance(event, CopyCompletedEvent):
            if event.is_stream_complete:
                return True
            self._copy.shard_copied((event.keyspace, event.shard))
        return self._copy.complete

    def _accept(self, unit: ShardTransaction) -> bool:
        """Hands a completed unit to the merge; True when the window has reached its stop."""
        if unit.key in self._done:
            return False  # past this shard's stop: the next window reads it
        if unit.key in self._held:
            self._held[unit.key].append(unit)  # its journal is not staged yet
            return False
        journal = unit.journal if _is_reshard(unit.journal) else None
        if journal is not None:
            # The old shard's last unit: vtgate ends its stream here. Its new shards may send
            # units as soon as every participant has sent the journal; they wait for it.
            for sg in journal.shard_gtids:
                self._held.setdefault((sg.keyspace, sg.shard), [])
            self._stage(self._merger.push(unit))
            self._finish_shard(unit.key)
        else:
            self._stage(self._merger.push(unit))
            if self._stop is not None and unit.position is not None:
                stop = self._stop.shard(unit.keyspace, unit.shard)
                # A shard the stop does not name is an old shard of a reshard: read to its journal.
                if stop is not None and position_contains(unit.position.gtid, stop.gtid):
                    self._finish_shard(unit.key)
        self._push_unheld()
        return self._stop is not None and self._all_done()

    def _pass_journal(self, unit: ShardTransaction, journal: binlogdata_pb2.Journal) -> None:
        """A staged journal: its old shards leave the position, its new shards join it."""
        self._result.journals += 1
        for p in journal.participants:
            if self._shards.pop((p.keyspace, p.shard), None) is not None:
                self._result.retired_shards.append(f"{p.keyspace}/{p.shard}")
        if self._copy is not None:
            self._copy.retired((p.keyspace, p.shard) for p in journal.participants)
        for sg in journal.shard_gtids:
            key = (sg.keyspace, sg.shard)
            if key in self._shards:
                continue  # the same journal, staged again from another participant
            self._shards[key] = sg
            held = self._held.pop(key, [])
            stop = self._stop.shard(*key) if self._stop is not None else None
            if self._stop is not None and (stop is None or position_contains(sg.gtid, stop.gtid)):
                # The stop was planned before the switch (or at it): the next window reads it.
                self._done.add(key)
                continue
            self._merger.join(key, unit.order_ts)
            self._unheld.extend(held)

    def _push_unheld(self) -> None:
        """Hands the merge the held units of new shards whose journal is staged."""
        while self._unheld:
            self._accept(self._unheld.pop(0))

    def _release_buffers(self) -> None:
        """The read is over, however it ended: what it still buffers (units past an early stop,
        an open transaction cut by an error) is dropped now, spill files included, rather than
        whenever the reader is collected. A next read gets them again from the position."""
        self._assembler.close()
        self._merger.close()
        for unit in (*self._unheld, *(u for held in self._held.values() for u in held)):
            unit.events.close()

    def _finish_shard(self, key: ShardKey) -> None:
        self._done.add(key)
        self._stage(self._merger.mark_done(key))

    def _all_done(self) -> bool:
        assert self._stop is not None
        return not self._held and not self._unheld and all(key in self._done for key in self._shards)

    def _bound_reached(self, started: float) -> str | None:
        """Checked after every event. ``max_seconds`` ends a window only once no transaction that
        was in flight when the time ran out still is, and not before the read got anything: a
        transaction that takes longer to stream than the budget, cut there, would be read again
        from its BEGIN by the next window and cut again, and the sync would never pass it (empty
        windows, every run green). vttablet may send heartbeats while it reads a large
        transaction from the binlog, before its BEGIN: hence "got anything" too. (Units the merge
        holds back for another shard are something: that shard's next unit or its stop
        releases them.)"""
        if self._early_stop is not None:
            return self._early_stop
        if self._bounds.max_seconds is None or self._clock() - started < self._bounds.max_seconds:
            return None
        open_now = self._assembler.open_shards()
        if self._finishing is None:
            self._finishing = open_now  # the transactions in flight when the time ran out
        # A shard leaves the set at its transaction's COMMIT: the check runs after every event,
        # so a COMMIT and the next BEGIN of one shard are never seen as one.
        self._finishing &= open_now
        if self._finishing or self._merger.idle:
            if not self._read_past_bound:
                log.info(
                    "keyspace %r: max_seconds=%g spent before the window read a whole transaction, "
                    "or inside one; reading on to its end",
                    self._keyspace,
                    self._bounds.max_seconds,
                )
            self._read_past_bound = True
            return None
        return f"max_seconds={self._bounds.max_seconds:g}"

    def _stage(self, units: Iterator[ShardTransaction], *, bounded: bool = True) -> None:
        """Stages released units; stops pulling them at ``max_events`` (the rest stay buffered)."""
        # Check before pulling: pulling a unit takes it out of the merge (and moves the resume
        # position past it), so a unit pulled after the bound would be lost.
        while not (bounded and self._early_stop is not None):
            unit = next(units, None)
            if unit is None:
                return
            self._result.units += 1
            behind = self._copied_at.holding(unit.keyspace, unit.shard, unit.position)
            for event in unit.events:
                if isinstance(event, FieldEvent):
                    if event.is_internal_table:
                        continue
                    where = (event.keyspace, event.table, event.shard)
                    if event.table in behind:
                        # vtgate sends a table's fields once, before its first row: kept for a
                        # later row of this shard that no new field event precedes.
                        self._held_fields[where] = event
                        continue
                    self._held_fields.pop(where, None)
                    # Per shard: during a DDL, shards switch schema at different moments.
                    self._stager.set_schema(event.keyspace, event.table, event.fields, shard=event.shard)
                elif isinstance(event, RowEvent):
                    if event.is_internal_table:
                        continue
                    n = len(event.changes)
                    if event.table in behind:
                        self._result.rows_behind_copy += n
                        continue
                    held = self._held_fields.pop((event.keyspace, event.table, event.shard), None)
                    if held is not None:
                        self._stager.set_schema(held.keyspace, held.table, held.fields, shard=held.shard)
                    # The whole event at once: its rows stay serialized until staged (RawRows).
                    self._stager.add_rows(
                        event.keyspace, event.table, event.shard, unit.commit_ts, self._seq + 1, event.changes
                    )
                    self._seq += n
                    self._result.rows += n
                    self._rows_since_checkpoint += n
                    self._bytes_since_checkpoint += event_bytes(event)
                    counts = self._result.rows_per_table
                    counts[event.table] = counts.get(event.table, 0) + n
                    if self._on_rows:
                        self._on_rows(event.table, n)
                elif isinstance(event, DdlEvent):
                    self._result.ddls.append(event.statement)
                    self._stager.add_ddl(event.keyspace, event.shard, event.statement, unit.commit_ts)
                elif isinstance(event, JournalEvent) and _is_reshard(event.journal):
                    self._pass_journal(unit, event.journal)
            unit.events.close()  # frees memory, deletes a spill file
            if self._checkpoint_due() and unit.position is not None:
                assert self._on_checkpoint is not None
                self._rows_since_checkpoint = self._bytes_since_checkpoint = 0
                self._on_checkpoint(self.position())
            if self._bounds.max_events is not None and self._result.rows >= self._bounds.max_events:
                self._early_stop = f"max_events={self._bounds.max_events}"

    def _checkpoint_due(self) -> bool:
        if self._on_checkpoint is None:
            return False
        rows, nbytes = self._checkpoint_every, self._checkpoint_every_bytes
        return bool(
            (rows and self._rows_since_checkpoint >= rows)
            or (nbytes and self._bytes_since_checkpoint >= nbytes)
        )

    def _close(self, reason: str | None) -> ReadResult:
        if reason is None:
            # Reached the stop (or the copy completed): everything buffered belongs to the window.
            self._stage(self._merger.drain(), bounded=False)
        self._result.stopped_early = reason
        self._result.end_vgtid = self.position()
        self._result.stats = {
            # max_seconds ran out inside a transaction (or before the read got anything): the
            # window read on to the end of one.
            "read_past_max_seconds": self._read_past_bound,
            "merge": self.merge_stats,
            "reconnects": self._reader.reconnects,
            "partial_rows_discarded": self._assembler.discarded_rows,
            "spilled_transactions": self._assembler.spilled_transactions,
            "rows_behind_copy": self._result.rows_behind_copy,
            SOURCE_TS_MAX: self._source_ts_max or None,
        }
        return self._result


def _is_reshard(journal: binlogdata_pb2.Journal | None) -> bool:
    """A reshard's journal (vtgate never sends a MoveTables one to a VStream client)."""
    return journal is not None and journal.migration_type == binlogdata_pb2.MigrationType.SHARDS
