"""Arrow columns straight from the bytes of VStream rows (pure, no I/O).

:func:`airflow_provider_vitess.decoding.rowwire.locate_rows` says where each row's values lie
in a buffer of serialized ROW events. Here that buffer becomes one Arrow binary array whose
elements are, row after row, the bytes between two rows' values (never read) and then each
column's value: built zero-copy (``pa.Array.from_buffers``, offsets by ``cumsum``, validity
from ``length >= 0``). One ``take`` per column gathers that column's values, and a vectorised
cast turns the text into the staged Arrow type.

A cast is used only where its result is *exactly* what the per-row decoder
(:func:`airflow_provider_vitess.decoding.values.converter_for`) followed by ``pa.array`` gives:

* integers: text of ASCII digits and ``-`` only (Arrow would also read ``0x1f``, which ``int()``
  refuses, and ``int()`` reads `` 7`` and ``+7``, which Arrow refuses);
* DECIMAL: digits, ``-`` and ``.`` only (Arrow would also read ``1e2``);
* DATE / DATETIME / TIMESTAMP: exactly vtgate's shape (``YYYY-MM-DD[ hh:mm:ss[.f{1,6}]]``, one
  width per column and batch) and a year other than 0000 (Arrow reads year 0, Python refuses
  it); Arrow then refuses the same impossible dates and times Python does (Feb 30, 24:00:00,
  second 60), which the unit tests check value by value;
* text: Arrow's UTF-8 validation refuses what strict ``bytes.decode`` refuses;
* bytes: no conversion at all.

Anything else (other types, or a value outside those shapes, or a cast Arrow refuses) converts
that column of the batch with the per-row converters, so values and errors stay those of
:mod:`airflow_provider_vitess.decoding.values`; a zero or invalid date (the decoder's text) then
becomes what the table's zero-date policy says (:mod:`.zero_dates`), in :meth:`ColumnPlan.to_array`,
which the decoded-rows path (:mod:`.buffer`) calls too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding import values
from airflow_provider_vitess.decoding.rowwire import Images
from airflow_provider_vitess.exceptions import ValueDecodeError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicy, replace_invalid

Describe = Callable[[int], str]

_INT32_MAX = 2**31 - 1
_INT_CHARS = b"0123456789-"
_DECIMAL_CHARS = _INT_CHARS + b"."
# vtgate's text of DATE and DATETIME: "d" a digit, anything else itself.
_DATE_SHAPE = b"dddd-dd-dd"
_DATETIME_SHAPE = b"dddd-dd-dd dd:dd:dd"
_DATETIME_WIDTHS = frozenset({19, *range(21, 27)})  # no fraction, or 1 to 6 digits
_DATE_WIDTHS = frozenset({len(_DATE_SHAPE)})
_DIGITS_TO_D = bytes.maketrans(b"0123456789", b"dddddddddd")


class ColumnPlan:
    """How one column's text becomes its staged Arrow array."""

    __slots__ = ("_repair", "arrow_type", "convert_one", "field", "kind", "name", "table")

    def __init__(
        self,
        field: query_pb2.Field,
        table: str,
        zero_dates: ZeroDatePolicy = ZeroDatePolicy.NULL,
        convert: Callable[[bytes], Any] | None = None,
    ) -> None:
        self.field = field
        self.name = field.name
        self.table = table
        self.arrow_type = arrow_types.arrow_type(field)
        # ``convert``: a converter of the raw bytes instead of the type's (a hashed column,
        # staging/hashing.py): then every value of the column goes through it, row by row.
        self.convert_one = convert or values.converter_for(field)
        self.kind = "python" if convert is not None else self._kind()
        t = self.arrow_type
        self._repair: arrow_types.Repair | None = None
        if pa.types.is_date(t) or pa.types.is_timestamp(t):
            self._repair = functools.partial(
                replace_invalid,
                policy=zero_dates,
                table=table,
                column_type=arrow_types.type_name(field.type),
                is_date=pa.types.is_date(t),
            )

    def _kind(self) -> str:
        # Decided by the per-row converter itself, so both paths always agree on the mapping.
        conv, t = self.convert_one, self.arrow_type
        if conv is values.raw_converter and pa.types.is_binary(t):
            return "binary"
        if conv in (values.utf8_converter, values.latin1_converter) and pa.types.is_string(t):
            return "text"
        if conv is int and pa.types.is_integer(t):
            return "int"
        if conv is values.decimal_converter and pa.types.is_decimal(t):
            return "decimal"
        if conv is values.date_converter and pa.types.is_date32(t):
            return "date"
        if conv is values.datetime_converter and pa.types.is_timestamp(t):
            return "datetime"
        return "python"

    def convert(self, column: pa.Array, lengths: npt.NDArray[np.int64], describe: Describe) -> pa.Array:
        """``column``: the values' bytes (binary, NULLs where ``lengths`` < 0)."""
        if self.kind != "python":
            try:
                fast = getattr(self, "_" + self.kind)(column, lengths)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
                fast = None
            if fast is not None:
                return fast
        return self.per_row(column, describe)

    def per_row(self, column: pa.Array, describe: Describe) -> pa.Array:
        """The per-row decoder's values, through the same ``pa.array`` as decoded rows."""
        raw: list[bytes | None] = column.to_pylist()
        convert = self.convert_one
        try:
            out = [None if v is None else convert(v) for v in raw]
        except Exception:
            raise self._decode_error(raw) from None
        return self.to_array(out, describe)

    def to_array(self, decoded: list[Any], describe: Describe, *, maybe_constant: bool = False) -> pa.Array:
        """Decoded values of this column as its staged array; a zero or invalid date becomes
        what the table's zero-date policy says (only looked for when Arrow refuses a value)."""
        return arrow_types.to_array(
            decoded, self.arrow_type, describe, maybe_constant=maybe_constant, repair=self._repair
        )

    def _decode_error(self, raw: list[bytes | None]) -> ValueDecodeError:
        where = f"table {self.table!r}: " if self.table else ""
        for v in raw:
            try:
                values.decode_value(self.field, v)
            except ValueDecodeError as exc:
                return ValueDecodeError(f"{where}{exc}")
        return ValueDecodeError(f"{where}column {self.name!r}: cannot decode a value")

    # -- the vectorised conversions; None means "not provably exact: use the per-row path" --

    def _binary(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array:
        return column if column.type == self.arrow_type else column.cast(self.arrow_type)

    def _text(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array:
        return pc.cast(column, self.arrow_type)  # refuses invalid UTF-8 (ArrowInvalid)

    def _int(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array | None:
        if not _numeric_text(column, lengths, _INT_CHARS):
            return None
        return pc.cast(_as_string(column), self.arrow_type)

    def _decimal(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array | None:
        if not _numeric_text(column, lengths, _DECIMAL_CHARS):
            return None
        return pc.cast(_as_string(column), self.arrow_type)

    def _date(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array | None:
        if not _shaped(column, lengths, _DATE_WIDTHS, _DATE_SHAPE):
            return None
        return pc.cast(_as_string(column), self.arrow_type)

    def _datetime(self, column: pa.Array, lengths: npt.NDArray[np.int64]) -> pa.Array | None:
        if not _shaped(column, lengths, _DATETIME_WIDTHS, _DATETIME_SHAPE):
            return None
        naive = pc.cast(_as_string(column), pa.timestamp("us"))
        # TIMESTAMP: the decoder's naive values are UTC, and Arrow takes naive values as UTC.
        return naive if naive.type == self.arrow_type else naive.cast(self.arrow_type)


def _as_string(column: pa.Array) -> pa.Array:
    # Same layout; only read by casts that accept ASCII digits and punctuation.
    return column.view(pa.large_string() if pa.types.is_large_binary(column.type) else pa.string())


def _numeric_text(column: pa.Array, lengths: npt.NDArray[np.int64], allowed: bytes) -> bool:
    """Only ``allowed`` bytes and no empty value (Arrow's parser then refuses a misplaced
    ``-`` or ``.`` as Python does: the unit tests pin that)."""
    if np.any(lengths == 0):
        return False
    # bytes.translate deletes the allowed bytes at C speed (~4x a numpy lookup table).
    return not _value_bytes(column).translate(None, allowed)


def _value_bytes(column: pa.Array) -> bytes:
    """A binary array's values, back to back (its slice of the data buffer)."""
    _, offsets_buf, data = column.buffers()
    if data is None:
        return b""
    large = pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    first, last = int(offsets[column.offset]), int(offsets[column.offset + len(column)])
    values: bytes = data.slice(first, last - first).to_pybytes()
    return values


def _shaped(column: pa.Array, lengths: npt.NDArray[np.int64], widths: frozenset[int], shape: bytes) -> bool:
    """Every value has one width of ``widths`` and the ``shape`` (then ``.`` and digits)."""
    present = lengths[lengths >= 0]
    if present.size == 0:
        return True
    width = int(present[0])
    if width not in widths or np.any(present != width):
        return False
    text = _value_bytes(column)
    pattern = (shape + b".dddddd")[:width] if width > len(shape) else shape
    # Digits to "d" at C speed, then one comparison with the pattern repeated.
    if text.translate(_DIGITS_TO_D) != pattern * present.size:
        return False
    # Year 0000 is not a Python date (the decoder keeps such text); Arrow would accept it. With
    # the shape proven, "0000-" can only be a value's year.
    return b"0000-" not in text


# -- from located rows to binary columns -------------------------------------------------------


def image_columns(buffer: bytes, image: Images, columns: Sequence[int]) -> list[pa.Array]:
    """Binary arrays of the given columns of one image kind, over ``buffer`` (see module doc)."""
    lengths = image.lengths
    rows, width = lengths.shape
    valid = lengths >= 0
    all_valid = bool(valid.all())
    large = len(buffer) > _INT32_MAX
    index_type = np.int64 if large else np.int32
    # Element sizes, row by row: the bytes since the previous row's values, then each value.
    grid = np.empty((rows, width + 1), dtype=index_type)
    grid[:, 0] = image.starts
    grid[1:, 0] -= image.starts[:-1] + image.sizes[:-1]
    grid[:, 1:] = lengths if all_valid else np.where(valid, lengths, 0)
    offsets = np.empty(grid.size + 1, dtype=index_type)
    offsets[0] = 0
    np.cumsum(grid, out=offsets[1:])
    bitmap = None
    if not all_valid:
        flags = np.ones((rows, width + 1), dtype=bool)
        flags[:, 1:] = valid
        bitmap = pa.py_buffer(np.packbits(flags, bitorder="little"))
    elements = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        grid.size,
        [bitmap, pa.py_buffer(offsets), pa.py_buffer(buffer)],
    )
    base = np.arange(rows, dtype=index_type) * (width + 1) + 1
    # An Arrow index array: take() converts a numpy one far more slowly.
    return [elements.take(pa.array(base + j)) for j in columns]
