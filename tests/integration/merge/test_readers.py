"""Tables every engine reads (docs/reading-the-tables.md): with the defaults, a table the merge
writes needs no reader feature, so delta-rs and Polars read it and see exactly what Spark sees,
which is ``SELECT *``; a source column widened (INT -> BIGINT) keeps it so (the table is
rewritten with the wider type). Chosen per table (``table_features``), type widening and
deletion vectors are on from the table's creation, the column is widened in place, and the
readers that do not know those features refuse the table, naming them.

On the real vtgate, merged by the job on local Spark with Delta; read by ``deltalake`` and
``polars`` from PyPI.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import DELETION_VECTORS, TYPE_WIDENING, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess
from tests.support.readers import (
    assert_readers_see_what_spark_sees,
    delta_rs_rows,
    polars_rows,
    reader_types,
)

pytestmark = pytest.mark.integration

TABLE = "readers_items"
LOCKING = {"typeWidening", "deletionVectors"}


def _reader_features(path: Path) -> set[str]:
    from deltalake import DeltaTable

    return set(DeltaTable(str(path)).protocol().reader_features or ())


def test_default_tables_are_read_by_every_reader_and_chosen_features_lock_them(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    hook = wl.hook_for(vitess, "vitess_readers")
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} (id INT NOT NULL PRIMARY KEY, qty INT, price DECIMAL(10,2), "
        "at DATETIME(6), note VARCHAR(20))",
        f"INSERT INTO commerce.{TABLE} VALUES "
        + ", ".join(f"({i}, {i * 10}, {i}.25, '2026-12-0{i} 10:00:00.123456', 'n{i}')" for i in range(1, 6)),
    )
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync_id = f"readers_{uuid.uuid4().hex[:8]}"
    sync = wl.new_sync(hook, store, tmp_path / "stage", sync_id, "commerce", [TABLE])
    spark = spark_session()
    sync.capture(snapshot=True)
    plain, locked = tmp_path / "plain", tmp_path / "locked"

    def plan(root: Path, first: int, last: int | None, features: tuple[str, ...] = ()) -> MergePlan:
        return sync.plan(root, first, last, TargetShape(features=features))

    both = (DELETION_VECTORS, TYPE_WIDENING)
    merge(spark, plan(plain, 0, 1))
    merge(spark, plan(locked, 0, 1, both))
    wl.execute(
        hook,
        f"UPDATE commerce.{TABLE} SET note = 'changed' WHERE id = 2",
        f"DELETE FROM commerce.{TABLE} WHERE id = 3",
        f"ALTER TABLE commerce.{TABLE} MODIFY qty BIGINT",
        f"UPDATE commerce.{TABLE} SET qty = 5000000000 WHERE id = 1",
        f"INSERT INTO commerce.{TABLE} VALUES (6, 6000000000, 6.5, NULL, NULL)",
    )
    sync.capture()
    for root, features in ((plain, ()), (locked, both)):
        merge(spark, plan(root, 1, None, features))
        path = root / TABLE
        wl.assert_equal_to_source(spark, hook, "commerce", TABLE, str(path), ("id",))
        qty = spark.read.format("delta").load(str(path)).schema["qty"].dataType
        assert qty == T.LongType(), (root, qty)

    # The defaults: no reader feature, so every reader reads the table, the widened column too.
    assert not _reader_features(plain / TABLE) & LOCKING, _reader_features(plain / TABLE)
    assert_readers_see_what_spark_sees(TABLE, plain / TABLE, spark)
    assert reader_types(plain / TABLE)["price"] == ("decimal128(10, 2)", "Decimal(precision=10, scale=2)")
    assert _history_operations(spark, plain / TABLE).count("CHANGE COLUMN") == 0  # rewritten, not altered

    # Chosen: both features from the table's creation, the column widened in place; the readers
    # that lack them refuse the table, naming them.
    assert _reader_features(locked / TABLE) >= LOCKING, _reader_features(locked / TABLE)
    assert "CHANGE COLUMN" in _history_operations(spark, locked / TABLE)
    for read in (delta_rs_rows, polars_rows):
        with pytest.raises(Exception, match=r"(?i)typeWidening|deletionVectors") as refused:
            read(locked / TABLE)
        print(f"{read.__name__}: {refused.value}")
    wl.execute(hook, f"DROP TABLE commerce.{TABLE}")


def _history_operations(spark: Any, path: Path) -> list[str]:
    return [r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
