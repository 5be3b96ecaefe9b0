"""Typed events out of ``binlogdata.VEvent`` (or a :mod:`.wire` view event): what a VStream
consumer acts on. Each carries ``keyspace``, ``shard``, ``timestamp`` (binlog seconds) and
``current_time`` (sender's nanoseconds); the vtgate semantics they keep (bare table names,
VGTID as the only resume point, COPY_COMPLETED per shard): ``docs/design.md``, Decoding.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, overload

from google.protobuf.message import DecodeError

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.decoding import wire
from airflow_provider_vitess.decoding.values import RowDecoder, Value
from airflow_provider_vitess.exceptions import VStreamError
from airflow_provider_vitess.vgtid import Vgtid

E = binlogdata_pb2.VEventType


class Operation(str, enum.Enum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True, kw_only=True)
class VStreamEvent:
    """Fields common to every event."""

    keyspace: str
    shard: str
    timestamp: int
    current_time: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldEvent(VStreamEvent):
    """A table's column list; sent before its first ROW event and after each schema change."""

    table: str
    fields: tuple[query_pb2.Field, ...]
    column_names: tuple[str, ...]
    enum_set_string_values: bool = False
    is_internal_table: bool = False


@dataclass(frozen=True, slots=True)
class RowChange:
    """One changed row: ``before`` only = delete, ``after`` only = insert, both = update.

    With partial row images (``binlog_row_image=NOBLOB``) ``present_columns`` lists the column
    indexes the after image really has; the others read as None without being NULL. Columns in
    ``json_partial_columns`` hold a JSON partial-update expression (MySQL), not a document.
    """

    before: tuple[Value, ...] | None
    after: tuple[Value, ...] | None
    present_columns: frozenset[int] | None = None
    json_partial_columns: frozenset[int] = frozenset()

    def __reduce__(self) -> tuple[Any, ...]:
        # Spilled units are pickled row by row; the dataclass default walks fields() per object.
        return (RowChange, (self.before, self.after, self.present_columns, self.json_partial_columns))

    @property
    def operation(self) -> Operation:
        return operation_of(self.before is not None, self.after is not None)


def operation_of(has_before: bool, has_after: bool) -> Operation:
    """A row change's operation by the images it has: no before image an INSERT, no after image
    a DELETE, both an UPDATE (decoded changes and raw blocks alike)."""
    if not has_before:
        return Operation.INSERT
    return Operation.UPDATE if has_after else Operation.DELETE


def _bitmap(bitmap: binlogdata_pb2.RowChange.Bitmap) -> list[bool]:
    # Bit i of the set is bit (i % 8) of byte i // 8, as in MySQL's row events.
    cols = bitmap.cols
    return [bool(cols[i >> 3] & (1 << (i & 7))) for i in range(min(bitmap.count, len(cols) * 8))]


def decode_changes(
    row_changes: Iterable[binlogdata_pb2.RowChange], decoder: RowDecoder, json_columns: Sequence[int]
) -> tuple[RowChange, ...]:
    """Row changes decoded row by row (``json_columns``: indexes of the table's JSON columns)."""
    decode = decoder.decode
    changes = []
    for rc in row_changes:
        present = None
        if rc.HasField("data_columns"):
            present = frozenset(i for i, bit in enumerate(_bitmap(rc.data_columns)) if bit)
        json_partial: frozenset[int] = frozenset()
        if rc.HasField("json_partial_values"):
            # That bitmap counts JSON columns only: map its bits back to column indexes.
            bits = _bitmap(rc.json_partial_values)
            json_partial = frozenset(
                json_columns[j] for j, bit in enumerate(bits) if bit and j < len(json_columns)
            )
        changes.append(
            RowChange(
                before=decode(rc.before) if rc.HasField("before") else None,
                after=decode(rc.after) if rc.HasField("after") else None,
                present_columns=present,
                json_partial_columns=json_partial,
            )
        )
    return tuple(changes)


