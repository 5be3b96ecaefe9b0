"""Delta tables read by the readers a user queries them with, besides Spark: delta-rs (the
``deltalake`` package) and Polars (on delta-rs). Each must read a table the merge wrote with the
defaults, and see what Spark sees, row for row and value for value (the tests compare Spark's
rows with ``SELECT *``). A table written with a reader-locking feature (``table_features``) is
refused by them, with the error ``docs/reading-the-tables.md`` quotes.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.support.delta_check import _plain, spark_session


def _value(value: Any) -> Any:
    """One value as the readers agree on it: an instant as naive UTC (Spark gives naive times in
    its session zone, UTC here; Arrow gives aware ones), bytes as bytes, NaN as a marker."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return _plain(value)


def _rows(dicts: list[dict[str, Any]]) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(tuple(sorted((k, _value(v)) for k, v in d.items())) for d in dicts)


def spark_rows(path: str | Path, spark: Any = None) -> list[dict[str, Any]]:
    df = (spark or spark_session()).read.format("delta").load(str(path))
    return [r.asDict() for r in df.collect()]


def delta_rs_rows(path: str | Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return list(DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def polars_rows(path: str | Path) -> list[dict[str, Any]]:
    import polars as pl

    return list(pl.read_delta(str(path)).to_dicts())


def assert_readers_see_what_spark_sees(what: str, path: str | Path, spark: Any = None) -> None:
    """delta-rs and Polars read ``path`` (no reader feature they lack) and see Spark's rows."""
    want = _rows(spark_rows(path, spark))
    for reader, read in (("delta-rs", delta_rs_rows), ("Polars", polars_rows)):
        got = _rows(read(path))
        missing, extra = want - got, got - want
        assert not missing and not extra, (
            f"{what}: {reader} reads {sum(got.values())} rows, Spark {sum(want.values())}; "
            f"only Spark: {list(missing)[:3]}; only {reader}: {list(extra)[:3]}"
        )
