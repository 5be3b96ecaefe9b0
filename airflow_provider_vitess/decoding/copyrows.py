"""Copy-phase ROW events (one row each) gathered into blocks at the bytes level (pure): each run
of them of one table and shard in a response becomes one :mod:`.wire` view event holding all
its rows, proven byte for byte to equal the events merged; every other event passes through
(why this is exact: ``docs/design.md``, Decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding import wire
from airflow_provider_vitess.decoding.rowwire import varint_at

_ROW = binlogdata_pb2.VEventType.ROW
# VEvent: field 1 (type, varint) = ROW, then field 5 (row_event, length-delimited). A timestamp
# (2), gtid (3) or statement (4) would sit between them: the runtime writes fields in number order.
_COPY_ROW_PREFIX = bytes([0x08, _ROW, 0x2A])
_TABLE_NAME_TAG = 0x0A  # RowEvent.table_name
_ROW_CHANGE_TAG = 0x12  # RowEvent.row_changes
_MAX_VARINT = 10


def _event_bytes_view() -> Any:
    """``vtgate.VStreamResponse`` with ``events`` as ``repeated bytes``: each event still
    serialized, all of them listed by one C-level parse."""
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="airflow_provider_vitess/copyrows_view.proto", package="copyrows_view", syntax="proto3"
    )
    view = file.message_type.add(name="EventBytes")
    view.field.add(name="events", number=1, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("copyrows_view.EventBytes"))


_EventBytes = _event_bytes_view()


class RowBlock:
    """Consecutive copy-phase ROW events of one table and shard, as one view event."""

    __slots__ = ("current_time", "events", "keyspace", "row_event", "shard")
    type = _ROW
    timestamp = 0  # copy-phase rows have none (see the module docstring)

    def __init__(self, first: Any, row_event: bytes, events: int) -> None:
        self.keyspace: str = first.keyspace
        self.shard: str = first.shard
        self.current_time: int = first.current_time
        self.row_event = row_event  # one serialized binlogdata.RowEvent with every row of the run
        self.events = events  # how many ROW events it stands for

    def __repr__(self) -> str:
        where = f"{self.keyspace}/{self.shard}"
        return f"RowBlock({self.events} ROW events, {len(self.row_event)} bytes, {where})"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    return varint_at(data, pos, _MAX_VARINT)  # any field's value here: up to 64 bits


def _skip_field(data: bytes, pos: int) -> tuple[int, int]:
    """(field number, position after the field) of the field at ``pos``."""
    tag, pos = _varint(data, pos)
    wire_type = tag & 7
    if wire_type == 0:
        _, pos = _varint(data, pos)
    elif wire_type == 2:
        size, pos = _varint(data, pos)
        pos += size
    elif wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    else:
        raise ValueError(f"wire type {wire_type}")
    if pos > len(data):
        raise ValueError("field past the end")
    return tag >> 3, pos


def _fields_after(data: bytes, pos: int, lowest: int) -> bool:
    """True when ``data[pos:]`` is whole fields, each numbered above ``lowest``."""
    while pos < len(data):
        number, pos = _skip_field(data, pos)
        if number <= lowest:
            return False
    return True


def _frame(event: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``(H, T, VT)`` of a copy-phase ROW VEvent ``prefix + row event + VT`` whose row event is
    ``H + row changes + T``: ``H`` the table name field, ``T`` and ``VT`` the fields after the
    row changes and after the row event (keyspace, shard...). None when the event is not one
    of that shape (fields out of number order, a row event of 16 KiB or more...)."""
    try:
        _, end = _skip_field(event, 2)  # the row_event field, after the 2-byte type field
        _, body = _varint(event, 3)
        if body - 3 > 2 or not _fields_after(event, end, 5):
            return None
        row_event = event[body:end]
        pos = 0
        if row_event[:1] == bytes([_TABLE_NAME_TAG]):
            _, pos = _skip_field(row_event, 0)
        head = pos
        while pos < len(row_event) and row_event[pos] == _ROW_CHANGE_TAG:
            _, pos = _skip_field(row_event, pos)
        if not _fields_after(row_event, pos, 2):
            return None
        return row_event[:head], row_event[pos:], event[end:]
    except (ValueError, IndexError):
        return None


