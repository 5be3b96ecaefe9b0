"""Where the row values lie in serialized ``binlogdata.RowEvent`` messages, found with numpy
passes per batch instead of a Python loop per row (pure: bytes in, numpy arrays out). The
layout is proven against the bytes; a batch that fails the proof gets None and goes to the
per-row decoder (``docs/design.md``, Decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

I64 = npt.NDArray[np.int64]
Ints = npt.NDArray[np.signedinteger[Any]]  # column lengths: int8 when all are below 64
Bools = npt.NDArray[np.bool_]

# Wire tags (field number << 3 | wire type 2) of the messages we walk.
_TAG_1 = 0x0A  # RowEvent.table_name, RowChange.before, Row.lengths
_TAG_2 = 0x12  # RowEvent.row_changes, RowChange.after, Row.values
_LOW_BYTES = bytes(range(0x80))  # a varint's last byte is one of these
_PAD = bytes(16)  # varint reads may look a few bytes past a buffer's end
_MAX_VARINT = 5  # 35 bits: protobuf messages are < 2 GiB


def _view_classes() -> type[message.Message]:
    """``RowEvent`` as seen through a singular ``row_changes`` (see the module docstring).

    Built at runtime in a private pool: the view is an implementation detail of this module,
    not part of the Vitess protocol subset in ``protos/``.
    """
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="airflow_provider_vitess/rowwire_view.proto", package="rowwire_view", syntax="proto3"
    )
    lengths = file.message_type.add(name="Lengths")  # query.Row, merged
    lengths.field.add(name="lengths", number=1, type=F.TYPE_SINT64, label=F.LABEL_REPEATED)
    # Declared, and singular: each row's values replace the previous row's, so serializing the
    # merged image copies one row's values (left unknown, it would copy all of them).
    lengths.field.add(name="values", number=2, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    changes = file.message_type.add(name="Changes")  # every RowChange merged into one
    for name, number in (("before", 1), ("after", 2)):
        changes.field.add(
            name=name,
            number=number,
            type=F.TYPE_MESSAGE,
            label=F.LABEL_OPTIONAL,
            type_name=".rowwire_view.Lengths",
        )
    event = file.message_type.add(name="RowEvent")
    event.field.add(
        name="row_changes",
        number=2,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".rowwire_view.Changes",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls: type[message.Message] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("rowwire_view.RowEvent")
    )
    return cls


_RowEventView = _view_classes()


@dataclass(frozen=True)
class Images:
    """One image kind (before or after) of every row of a batch.

    ``lengths[i, j]`` is column ``j``'s byte length in row ``i`` (-1 for NULL, and for every
    column of a row without this image); ``starts[i]`` is where row ``i``'s values begin in the
    batch buffer (for a row without the image, a position between its neighbours' values, so
    that ``starts`` plus value sizes never go backwards).
    """

    present: Bools
    lengths: Ints
    starts: I64
    sizes: I64  # bytes of each row's values (0 for a row without the image)


@dataclass(frozen=True)
class LocatedRows:
    """The rows of a batch of serialized RowEvents: ``buffer`` is the events concatenated
    (followed by a few padding bytes)."""

    buffer: bytes
    rows: int
    before: Images | None  # None: no row has a before image (inserts)
    after: Images | None  # None: no row has an after image (deletes)
    block_has_before: tuple[bool, ...]
    block_has_after: tuple[bool, ...]


def varint_at(data: bytes, pos: int, max_bytes: int = _MAX_VARINT) -> tuple[int, int]:
    """(value, position after it) of one varint; per event only, never per row."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 7 * max_bytes:
            raise ValueError("varint too long")


def _first_record(data: bytes) -> int:
    """Offset of the first ``row_changes`` record: after ``table_name``, which sorts first."""
    if data[:1] == bytes([_TAG_1]):
        size, pos = varint_at(data, 1)
        return pos + size
    return 0


def _packed(serialized: bytes) -> bytes:
    """The packed varints of a serialized ``Lengths`` view (empty when it has none).

    The runtime writes fields in number order: the packed lengths, if any, come first. Should
    that ever differ, the lengths read as absent and the layout proof of :func:`locate_rows`
    fails: no wrong guess.
    """
    if serialized[:1] != bytes([_TAG_1]):
        return b""
    size, pos = varint_at(serialized, 1)
    return serialized[pos : pos + size]


def _varint_count(packed: bytes) -> int:
    return len(packed) - len(packed.translate(None, _LOW_BYTES))


