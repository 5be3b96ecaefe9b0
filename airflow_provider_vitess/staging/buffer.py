"""The row buffer of one table version: Python rows in, Arrow record batches out (pure, no I/O).

Rows arrive already decoded (tuples of Python values). The hot path (millions of rows per
window) is the stager's ``add_change``, which extends :attr:`RowBuffer.flat` by the row's 7
slots (op, keyspace, shard, commit_ts, seq, after image, before key) and does no per-value work.
A flat list rather than a list of row tuples: retained tuples holding other containers stay
tracked by the cyclic GC, whose collections then rescan them all, which cost more than the
staging itself (800 versus 130 ns per row).

:meth:`RowBuffer.to_batch` cuts the list into columns with slices (``flat[i::7]``), transposes
the images with ``map(itemgetter(j))`` and builds one Arrow array per column; a column constant
over the batch (one shard, all inserts, NULL before images) is a ``pa.repeat``.

Memory: the Python footprint is estimated by sampling a few rows now and then
(:meth:`RowBuffer.sample`, ``sys.getsizeof``), never per row; Arrow batches are counted exactly
(``nbytes``). The caller (the stager) decides when to convert and when to write.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa

from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.manifest import TableSchema
from airflow_provider_vitess.vstream.events import Operation

W = 7  # slots per row in the flat buffer: op, keyspace, shard, commit_ts, seq, after, before
_CHECK_MAX_ROWS = 4096  # rows between two footprint samples, at most
_SAMPLES = 4
_ROW_OVERHEAD = W * 8 + 16  # the row's list slots, roughly
_AFTER = 5  # slot of the after image


def _row_size(after: Any, before: Any) -> int:
    size = _ROW_OVERHEAD
    for image in (after, before):
        if isinstance(image, tuple):
            size += sys.getsizeof(image) + sum(map(sys.getsizeof, image))
        elif image is not None:
            size += sys.getsizeof(image)
    return size


class RowBuffer:
    """Rows of one table version (one schema), and the Arrow batches made of them."""

    def __init__(self, table: str, schema: TableSchema) -> None:
        self.table = table
        self.schema = schema
        self.schema_json = schema.to_json()
        fields = schema.fields()
        self.arrow_schema = arrow_types.staged_schema(table, fields, schema.key_columns)
        names = schema.names
        n = len(names)
        idx = [names.index(k) for k in schema.key_columns]
        # What add_change stores as the before image: the whole row, one value, or a tuple.
        self.key_all = idx == list(range(n))
        self.key_single = len(idx) == 1 and not self.key_all
        self.key_of: Callable[[tuple[Any, ...]], Any] = itemgetter(*idx) if idx else (lambda row: ())
        self.null_after: tuple[None, ...] = (None,) * n
        self.null_before: Any = None if self.key_single else (None,) * len(idx)
        self.n_columns = n
        self._after_getters = [itemgetter(j) for j in range(n)]
        self._before_getters = [itemgetter(j) for j in range(len(idx))]
        # Parquet dictionaries pay off only on repeated values (and cost 3x the write time).
        self.dictionary_columns = [arrow_types.OP, arrow_types.KEYSPACE, arrow_types.SHARD] + [
            f.name for f in fields if f.type in arrow_types.FEW_VALUE_TYPES
        ]
        self.flat: list[Any] = []  # W slots per row
        self.next_check = W  # len(flat) at which add_change calls sample()
        self.py_bytes = 0  # estimate for the rows sampled so far
        self._checked = 0  # slots already counted in py_bytes
        self.batches: list[pa.RecordBatch] = []
        self.arrow_bytes = 0
        # Counts of the rows converted since reset_counts(): the part file's share.
        self.op_counts: Counter[str] = Counter()
        self.keyspaces: dict[str, None] = {}

    @property
    def buffered(self) -> int:
        return self.py_bytes + self.arrow_bytes

    def sample(self, py_limit: int) -> int:
        """Estimate the rows added since the last sample; returns the bytes added.

        Sets :attr:`next_check` halfway to ``py_limit``, so the estimate overshoots the bound
        by half at most (for rows alike in size).
        """
        flat = self.flat
        n = len(flat)
        new = (n - self._checked) // W
        if new <= 0:
            return 0
        first = self._checked + _AFTER
        step = W * max(1, new // _SAMPLES)
        afters = flat[first:n:step][:_SAMPLES]
        befores = flat[first + 1 : n : step][:_SAMPLES]
        per_row = sum(map(_row_size, afters, befores)) // len(afters)
        added = per_row * new
        self.py_bytes += added
        self._checked = n
        room = max(0, py_limit - self.py_bytes) // max(per_row, 1)
        self.next_check = n + W * max(1, min(_CHECK_MAX_ROWS, room // 2))
        return added

    def to_batch(self) -> int:
        """Turn the Python rows into one Arrow record batch; returns the change in buffered bytes.

        Raises :class:`StagingError` naming the table, column, row and value that Arrow refuses.
        """
        flat = self.flat
        if not flat:
            return 0
        ops, keyspaces, shards, tss, seqs, afters, befores = (flat[i::W] for i in range(W))
        # Transpose with map(itemgetter): 4x faster than zip(*rows), which makes one tracked
        # iterator per row and so sets off the cyclic GC. Widths are checked first (C-level).
        if set(map(len, afters)) - {self.n_columns} or (
            not self.key_single and set(map(len, befores)) - {len(self.schema.key_columns)}
        ):
            raise self._width_error(afters, befores)
        after_cols = [list(map(get, afters)) for get in self._after_getters]
        if self.key_single:
            before_cols = [befores]
        else:
            before_cols = [list(map(get, befores)) for get in self._before_getters]
        schema = self.arrow_schema
        n = len(ops)
        first_before = len(arrow_types.META_FIELDS) + self.n_columns
        arrays = []
        for i, values in enumerate((ops, keyspaces, shards, tss, seqs, *after_cols, *before_cols)):
            f = schema.field(i)

            def describe(row: int, name: str = f.name) -> str:
                return (
                    f"table {self.table!r} column {name!r} (keyspace {keyspaces[row]!r}, shard "
                    f"{shards[row]!r}, seq {seqs[row]})"
                )

            # Often constant in a batch: metadata (one shard; all inserts in a copy phase) and
            # the before image (all NULL for inserts).
            constant = i < 4 or i >= first_before
            arrays.append(arrow_types.to_array(values, f.type, describe, maybe_constant=constant))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        op_counts = {ops[0]: n} if ops.count(ops[0]) == n else Counter(ops)
        for op, count in op_counts.items():
            self.op_counts[op.value if isinstance(op, Operation) else str(op)] += count
        one_keyspace = keyspaces.count(keyspaces[0]) == n
        for ks in (keyspaces[0],) if one_keyspace else dict.fromkeys(keyspaces):
            self.keyspaces.setdefault(ks, None)
        self.batches.append(batch)
        size: int = batch.nbytes
        delta = size - self.py_bytes
        self.arrow_bytes += size
        self.flat = []
        self.py_bytes = self._checked = 0
        self.next_check = W
        return delta

    def take_batches(self) -> pa.Table | None:
        """The converted rows as one table (a row group), emptying the batches."""
        if not self.batches:
            return None
        table = pa.Table.from_batches(self.batches, schema=self.arrow_schema)
        self.batches = []
        self.arrow_bytes = 0
        return table

    def reset_counts(self) -> None:
        self.op_counts = Counter()
        self.keyspaces = {}

    def clear(self) -> None:
        self.flat, self.batches = [], []
        self.py_bytes = self.arrow_bytes = self._checked = 0
        self.next_check = W

    def _width_error(self, afters: Sequence[Any], befores: Sequence[Any]) -> StagingError:
        want = self.n_columns
        names = list(self.schema.names)
        for i, image in enumerate(afters):
            if len(image) != want:
                return StagingError(
                    f"table {self.table!r}: an after image has {len(image)} values but the schema has "
                    f"{want} columns {names} (row {i} of the batch)"
                )
        keys = len(self.schema.key_columns)
        for i, image in enumerate(befores):
            if len(image) != keys:
                # Only a whole-row before image (no key columns given) can have the wrong width.
                return StagingError(
                    f"table {self.table!r}: a before image has {len(image)} values but the schema has "
                    f"{want} columns {names} (row {i} of the batch)"
                )
        return StagingError(f"table {self.table!r}: row images do not match the schema")