class _Layout:
    """Where each event of a serialized response lies in its bytes, and the bytes as numpy.

    A ``VStreamResponse`` is its events one after the other, each ``0x0A varint(length)
    event``. Their lengths (from the one C-level parse of the bytes view) give every event's
    offset at once; the layout is proven by the tag byte before each event and the total length
    (any other field would break both), else the caller leaves the response alone.
    """

    __slots__ = ("data", "lens", "starts", "u8", "u64")

    def __init__(self, data: bytes, lens: Any, starts: Any) -> None:
        self.data, self.lens, self.starts = data, lens, starts
        self.u8 = np.frombuffer(data, np.uint8)
        # The 8 bytes from every offset, as one integer (an unaligned view, no copy): comparing
        # a run of bytes then reads an eighth as many values.
        self.u64 = np.ndarray((max(len(data) - 7, 0),), "<u8", buffer=data, strides=(1,))

    @classmethod
    def of(cls, data: bytes, raw: Sequence[bytes]) -> _Layout | None:
        lens = np.fromiter(map(len, raw), np.int64, len(raw))
        size = 1 + sum((lens >= 1 << (7 * k)).astype(np.int64) for k in range(1, 5))  # varint bytes
        ends = np.cumsum(1 + size + lens)
        if not len(lens) or int(ends[-1]) != len(data) or int(lens.max()) >= 1 << 28:
            return None
        layout = cls(data, lens, ends - lens)
        if not (layout.u8[layout.starts - size - 1] == 0x0A).all():
            return None
        return layout

    def at(self, offsets: Any) -> Any:
        """The bytes at ``offsets``, which may be past either end for an event too short for the
        caller's shape (its own size checks reject it): read as the last byte, or from the end."""
        return self.u8[np.minimum(offsets, len(self.u8) - 1)]

    def equal(self, offsets: Any, expected: bytes) -> Any:
        """Per offset, whether the bytes from it are ``expected`` (offsets out of the response
        read other bytes, as in :meth:`at`)."""
        size = len(expected)
        if not size:
            return np.ones(len(offsets), bool)
        if size < 8 or len(self.data) < size:
            want = np.frombuffer(expected, np.uint8)
            return (self.at(offsets[:, None] + np.arange(size)) == want).all(axis=1)
        # 8 bytes at a time, the last chunk overlapping the one before it; one flat gather per
        # chunk (a 2-D gather and ``all`` over its short axis cost ~2x as much).
        base = np.clip(offsets, 0, max(len(self.u64) - 1 - (size - 8), 0))
        ok: Any = None
        for c in [*range(0, size - 8, 8), size - 8]:
            hit = self.u64[base + c] == np.uint64(int.from_bytes(expected[c : c + 8], "little"))
            ok = hit if ok is None else np.logical_and(ok, hit, out=ok)
        return ok

    def copy_rows(self) -> bytes:
        """One byte per event: 1 where it starts as a copy-phase ROW event."""
        s = self.starts
        rows = self.lens >= len(_COPY_ROW_PREFIX) + 2
        for k, b in enumerate(_COPY_ROW_PREFIX):
            rows &= self.at(s + k) == b
        flags: bytes = rows.astype(np.uint8).tobytes()
        return flags


# Events proven at once at first; when all are, the rest of the stretch in one pass (each pass
# costs ~20 numpy calls: a 4,000-event run takes two). A run that ends early then costs at most
# the stretch once, and it covered this many events.
_FIRST_CHUNK = 256
# Events in a row that were each a run of one, after which the rest of a stretch of copy-phase
# ROW events is passed through as events: each attempt costs ~50 µs of numpy calls, and a
# response of one-event runs (rows that each differ in their tail) would pay it per event.
_MAX_MISSES = 16


def _row_event_layout(starts: Any, size: Any, tail: bytes) -> tuple[Any, Any, Any]:
    """Per event ``prefix + varint(len) + row event + VT`` (``starts``, ``size``, ``VT`` the
    ``tail``): the bytes of varint and row event, whether the varint takes two bytes, and where
    the row event begins."""
    rest = size - len(_COPY_ROW_PREFIX) - len(tail)
    two = rest > 128  # a row event of 128 bytes or more has a two-byte length
    return rest, two, starts + len(_COPY_ROW_PREFIX) + 1 + two