class RawRows(Sequence[RowChange]):
    """The row changes of one ROW event, kept as the serialized ``binlogdata.RowEvent``.

    Decoding rows one by one through protobuf objects costs more than everything else a
    window does with them, so the reader keeps the bytes (as vtgate sent them when it reads
    response bytes, :mod:`.wire`; else one C-level ``SerializeToString`` per event) and the
    stager converts whole batches of them to Arrow columns at once
    (:mod:`airflow_provider_vitess.staging.columnar`). Held back or spilled units then carry
    these bytes, not Python values. Reading it as a sequence decodes it with the per-row
    decoder (once, then cached), for every other consumer.
    """

    __slots__ = ("_decoded", "data", "decoder", "json_columns", "n_rows")

    def __init__(
        self, data: bytes, count: int, decoder: RowDecoder, json_columns: tuple[int, ...] = ()
    ) -> None:
        self.data = data
        self.n_rows = count  # len(row_changes)
        self.decoder = decoder
        self.json_columns = json_columns
        self._decoded: tuple[RowChange, ...] | None = None

    def decode(self) -> tuple[RowChange, ...]:
        """The row changes, decoded now (not cached)."""
        proto = binlogdata_pb2.RowEvent.FromString(self.data)
        return decode_changes(proto.row_changes, self.decoder, self.json_columns)

    def _changes(self) -> tuple[RowChange, ...]:
        if self._decoded is None:
            self._decoded = self.decode()
        return self._decoded

    def __len__(self) -> int:
        return self.n_rows

    @overload
    def __getitem__(self, index: int) -> RowChange: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[RowChange, ...]: ...
    def __getitem__(self, index: int | slice) -> RowChange | tuple[RowChange, ...]:
        return self._changes()[index]

    def __iter__(self) -> Iterator[RowChange]:
        return iter(self._changes())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RawRows):
            return self.data == other.data and self.decoder.fields == other.decoder.fields
        if isinstance(other, Sequence):
            return self._changes() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._changes())

    def __reduce__(self) -> tuple[Any, ...]:
        # Spilled as bytes: the decoded cache is not worth writing.
        return (RawRows, (self.data, self.n_rows, self.decoder, self.json_columns))

    def __repr__(self) -> str:
        return f"RawRows({self.n_rows} rows of {self.decoder.table or 'a table'}, {len(self.data)} bytes)"


@dataclass(frozen=True, slots=True, kw_only=True)
class RowEvent(VStreamEvent):
    """Row changes of one table from one transaction (a transaction may send several).

    ``changes`` is a :class:`RawRows` when decoded from the stream (decoded on first read).
    """

    table: str
    column_names: tuple[str, ...]
    changes: Sequence[RowChange]
    flags: int = 0
    is_internal_table: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VgtidEvent(VStreamEvent):
    """The stream's position after the preceding events; ``keyspace``/``shard`` that moved."""

    vgtid: binlogdata_pb2.VGtid

    def positions(self) -> dict[tuple[str, str], str]:
        """``(keyspace, shard) -> gtid`` of every shard in the stream."""
        return {(sg.keyspace, sg.shard): sg.gtid for sg in self.vgtid.shard_gtids}

    def to_vgtid(self) -> Vgtid:
        return Vgtid.from_proto(self.vgtid)


@dataclass(frozen=True, slots=True, kw_only=True)
class BeginEvent(VStreamEvent):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitEvent(VStreamEvent):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class DdlEvent(VStreamEvent):
    statement: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatEvent(VStreamEvent):
    throttled: bool = False
    throttled_reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEvent(VStreamEvent):
    """A resharding/MoveTables cut-over: ``participants`` stop, ``shard_gtids`` continue."""

    journal: binlogdata_pb2.Journal

    @property
    def migration_type(self) -> str:
        return binlogdata_pb2.MigrationType.Name(self.journal.migration_type)

    @property
    def participants(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.keyspace, p.shard) for p in self.journal.participants)


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyCompletedEvent(VStreamEvent):
    """One shard's copy is done, or (empty keyspace and shard) the whole stream's copy."""

    @property
    def is_stream_complete(self) -> bool:
        return not self.keyspace and not self.shard


