"""The row buffer of one table version: rows in, Arrow record batches out (pure, no I/O).

Rows arrive in two forms:

* **raw** (the capture path): whole ROW events still serialized
  (:class:`~airflow_provider_vitess.decoding.events.RawRows`), added by the stager's
  ``add_rows``. :meth:`RowBuffer.to_batch` locates every row's values in a batch of them at once
  (:func:`~airflow_provider_vitess.decoding.rowwire.locate_rows`) and builds each column with
  vectorised, exactness-checked casts (:mod:`.columnar`): no Python object per row or value. An
  event whose layout cannot be proven, or a column whose text is not of a shape a cast reads
  exactly, takes the per-row decoder instead, for that event or column only.
* **decoded** (tuples of Python values), added by ``add_change``, which extends
  :attr:`RowBuffer.flat` by the row's 7 slots (op, keyspace, shard, commit_ts, seq, after image,
  before key) and does no per-value work. A flat list rather than a list of row tuples:
  retained tuples holding other containers stay tracked by the cyclic GC, whose collections then
  rescan them all. ``to_batch`` cuts the list into columns with slices (``flat[i::7]``),
  transposes the images with ``map(itemgetter(j))`` and builds one Arrow array per column.

Either way a column constant over the batch (one shard, all inserts, NULL before images) is a
``pa.repeat``. Rows keep their order: the stager converts pending rows of one form before it
buffers rows of the other.

Memory: raw rows count their exact byte size; decoded rows are estimated by sampling a few rows
now and then (:meth:`RowBuffer.sample`, ``sys.getsizeof``), never per row; Arrow batches are
counted exactly (``nbytes``). The caller (the stager) decides when to convert and when to write.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import Operation, decode_changes, operation_of
from airflow_provider_vitess.decoding.rowwire import LocatedRows, locate_rows
from airflow_provider_vitess.decoding.values import RowDecoder
from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging import arrow_types, raw_blocks
from airflow_provider_vitess.staging.columnar import ColumnPlan, image_columns
from airflow_provider_vitess.staging.manifest import TableSchema
from airflow_provider_vitess.staging.raw_blocks import RawBlock
from airflow_provider_vitess.staging.row_images import absent_columns
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicy

W = 7  # slots per row in the flat buffer: op, keyspace, shard, commit_ts, seq, after, before
_CHECK_MAX_ROWS = 4096  # rows between two footprint samples, at most
_SAMPLES = 4
_ROW_OVERHEAD = W * 8 + 16  # the row's list slots, roughly
_AFTER = 5  # slot of the after image
_BLOCK_OVERHEAD = 200  # bytes of a raw block's Python objects, roughly


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

    def __init__(
        self,
        table: str,
        schema: TableSchema,
        zero_dates: ZeroDatePolicy = ZeroDatePolicy.NULL,
        hashed: Mapping[str, Callable[[bytes], Any]] | None = None,
    ) -> None:
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
        # Hashed columns (staging/hashing.py): their plan converts the raw bytes to the hash, and
        # so does the per-row decoder of this buffer; nothing else ever reads their values.
        self.hashed = dict(hashed or {})
        self.plans = [ColumnPlan(f, table, zero_dates, self.hashed.get(f.name)) for f in fields]
        self._decoder = RowDecoder(fields, table, [p.convert_one for p in self.plans])
        self.key_index = idx
        # The plan of each staged column (None for the metadata ones), in schema order.
        self._staged_plans = [None] * len(arrow_types.META_FIELDS) + self.plans + [self.plans[j] for j in idx]
        self.flat: list[Any] = []  # W slots per row
        # Row number in flat -> the columns its partial after image left out (staging/row_images).
        self.absent: dict[int, list[str]] = {}
        self.blocks: list[RawBlock] = []  # raw rows, in order (see add_block)
        self.raw_bytes = 0
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
        return self.py_bytes + self.raw_bytes + self.arrow_bytes

    def add_block(self, block: RawBlock) -> int:
        """Buffer one ROW event's raw rows; returns the bytes added.

        The caller converts decoded rows first (``to_batch``) so rows keep their order; and a
        decoded row added after raw ones makes ``add_change`` call the stager's check at once
        (``next_check``), which converts both in order.
        """
        self.blocks.append(block)
        added = len(block.rows.data) + _BLOCK_OVERHEAD
        self.raw_bytes += added
        self.next_check = 0
        return added

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
        """Turn the buffered rows into Arrow record batches; returns the change in buffered bytes.

        Raw rows first, then decoded ones (the order they were added in, see :meth:`add_block`).
        Raises :class:`StagingError` naming the table, column, row and value that Arrow refuses,
        and :class:`~airflow_provider_vitess.exceptions.ValueDecodeError` for a row the per-row
        decoder refuses.
        """
        delta = self._raw_to_batches() if self.blocks else 0
        return delta + self._flat_to_batch()

    def _flat_to_batch(self) -> int:
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
                after = afters[row]
                key = befores[row] if after is self.null_after else self.key_of(after)
                return (
                    f"table {self.table!r} column {name!r} (keyspace {keyspaces[row]!r}, shard "
                    f"{shards[row]!r}, seq {seqs[row]}, key {self._key_text(key)})"
                )

            # Often constant in a batch: metadata (one shard; all inserts in a copy phase) and
            # the before image (all NULL for inserts).
            constant = i < 4 or i >= first_before
            plan = self._staged_plans[i]
            if plan is None:
                arrays.append(arrow_types.to_array(values, f.type, describe, maybe_constant=constant))
            else:
                arrays.append(plan.to_array(values, describe, maybe_constant=constant))
        absent, self.absent = self.absent, {}
        arrays.append(
            pa.array([absent.get(i) for i in range(n)], arrow_types.ABSENT_TYPE)
            if absent
            else pa.nulls(n, arrow_types.ABSENT_TYPE)
        )
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

    # -- raw rows ---------------------------------------------------------------------------------

    def _raw_to_batches(self) -> int:
        blocks, self.blocks = self.blocks, []
        removed, self.raw_bytes = self.raw_bytes, 0
        added = 0
        for run in self._located_runs(blocks):
            if isinstance(run, RawBlock):
                added += self._decoded_block(run)
                continue
            located, run_blocks = run
            batch = self._batch(located, run_blocks)
            self.batches.append(batch)
            self.arrow_bytes += batch.nbytes
            added += batch.nbytes
            for block, has_before, has_after in zip(
                run_blocks, located.block_has_before, located.block_has_after, strict=True
            ):
                self.op_counts[operation_of(has_before, has_after).value] += block.rows.n_rows
                self.keyspaces.setdefault(block.keyspace, None)
        self.next_check = len(self.flat) + W
        return added - removed

    def _located_runs(self, blocks: list[RawBlock]) -> list[tuple[LocatedRows, list[RawBlock]] | RawBlock]:
        """The blocks located as one batch; else located one by one, with the blocks whose
        layout cannot be proven left to the per-row decoder (returned as themselves)."""
        width = self.n_columns
        located = locate_rows([b.rows.data for b in blocks], [b.rows.n_rows for b in blocks], width)
        if located is not None:
            return [(located, blocks)]
        out: list[tuple[LocatedRows, list[RawBlock]] | RawBlock] = []
        for block in blocks:
            one = locate_rows([block.rows.data], [block.rows.n_rows], width)
            out.append(block if one is None else (one, [block]))
        return out

    def _decoded_block(self, block: RawBlock) -> int:
        """A block through the per-row decoder (raises its errors), staged as decoded rows;
        returns the Arrow bytes added. Decoded rows already pending came after this block, so
        they are set aside meanwhile."""
        pending = (self.flat, self.py_bytes, self._checked, self.absent)
        self.flat, self.py_bytes, self._checked, self.absent = [], 0, 0, {}
        flat = self.flat
        null_after, null_before, key_all, key_of = (
            self.null_after,
            self.null_before,
            self.key_all,
            self.key_of,
        )
        seq = block.first_seq
        # This buffer's decoder, not the event's: a hashed column decodes to its hash.
        rows = binlogdata_pb2.RowEvent.FromString(block.rows.data).row_changes
        for row, change in enumerate(decode_changes(rows, self._decoder, block.rows.json_columns)):
            before = change.before
            if change.present_columns is not None or change.json_partial_columns:
                left_out = absent_columns(
                    change, self.schema, self.table, self.where(block.keyspace, block.shard, seq)
                )
                if left_out:
                    self.absent[row] = left_out
            flat += (
                change.operation,
                block.keyspace,
                block.shard,
                block.commit_ts,
                seq,
                null_after if change.after is None else change.after,
                null_before if before is None else (before if key_all else key_of(before)),
            )
            seq += 1
        try:
            return self._flat_to_batch()  # py_bytes was 0: the delta is the batch's size
        finally:
            self.flat, self.py_bytes, self._checked, self.absent = pending

    def where(self, keyspace: str, shard: str, seq: int) -> str:
        return f"table {self.table!r} (keyspace {keyspace!r}, shard {shard!r}, seq {seq})"

    def _batch(self, located: LocatedRows, blocks: list[RawBlock]) -> pa.RecordBatch:
        rows = located.rows
        counts = np.array([b.rows.n_rows for b in blocks], dtype=np.int64)
        schema = self.arrow_schema
        describe = self._describer(located, blocks, counts)
        arrays = raw_blocks.meta_arrays(located, blocks, counts)
        for image, indexes in ((located.after, range(self.n_columns)), (located.before, self.key_index)):
            plans = [self.plans[j] for j in indexes]
            if image is None:
                arrays += [pa.nulls(rows, p.arrow_type) for p in plans]
                continue
            columns = image_columns(located.buffer, image, list(indexes))
            for plan, j, column in zip(plans, indexes, columns, strict=True):
                arrays.append(
                    plan.convert(column, image.lengths[:, j], functools.partial(describe, plan.name))
                )
        arrays.append(pa.nulls(rows, arrow_types.ABSENT_TYPE))  # whole images: the layout proves it
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _describer(
        self, located: LocatedRows, blocks: list[RawBlock], counts: Any
    ) -> Callable[[str, int], str]:
        starts = np.cumsum(counts) - counts

        def describe(name: str, row: int) -> str:
            k = int(np.searchsorted(starts, row, side="right")) - 1
            b = blocks[k]
            return (
                f"table {self.table!r} column {name!r} (keyspace {b.keyspace!r}, shard "
                f"{b.shard!r}, seq {b.first_seq + row - int(starts[k])}, "
                f"key {self._key_text(self._located_key(located, row))})"
            )

        return describe

    def _located_key(self, located: LocatedRows, row: int) -> tuple[Any, ...]:
        """The key of one located row (after image, else before), for an error message only."""
        image = located.after
        if image is None or not image.present[row]:
            image = located.before
        if image is None:
            return ()
        lengths = [int(n) for n in image.lengths[row]]
        offsets = np.cumsum([0, *(max(n, 0) for n in lengths)]) + int(image.starts[row])
        out = []
        for j in self.key_index:
            data = located.buffer[offsets[j] : offsets[j] + lengths[j]]
            try:
                out.append(None if lengths[j] < 0 else self.plans[j].convert_one(data))
            except Exception:
                out.append(data)
        return tuple(out)

    def _key_text(self, key: Any) -> str:
        """``key`` (one value or a tuple of them: column values are never tuples) as
        ``{column: value}``."""
        values = key if isinstance(key, tuple) else (key,)
        return repr(dict(zip(self.schema.key_columns, values, strict=False)))

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
        self.flat, self.batches, self.blocks, self.absent = [], [], [], {}
        self.py_bytes = self.arrow_bytes = self.raw_bytes = self._checked = 0
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