def _proven(layout: _Layout, starts: Any, size: Any, head: bytes, trailer: bytes, tail: bytes) -> Any:
    """Per event (``starts``, ``size``): whether it is ``prefix + varint(len) + H + rows + T +
    VT`` with the given ``H``, ``T`` and ``VT``: its length and the varint agree, and the bytes
    at both ends are the given ones. Numpy passes over the response's bytes, no Python per event."""
    suffix = trailer + tail
    rest, two, body = _row_event_layout(starts, size, tail)
    length = rest - 1 - two
    byte3, byte4 = layout.at(starts + 3), layout.at(starts + 4)
    ok = np.where(two, (byte3 == (length & 0x7F) | 0x80) & (byte4 == length >> 7), byte3 == length)
    ok &= (size >= len(_COPY_ROW_PREFIX) + 2) & (rest <= 16385) & (length >= len(head) + len(trailer))
    ok &= layout.equal(starts + size - len(suffix), suffix) & layout.equal(body, head)
    return ok


def _run(layout: _Layout, pos: int, end: int, first_raw: bytes, first: Any) -> RowBlock | None:
    """The longest run at the start of events ``pos:end`` (copy-phase ROW events, ``first``
    the view of event ``pos``, ``first_raw`` its bytes) that is one table and shard, as a block;
    None when it is one event.

    Every event of the run is proven to be the first event's shape with its ``H``, ``T`` and
    ``VT`` (:func:`_proven`). The proof runs on :data:`_FIRST_CHUNK` events first, and only
    when all of them are of the run on the rest: a run that ends early costs what it covers
    (a response whose events all differ would otherwise cost the square of its length).
    """
    frame = _frame(first_raw)
    if frame is None:
        return None
    head, trailer, tail = frame
    n = 0
    for stop in (min(end, pos + _FIRST_CHUNK), end):
        ok = _proven(layout, layout.starts[pos + n : stop], layout.lens[pos + n : stop], head, trailer, tail)
        bad = np.flatnonzero(~ok)
        n += int(bad[0]) if bad.size else len(ok)
        if bad.size or pos + n == end:
            break
    if n < 2:
        return None
    # Each event's row changes: between its H and T, joined as slices of the response (a
    # per-byte numpy gather built an 8-byte index per byte: ~3x the CPU of the slices).
    starts, size = layout.starts[pos : pos + n], layout.lens[pos : pos + n]
    body = _row_event_layout(starts, size, tail)[2]
    first_byte, last_byte = (body + len(head)).tolist(), (starts + size - len(trailer) - len(tail)).tolist()
    rows = map(layout.data.__getitem__, map(slice, first_byte, last_byte))
    return RowBlock(first, b"".join([head, *rows, trailer]), n)


def gather(data: bytes) -> Sequence[Any]:
    """The :mod:`.wire` view events of the serialized ``VStreamResponse`` ``data``, each run of
    two or more copy-phase ROW events of one table and shard replaced by one :class:`RowBlock`.

    A response with such runs is parsed as a list of event bytes (one C-level parse), and only
    the events outside the runs, and each run's first, are parsed as view events: a copy
    response's ~4,000 one-row events are never parsed one by one. Any other response (nothing
    to gather, or not of the shape this module can prove) is parsed whole, as
    :func:`.wire.parse_response` does. Raises ``google.protobuf.message.DecodeError`` on bytes
    that are not a ``VStreamResponse``."""
    raw = _EventBytes.FromString(data).events
    n = len(raw)
    layout = _Layout.of(data, raw) if n >= 2 else None
    copy_rows = layout.copy_rows() if layout is not None else b""
    start = copy_rows.find(b"\x01\x01")
    if layout is None or start < 0:
        return wire.parse_response(data).events  # type: ignore[no-any-return]
    out: list[Any] = []
    done = 0  # raw[:done] are handled
    while start >= 0:
        end = copy_rows.find(b"\x00", start)
        end = n if end < 0 else end
        out.extend(wire.parse_event(raw[k]) for k in range(done, start))
        pos, misses = start, 0
        while pos < end:
            event_bytes = raw[pos]
            event = wire.parse_event(event_bytes)
            attempt = end - pos > 1 and misses < _MAX_MISSES
            block = _run(layout, pos, end, event_bytes, event) if attempt else None
            misses = misses + 1 if block is None else 0
            out.append(event if block is None else block)
            pos += 1 if block is None else block.events
        done = end
        start = copy_rows.find(b"\x01\x01", end)
    out.extend(wire.parse_event(raw[k]) for k in range(done, n))
    return out
