"""The suite's oracle reader (``tests/support/delta_check.py``'s ``table_dicts``: delta-rs where
it reads a table right, else the test SparkSession) gives what Spark gives, value for value: on
a table of the types whose Python values differ between the two (a Delta TIMESTAMP, binary,
decimals, dates), at a past version, and on the tables delta-rs 1.6 must not read (column mapping,
whose columns under physical names its Arrow reader reads as NULL; deletion vectors, which it
refuses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.delta_check import spark_dicts, spark_session, table_dicts

TYPES = (
    "id BIGINT, at TIMESTAMP, wall TIMESTAMP_NTZ, day DATE, amount DECIMAL(12, 2), big DECIMAL(20, 0), "
    "raw BINARY, note STRING, ratio DOUBLE"
)
ROWS = [
    "(1, TIMESTAMP'2026-03-29 01:30:00.123456', TIMESTAMP_NTZ'1000-01-01 00:00:00', DATE'9999-12-31', "
    "12.34, 18446744073709551615, X'00FF', 'a', 0.1)",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(3, TIMESTAMP'1970-01-01 00:00:00', TIMESTAMP_NTZ'2026-12-06 23:59:59.999999', DATE'1000-01-01', "
    "-0.01, 0, X'', '', -1.5)",
]


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def test_delta_rs_reads_each_type_and_version_as_spark_does(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "types")
    spark.sql(f"CREATE TABLE delta.`{path}` ({TYPES}) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {', '.join(ROWS)}")
    spark.sql(f"UPDATE delta.`{path}` SET note = 'changed', at = TIMESTAMP'2026-10-25 01:59:59' WHERE id = 1")
    for version in (None, 1):
        got, want = _by_id(table_dicts(path, version)), _by_id(spark_dicts(spark, path, version))
        assert len(want) == 3 and got == want, (version, got, want)
    assert table_dicts(path)[0]["at"].tzinfo is None


def test_column_mapped_and_deletion_vector_tables_are_read_by_spark(spark: Any, tmp_path: Path) -> None:
    mapped = str(tmp_path / "mapped")
    spark.sql(
        f"CREATE TABLE delta.`{mapped}` (id BIGINT, `a note` STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    spark.sql(f"ALTER TABLE delta.`{mapped}` ADD COLUMNS (added STRING)")
    spark.sql(f"INSERT INTO delta.`{mapped}` VALUES (1, 'x', 'kept')")
    assert table_dicts(mapped) == [{"id": 1, "a note": "x", "added": "kept"}]

    dv = str(tmp_path / "dv")
    spark.sql(f"CREATE TABLE delta.`{dv}` (id BIGINT) USING delta")
    spark.sql(f"ALTER TABLE delta.`{dv}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO delta.`{dv}` SELECT id FROM range(10)")
    spark.sql(f"DELETE FROM delta.`{dv}` WHERE id % 2 = 0")
    assert sorted(r["id"] for r in table_dicts(dv)) == [1, 3, 5, 7, 9]
