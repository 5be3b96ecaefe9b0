"""The columns of a staged window's rows as the merge job reads them (one table ``id``, ``v``),
for the job tier's local Spark frames: ``SCHEMA`` staged, ``SCHEMA_OUT`` the table's own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql import types as T

from airflow_provider_vitess.merge.job.lookback import SEQ_SHIFT

SCHEMA = T.StructType(
    [
        T.StructField("_op", T.StringType()),
        T.StructField("_shard", T.StringType()),
        T.StructField("_commit_ts", T.LongType()),
        T.StructField("_seq", T.LongType()),
        T.StructField("id", T.LongType()),
        T.StructField("v", T.StringType()),
        T.StructField("_before_id", T.LongType()),
    ]
)
SCHEMA_OUT = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


def numbered(rows: Iterable[tuple[Any, ...]], back: int = 0) -> list[tuple[Any, ...]]:
    """Rows (op, shard, commit second, id, v, before id) of one window as ``SCHEMA`` has them,
    ``_seq`` 1, 2, ... in their order; ``back``: read as the look-back's context of a window that
    many windows later (``_seq`` shifted as ``window_rows.read_window`` shifts it)."""
    return [(op, s, ts, i - back * SEQ_SHIFT, k, v, b) for i, (op, s, ts, k, v, b) in enumerate(rows, 1)]
