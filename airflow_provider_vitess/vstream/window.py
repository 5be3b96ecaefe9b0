"""A bounded read of VStream: from a start VGTID to a stop position, into a stager.

Two kinds of reads share this loop:

* **catch-up window**: from the committed VGTID until every shard has reached the stop position
  captured when the window was planned (or earlier, at a unit boundary, when ``max_events`` /
  ``max_seconds`` says so). Units are merged across shards in deterministic order
  (:mod:`.ordering`), so re-reading the window from the same start stages the same rows with the
  same sequence numbers. A shard's units past its stop are left for the next window.
* **snapshot**: the VStream copy phase from an empty position, until vtgate says the whole copy is
  complete. Rows are staged in arrival order (each shard keeps its own order; copied keys are
  disjoint across shards), and the stager is checkpointed regularly together with the VGTID and
  its table last-PKs, so a killed snapshot resumes where it was instead of starting over.

Only VGTID events are resume points, and only positions of units already handed to the stager
are ever reported (:meth:`ShardMerger.released_positions`).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2
from airflow_provider_vitess.exceptions import VStreamDeadlineError, VStreamError
from airflow_provider_vitess.vgtid import CURRENT, Vgtid, position_contains
from airflow_provider_vitess.vstream.events import (
    CopyCompletedEvent,
    DdlEvent,
    FieldEvent,
    HeartbeatEvent,
    JournalEvent,
    RowChange,
    RowEvent,
    VgtidEvent,
)
from airflow_provider_vitess.vstream.ordering import (
    ShardKey,
    ShardMerger,
    ShardTransaction,
    TransactionAssembler,
)
from airflow_provider_vitess.vstream.reader import OpenStream, RetryPolicy, VStreamReader

log = logging.getLogger(__name__)


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
        :class:`~.events.RawRows`, still serialized)."""
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
    journals: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


def table_filter(tables: Sequence[str]) -> binlogdata_pb2.Filter:
    """One rule per table (exact names: a rule's ``match`` is a name, never a pattern here)."""
    return binlogdata_pb2.Filter(
        rules=[binlogdata_pb2.Rule(match=t, filter=f"select * from `{t.replace('`', '``')}`") for t in tables]
    )