@dataclass(frozen=True, slots=True, kw_only=True)
class LastPkEvent(VStreamEvent):
    """Copy progress of one table (vtgate folds these into VGTID events; kept for tablets)."""

    table: str
    lastpk: query_pb2.QueryResult | None
    completed: bool

    def lastpk_values(self) -> tuple[Value, ...] | None:
        if self.lastpk is None or not self.lastpk.rows:
            return None
        return RowDecoder(self.lastpk.fields, self.table).decode(self.lastpk.rows[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherEvent(VStreamEvent):
    """Anything else (OTHER, ROLLBACK, SAVEPOINT, GTID, VERSION...): position-only events."""

    type: str
    statement: str = ""
    raw: binlogdata_pb2.VEvent | None = None


Event = (
    FieldEvent
    | RowEvent
    | VgtidEvent
    | BeginEvent
    | CommitEvent
    | DdlEvent
    | HeartbeatEvent
    | JournalEvent
    | CopyCompletedEvent
    | LastPkEvent
    | OtherEvent
)


class _Common(TypedDict):
    keyspace: str
    shard: str
    timestamp: int
    current_time: int


class EventDecoder:
    """Turns VEvents into typed events, keeping each table's row decoder from its FIELD event.

    ``keyspace_in_table_names`` mirrors the request: True unless the VStream flags set
    ``exclude_keyspace_from_table_name``.
    """

    def __init__(self, keyspace_in_table_names: bool = True) -> None:
        self._prefixed = keyspace_in_table_names
        self._decoders: dict[tuple[str, str, str], RowDecoder] = {}
        self._json_columns: dict[tuple[str, str, str], tuple[int, ...]] = {}

    def decode_all(self, events: Iterable[binlogdata_pb2.VEvent]) -> list[Event]:
        return [self.decode(ev) for ev in events]

    def decode(self, ev: binlogdata_pb2.VEvent) -> Event:
        """``ev`` is a ``binlogdata.VEvent`` or a view event of :mod:`.wire` (the same fields,
        ``row_event`` still serialized); both give the same event."""
        common = _Common(
            keyspace=ev.keyspace, shard=ev.shard, timestamp=ev.timestamp, current_time=ev.current_time
        )
        t = ev.type
        if t == E.ROW:
            return self._row(ev)
        if t == E.VGTID:
            return VgtidEvent(vgtid=ev.vgtid, **common)
        if t == E.BEGIN:
            return BeginEvent(**common)
        if t == E.COMMIT:
            return CommitEvent(**common)
        if t == E.FIELD:
            return self._field(ev)
        if t == E.HEARTBEAT:
            return HeartbeatEvent(throttled=ev.throttled, throttled_reason=ev.throttled_reason, **common)
        if t == E.DDL:
            return DdlEvent(statement=ev.statement, **common)
        if t == E.JOURNAL:
            return JournalEvent(journal=ev.journal, **common)
        if t == E.COPY_COMPLETED:
            return CopyCompletedEvent(**common)
        if t == E.LASTPK:
            pk = ev.last_p_k_event.table_last_p_k
            return LastPkEvent(
                table=self._bare(pk.table_name, ev.keyspace),
                lastpk=pk.lastpk if pk.HasField("lastpk") else None,
                completed=ev.last_p_k_event.completed,
                **common,
            )
        try:
            name = E.Name(t)
        except ValueError:  # a type newer than our protos
            name = str(t)
        whole = ev if isinstance(ev, binlogdata_pb2.VEvent) else wire.to_vevent(ev)
        return OtherEvent(type=name, statement=ev.statement, raw=whole, **common)

    def decoder_for(self, keyspace: str, shard: str, table: str) -> RowDecoder | None:
        return self._decoders.get((keyspace, shard, table))

    def _bare(self, table: str, keyspace: str) -> str:
        # Strip vtgate's "keyspace." prefix; a bare name (tablet streams) is left alone.
        if self._prefixed and keyspace and table.startswith(keyspace + "."):
            return table[len(keyspace) + 1 :]
        return table

    def _field(self, ev: binlogdata_pb2.VEvent) -> FieldEvent:
        fe = ev.field_event
        keyspace, shard = fe.keyspace or ev.keyspace, fe.shard or ev.shard
        table = self._bare(fe.table_name, keyspace)
        decoder = RowDecoder(fe.fields, table)
        key = (keyspace, shard, table)
        self._decoders[key] = decoder
        self._json_columns[key] = tuple(
            i for i, f in enumerate(decoder.fields) if f.type == query_pb2.Type.JSON
        )
        return FieldEvent(
            keyspace=keyspace,
            shard=shard,
            timestamp=ev.timestamp,
            current_time=ev.current_time,
            table=table,
            fields=decoder.fields,
            column_names=decoder.names,
            enum_set_string_values=fe.enum_set_string_values,
            is_internal_table=fe.is_internal_table,
        )

    def _row(self, ev: binlogdata_pb2.VEvent) -> RowEvent:
        raw: bytes | None = None
        re_: Any = ev.row_event
        if isinstance(re_, bytes):  # a view event (decoding/wire.py): the RowEvent as vtgate sent it
            raw = re_
            try:
                re_ = wire.parse_row_event_header(raw)
            except DecodeError as err:
                raise VStreamError(
                    f"ROW event from keyspace {ev.keyspace!r}, shard {ev.shard!r}: its {len(raw)} bytes "
                    f"are not a binlogdata.RowEvent ({err})"
                ) from err
        keyspace, shard = re_.keyspace or ev.keyspace, re_.shard or ev.shard
        table = self._bare(re_.table_name, keyspace)
        key = (keyspace, shard, table)
        decoder = self._decoders.get(key)
        if decoder is None:
            raise VStreamError(
                f"ROW event for table {table!r} (keyspace {keyspace!r}, shard {shard!r}) arrived "
                "before any FIELD event for it: cannot decode its values"
            )
        # Kept serialized: see RawRows. Values are checked when decoded or staged.
        data = raw if raw is not None else re_.SerializeToString()
        changes = RawRows(data, len(re_.row_changes), decoder, self._json_columns[key])
        return RowEvent(
            keyspace=keyspace,
            shard=shard,
            timestamp=ev.timestamp,
            current_time=ev.current_time,
            table=table,
            column_names=decoder.names,
            changes=changes,
            flags=re_.flags,
            is_internal_table=re_.is_internal_table,
        )