def _decode_varints(packed: bytes) -> tuple[Ints, I64 | None] | None:
    """Zigzag-decoded sint64 values and the byte size of each (None: all one byte), or None
    if the bytes are not a sequence of complete varints."""
    raw = np.frombuffer(packed, dtype=np.uint8)
    if raw.size == 0 or raw[-1] >= 0x80:
        return None
    if int(raw.max()) < 0x80:
        # The common case, every length from -64 to 63: one byte each, decoded in int8
        # (a tenth of the memory traffic of int64).
        small = raw.view(np.int8)
        return (small >> 1) ^ -(small & 1), None
    ends = np.flatnonzero(raw < 0x80)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = (ends - starts + 1).astype(np.int64)
    if int(sizes.max()) > 9:  # 63 bits at most: beyond that it is not a length
        return None
    shift = (np.arange(raw.size) - np.repeat(starts, sizes)) * 7
    parts = (raw & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    u = np.add.reduceat(parts, starts).astype(np.int64)
    return (u >> 1) ^ -(u & 1), sizes


def _vsize(value: I64) -> I64:
    """Bytes of the varint encoding of each (non-negative) value."""
    size = np.ones(value.shape, np.int64)
    top = int(value.max()) if value.size else 0
    for bits in (7, 14, 21, 28):
        if top < (1 << bits):
            break
        size += value >= (1 << bits)
    return size


def _varint_ok(buf: npt.NDArray[np.uint8], pos: I64, value: I64, size: I64) -> bool:
    """True when the varint at each ``pos`` of ``buf`` encodes exactly ``value`` (``size`` bytes)."""
    if pos.size == 0:
        return True
    if int(size.max()) == 1:  # the common case: one byte, the value itself
        return bool(np.array_equal(buf[pos], value))
    rest = value
    for k in range(int(size.max())):
        more = size > k + 1
        expect = (rest & 0x7F) | (more * 0x80)
        if not np.all((size <= k) | (buf[pos + k] == expect)):
            return False
        rest = rest >> 7
    return True


def _field_ok(buf: npt.NDArray[np.uint8], at: I64, tag: int, length: I64) -> I64 | None:
    """Proves a length-delimited field (``tag``, ``length``) at each ``at``; returns where each
    payload begins."""
    if not np.all(buf[at] == tag):
        return None
    if length.size == 0 or int(length.max()) < 0x80:  # one-byte lengths: no size arrays
        return at + 2 if np.array_equal(buf[at + 1], length) else None
    size = _vsize(length)
    return at + 1 + size if _varint_ok(buf, at + 1, length, size) else None


def _row_sums(matrix: Ints) -> I64:
    """Per-row sums, one column at a time (numpy sums a short axis ~5x slower)."""
    out = matrix[:, 0].astype(np.int64)
    for j in range(1, matrix.shape[1]):
        out += matrix[:, j]
    return out


@dataclass(frozen=True)
class _Image:
    """One image kind over the rows that have it (compact: ``rows`` indexes the batch)."""

    rows: I64 | None  # None: every row of the batch has it
    lengths: Ints  # (len(rows), columns)
    row_size: I64  # serialized query.Row
    packed: I64  # its packed lengths
    values: I64  # its values
    field_size: I64  # tag + length + Row


def _image(packed_parts: list[bytes], flags: list[bool], counts: I64, columns: int) -> _Image | bool | None:
    """Decoded lengths of one image kind; None when no row has it, False when malformed."""
    if not any(flags):
        return None
    decoded = _decode_varints(b"".join(p for p, f in zip(packed_parts, flags, strict=True) if f))
    if decoded is None:
        return False
    values, sizes = decoded
    lengths = values.reshape(-1, columns)
    rows = None if all(flags) else np.flatnonzero(np.repeat(np.asarray(flags, dtype=bool), counts))
    if lengths.shape[0] != (int(counts.sum()) if rows is None else rows.size):
        return False
    if sizes is None:
        packed = np.full(lengths.shape[0], columns, np.int64)
    else:
        packed = _row_sums(sizes.reshape(-1, columns))
    value_bytes = _row_sums(np.maximum(lengths, 0))
    row_size = (
        1 + _vsize(packed) + packed + np.where(value_bytes > 0, 1 + _vsize(value_bytes) + value_bytes, 0)
    )
    return _Image(rows, lengths, row_size, packed, value_bytes, 1 + _vsize(row_size) + row_size)


def _prove_image(buf: npt.NDArray[np.uint8], at: I64, tag: int, img: _Image) -> I64 | None:
    """Proves the image field and its Row at each ``at``; returns where the values begin."""
    row_at = _field_ok(buf, at, tag, img.row_size)
    if row_at is None:
        return None
    packed_at = _field_ok(buf, row_at, _TAG_1, img.packed)
    if packed_at is None:
        return None
    after_packed = packed_at + img.packed
    has_values = img.values > 0
    if has_values.all():
        starts = _field_ok(buf, after_packed, _TAG_2, img.values)
    else:
        starts = after_packed.copy()
        found = _field_ok(buf, after_packed[has_values], _TAG_2, img.values[has_values])
        if found is not None:
            starts[has_values] = found
        else:
            starts = None
    # No check that the values end where the Row does: the Row's length, proven above, is the
    # predicted one, and the prediction ends with these values.
    return starts


def _full(img: _Image, total: int, columns: int, positions: I64, starts: I64) -> Images:
    """The image over every row of the batch (absent rows: NULL columns, no bytes)."""
    if img.rows is None:
        return Images(np.ones(total, dtype=bool), img.lengths, starts, img.values)
    present = np.zeros(total, dtype=bool)
    present[img.rows] = True
    lengths = np.full((total, columns), -1, dtype=img.lengths.dtype)
    lengths[img.rows] = img.lengths
    full_starts = positions.copy()
    full_starts[img.rows] = starts
    sizes = np.zeros(total, dtype=np.int64)
    sizes[img.rows] = img.values
    return Images(present, lengths, full_starts, sizes)


def locate_rows(events: Sequence[bytes], counts: Sequence[int], columns: int) -> LocatedRows | None:
    """The rows of serialized RowEvents of one table version with ``columns`` columns.

    ``counts[k]`` is the number of row changes of ``events[k]`` (``len(row_changes)``). None
    when any event does not have exactly the layout this module can prove (see the module
    docstring): decode those with the per-row decoder instead.
    """
    if columns <= 0 or len(events) != len(counts):
        return None
    packed: tuple[list[bytes], list[bytes]] = ([], [])  # per image kind (before, after)
    flags: tuple[list[bool], list[bool]] = ([], [])
    firsts: list[int] = []
    ends: list[int] = []
    offset = 0
    view = _RowEventView()
    try:
        for data, n in zip(events, counts, strict=True):
            view.ParseFromString(data)
            changes = view.row_changes  # type: ignore[attr-defined]
            for kind, image in enumerate((changes.before, changes.after)):
                run = _packed(image.SerializeToString())
                count = _varint_count(run)
                if count not in (0, n * columns):
                    return None  # a mixed event (inserts with updates...), or rows of another width
                packed[kind].append(run)
                flags[kind].append(count > 0)
            firsts.append(offset + _first_record(data))
            offset += len(data)
            ends.append(offset)
    except (ValueError, IndexError, message.DecodeError):
        return None

    counts_arr = np.asarray(counts, dtype=np.int64)
    total = int(counts_arr.sum())
    images = [_image(packed[k], flags[k], counts_arr, columns) for k in (0, 1)]
    if images[0] is False or images[1] is False:
        return None
    before, after = (img if isinstance(img, _Image) else None for img in images)

    # Predicted size of each record: tag, length, RowChange (before and after image fields).
    change = np.zeros(total, np.int64)
    for img in (before, after):
        if img is not None:
            if img.rows is None:
                change += img.field_size
            else:
                change[img.rows] += img.field_size
    change_size = _vsize(change)
    record = 1 + change_size + change

    # Records sit back to back from each event's first one.
    if len(counts) == 1:
        rec_start = firsts[0] + np.cumsum(record) - record
        per_block = [int(record.sum())]
    else:
        block_of_row = np.repeat(np.arange(len(counts)), counts_arr)
        cum = np.cumsum(record)
        per_block_arr = np.bincount(block_of_row, record, len(counts)).astype(np.int64)
        per_block = per_block_arr.tolist()
        shift = np.asarray(firsts, dtype=np.int64) - (np.cumsum(per_block_arr) - per_block_arr)
        rec_start = cum - record + shift[block_of_row]
    # Every record's tag and length, so the records are exactly where predicted; there are
    # len(row_changes) of them, so none is left over.
    if any(first + size > end for first, size, end in zip(firsts, per_block, ends, strict=True)):
        return None
    # One copy of the events, padded for the varint reads; the Arrow arrays share it.
    blob = b"".join([*events, _PAD])
    buf = np.frombuffer(blob, dtype=np.uint8)
    if not (np.all(buf[rec_start] == _TAG_2) and _varint_ok(buf, rec_start + 1, change, change_size)):
        return None
    pos = rec_start + 1 + change_size
    located: list[Images | None] = []
    for tag, img in ((_TAG_1, before), (_TAG_2, after)):
        if img is None:
            located.append(None)
            continue
        at = pos if img.rows is None else pos[img.rows]
        starts = _prove_image(buf, at, tag, img)
        if starts is None:
            return None
        located.append(_full(img, total, columns, pos, starts))
        if img.rows is None:
            pos = pos + img.field_size
        else:
            pos = pos.copy()
            pos[img.rows] += img.field_size
    return LocatedRows(
        buffer=blob,
        rows=total,
        before=located[0],
        after=located[1],
        block_has_before=tuple(flags[0]),
        block_has_after=tuple(flags[1]),
    )
