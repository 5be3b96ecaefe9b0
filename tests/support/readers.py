"""Delta tables read by the readers a user queries them with, besides Spark: delta-rs (the
``deltalake`` package) and Polars (on delta-rs). Each must read a table the merge wrote with the
defaults, and see what Spark sees, row for row and value for value (the tests compare Spark's
rows with ``SELECT *``). A table written with a reader-locking feature (``table_features``) is
refused by them, with the error ``docs/reading-the-tables.md`` quotes. So is a table with column
mapping, by Polars; delta-rs's Arrow reader reads it wrong (below).
"""

from __future__ import annotations

import math
import re
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


def reader_types(path: str | Path) -> dict[str, tuple[str, str]]:
    """Each column's type as delta-rs gives it (an Arrow type) and as Polars gives it (a dtype)."""
    import polars as pl
    from deltalake import DeltaTable

    arrow = DeltaTable(str(path)).to_pyarrow_table().schema
    polars = pl.read_delta(str(path)).schema
    return {f.name: (str(f.type), str(polars[f.name])) for f in arrow}


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


def delta_rs_sql_rows(path: str | Path) -> list[dict[str, Any]]:
    """The table through delta-rs's SQL engine (``QueryBuilder``, DataFusion), not its Arrow reader."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    batches = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t").read_all()
    return list(pa.table(batches).to_pylist())


POLARS_REFUSES_COLUMN_MAPPING = (
    "delta table requires reader version 2 (column mapping), which polars does not support"
)


def renamed_physically(path: str | Path) -> set[str]:
    """The columns whose data files name them otherwise (column mapping's ``col-<uuid>``)."""
    from deltalake import DeltaTable

    return {
        f.name
        for f in DeltaTable(str(path)).schema().fields
        if f.metadata.get("delta.columnMapping.physicalName", f.name) != f.name
    }


def assert_column_mapped_table_reads_as_documented(what: str, path: str | Path, spark: Any = None) -> None:
    """A table with column mapping (``name``), as docs/reading-the-tables.md says: delta-rs's SQL
    engine sees Spark's rows; its Arrow reader (``to_pyarrow_table``, ``to_pandas``; delta-rs 1.6)
    reads each column whose physical name is not its name (one added after mapping was on) as
    NULL in every row, silently; Polars refuses the table."""
    import pytest

    seen = spark_rows(path, spark)
    want = _rows(seen)
    renamed = renamed_physically(path)
    nulled = _rows([{k: None if k in renamed else v for k, v in r.items()} for r in seen])
    for reader, read, expected in (
        ("delta-rs SQL", delta_rs_sql_rows, want),
        ("delta-rs to_pyarrow_table", delta_rs_rows, nulled),
    ):
        got = _rows(read(path))
        assert got == expected, (
            f"{what}: {reader} (columns {sorted(renamed)} physically renamed): only expected "
            f"{list(expected - got)[:3]}; only {reader}: {list(got - expected)[:3]}; if delta-rs "
            "now reads them, update docs/reading-the-tables.md"
        )
    with pytest.raises(Exception, match=re.escape(POLARS_REFUSES_COLUMN_MAPPING)):
        polars_rows(path)
