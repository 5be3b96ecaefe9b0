"""A raw block (one ROW event's rows, still serialized) and the staged metadata columns of the
rows located in a batch of them: ``_op``, ``_keyspace``, ``_shard``, ``_commit_ts``, ``_seq``.

Each column is one value per block repeated over the block's rows, so it is built from the
blocks and their row counts, never row by row (:class:`~.buffer.RowBuffer` adds the images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_vitess.decoding.events import RawRows, operation_of
from airflow_provider_vitess.decoding.rowwire import LocatedRows


@dataclass(frozen=True, slots=True)
class RawBlock:
    """One ROW event's rows, as added by the stager's ``add_rows``."""

    rows: RawRows
    keyspace: str
    shard: str
    commit_ts: int
    first_seq: int  # seq of its first row; the others follow one by one


def meta_arrays(located: LocatedRows, blocks: list[RawBlock], counts: Any) -> list[pa.Array]:
    """The metadata columns of ``located`` (rows of ``blocks``, ``counts[k]`` of block k), in
    the staged schema's order: op, keyspace, shard, commit_ts, seq."""
    images = zip(located.block_has_before, located.block_has_after, strict=True)
    ops = [operation_of(before, after).value for before, after in images]
    out = [
        _repeat_per_block(ops, counts, pa.string()),
        _repeat_per_block([b.keyspace for b in blocks], counts, pa.string()),
        _repeat_per_block([b.shard for b in blocks], counts, pa.string()),
        _repeat_per_block([b.commit_ts for b in blocks], counts, pa.int64()),
    ]
    first = np.array([b.first_seq for b in blocks], dtype=np.int64)
    starts = np.cumsum(counts) - counts
    out.append(pa.array(np.repeat(first - starts, counts) + np.arange(located.rows, dtype=np.int64)))
    return out


def _repeat_per_block(values: list[Any], counts: Any, type_: pa.DataType) -> pa.Array:
    """``values[k]`` repeated ``counts[k]`` times: a ``pa.repeat`` when they are all equal."""
    rows = int(counts.sum())
    if values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], type_), rows)
    distinct = list(dict.fromkeys(values))
    codes = np.repeat(np.array([distinct.index(v) for v in values], dtype=np.int32), counts)
    return pa.array(distinct, type=type_).take(pa.array(codes))