def capture_stop_position(
    open_stream: OpenStream, keyspace: str, *, tablet_type: str = "PRIMARY", timeout: float = 60.0
) -> Vgtid:
    """The keyspace's current position on every shard: a window's stop.

    vtgate answers a VStream from ``current`` with a VGTID event listing every shard, but a shard
    whose stream has not started yet still shows ``current``; wait until none does. Heartbeats
    are asked for so a quiet keyspace still answers, and the whole probe, reconnects included,
    ends by ``timeout`` (a dead or black-holed link cannot hold it longer).
    """
    reader = VStreamReader(
        open_stream,
        keyspace=keyspace,
        tablet_type=tablet_type,
        flags=vtgate_pb2.VStreamFlags(heartbeat_interval=1),
        idle_timeout=min(timeout, 10.0),
        deadline=time.monotonic() + timeout,
        retry=RetryPolicy(max_elapsed=timeout),
    )
    events = reader.events()
    try:
        for event in events:
            if isinstance(event, VgtidEvent):
                vgtid = event.to_vgtid()
                if vgtid.shard_gtids and all(sg.gtid not in ("", CURRENT) for sg in vgtid.shard_gtids):
                    return vgtid
    except VStreamDeadlineError:
        pass
    finally:
        events.close()
    raise VStreamDeadlineError(
        f"keyspace {keyspace!r}: vtgate gave no position for every shard within {timeout:g}s "
        "(is vtgate reachable, and are the keyspace's primary tablets serving?)"
    )


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
        max_buffered_rows: int = 50_000,
        checkpoint_every_rows: int = 0,
        on_checkpoint: Callable[[Vgtid], None] | None = None,
        on_rows: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reset_connection: Callable[[], None] | None = None,
    ) -> None:
        self._snapshot = stop is None
        self._keyspace, self._tables = keyspace, tuple(tables)
        self._start, self._stop, self._bounds = start, stop, bounds
        self._stager = stager
        self._checkpoint_every = checkpoint_every_rows
        self._on_checkpoint, self._on_rows, self._clock = on_checkpoint, on_rows, clock
        self._reader = VStreamReader(
            open_stream,
            vgtid=start,
            filter=table_filter(tables),
            flags=flags,
            tablet_type=tablet_type,
            reset_connection=reset_connection,
        )
        shards: list[ShardKey] = [(sg.keyspace, sg.shard) for sg in (stop or start).shard_gtids]
        # A snapshot needs no cross-shard order (copied keys are disjoint), so units pass straight
        # through and each shard's resume position keeps moving; a catch-up window merges.
        self._merger = ShardMerger(shards, max_buffered_rows=max_buffered_rows, ordered=not self._snapshot)
        self._assembler = TransactionAssembler()
        self._done: set[ShardKey] = set()
        self._result = ReadResult(end_vgtid=start)
        self._seq = 0
        self._rows_since_checkpoint = 0
        self._early_stop: str | None = None

    @property
    def merge_stats(self) -> dict[str, int]:
        return vars(self._merger.stats).copy()

    def position(self) -> Vgtid:
        """Start position with every shard advanced to its last staged unit: a safe resume point.

        The start must name every shard (a snapshot starts from ``""`` per shard), so a shard
        that has staged nothing yet resumes from where it started.
        """
        released = self._merger.released_positions()
        entries = [released.get((sg.keyspace, sg.shard), sg) for sg in self._start.to_proto().shard_gtids]
        return Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=entries))

    def run(self) -> ReadResult:
        # Objects alive now (Airflow's and ours, imported once) never die during the read; frozen,
        # the collector stops re-walking them on every full collection (~30% of a read's CPU).
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> ReadResult:
        started = self._clock()
        if self._stop is not None:
            for sg in self._start.shard_gtids:
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
                for item in self._assembler.push(event):
                    if isinstance(item, HeartbeatEvent):
                        self._stage(self._merger.heartbeat(item.timestamp, self._assembler.open_shards()))
                    elif self._accept(item):
                        return self._close(None)
                    if self._early_stop is not None:
                        return self._close(self._early_stop)
                if self._snapshot and isinstance(event, CopyCompletedEvent) and event.is_stream_complete:
                    return self._close(None)
                reason = self._bound_reached(started)
                if reason:
                    return self._close(reason)
        finally:
            events.close()
        raise VStreamError(
            f"keyspace {self._keyspace!r}: the VStream ended before the window's stop position"
        )

    # ----- internals -----------------------------------------------------------------------

    def _accept(self, unit: ShardTransaction) -> bool:
        """Hands a completed unit to the merge; True when the window has reached its stop."""
        if unit.key in self._done:
            return False  # past this shard's stop: the next window reads it
        if any(isinstance(e, JournalEvent) for e in unit.events):
            # Resharding: vtgate switches the stream to the new shards by itself; positions of
            # the old shards are not needed after the journal (docs/design.md, "Event order").
            self._result.journals += 1
        self._stage(self._merger.push(unit))
        if self._stop is not None and unit.position is not None:
            stop = self._stop.shard(unit.keyspace, unit.shard)
            if stop is None or position_contains(unit.position.gtid, stop.gtid):
                self._finish_shard(unit.key)
        return self._stop is not None and self._all_done()

    def _finish_shard(self, key: ShardKey) -> None:
        self._done.add(key)
        self._stage(self._merger.mark_done(key))

    def _all_done(self) -> bool:
        assert self._stop is not None
        return all((sg.keyspace, sg.shard) in self._done for sg in self._stop.shard_gtids)

    def _bound_reached(self, started: float) -> str | None:
        if self._early_stop is not None:
            return self._early_stop
        if self._bounds.max_seconds is not None and self._clock() - started >= self._bounds.max_seconds:
            return f"max_seconds={self._bounds.max_seconds:g}"
        return None

    def _stage(self, units: Iterator[ShardTransaction], *, bounded: bool = True) -> None:
        """Stages released units; stops pulling them at ``max_events`` (the rest stay buffered)."""
        # Check before pulling: pulling a unit takes it out of the merge (and moves the resume
        # position past it), so a unit pulled after the bound would be lost.
        while not (bounded and self._early_stop is not None):
            unit = next(units, None)
            if unit is None:
                return
            self._result.units += 1
            for event in unit.events:
                if isinstance(event, FieldEvent):
                    if not event.is_internal_table:
                        # Per shard: during a DDL, shards switch schema at different moments.
                        self._stager.set_schema(event.keyspace, event.table, event.fields, shard=event.shard)
                elif isinstance(event, RowEvent):
                    if event.is_internal_table:
                        continue
                    n = len(event.changes)
                    # The whole event at once: its rows stay serialized until staged (RawRows).
                    self._stager.add_rows(
                        event.keyspace, event.table, event.shard, unit.commit_ts, self._seq + 1, event.changes
                    )
                    self._seq += n
                    self._result.rows += n
                    self._rows_since_checkpoint += n
                    counts = self._result.rows_per_table
                    counts[event.table] = counts.get(event.table, 0) + n
                    if self._on_rows:
                        self._on_rows(event.table, n)
                elif isinstance(event, DdlEvent):
                    self._result.ddls.append(event.statement)
                    self._stager.add_ddl(event.keyspace, event.shard, event.statement, unit.commit_ts)
            unit.events.close()  # frees memory, deletes a spill file
            if (
                self._checkpoint_every
                and self._on_checkpoint is not None
                and self._rows_since_checkpoint >= self._checkpoint_every
                and unit.position is not None
            ):
                self._rows_since_checkpoint = 0
                self._on_checkpoint(self.position())
            if self._bounds.max_events is not None and self._result.rows >= self._bounds.max_events:
                self._early_stop = f"max_events={self._bounds.max_events}"

    def _close(self, reason: str | None) -> ReadResult:
        if reason is None:
            # Reached the stop (or the copy completed): everything buffered belongs to the window.
            self._stage(self._merger.drain(), bounded=False)
        self._result.stopped_early = reason
        self._result.end_vgtid = self.position()
        self._result.stats = {
            "merge": self.merge_stats,
            "reconnects": self._reader.reconnects,
            "partial_rows_discarded": self._assembler.discarded_rows,
        }
        return self._result
