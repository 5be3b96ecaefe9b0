"""A look-back through a chain of windows that ended early, read in one scan, in window order.

Windows cut by ``max_events`` did not reach their stop, so the merge of the next one counts the
events of every earlier window of the chain (``merge/job/lookback.py``), and reads those with the
same schema together (``window_rows.read_window``'s ``earlier``). A row read that way must keep
its window's place: a key moved from shard ``-80`` (inserted in window 2, its move's DELETE in
window 3) and deleted on ``80-`` in window 4 is gone only if window 3's DELETE is ``-80``'s last
event, after window 2's INSERT. The two events carry ``_seq`` 1 and 2 in the other order, so the
windows' shifts, not their ``_seq``, must decide. Real staged files, local Spark and Delta.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from tests.support.delta_check import spark_session

SYNC, TABLE = "chain", "moved"
SHARDS = ("-80", "80-")
FIELDS = [
    query_pb2.Field(name="id", type=query_pb2.INT64, column_type="bigint"),
    query_pb2.Field(name="v", type=query_pb2.VARCHAR, column_type="varchar(20)", charset=255),
]
T0 = 1_800_000_000
# (window, shard, op, commit second, _seq, id, value): window 1 is the snapshot.
EVENTS = [
    (1, "-80", Operation.INSERT, 0, 1, 1, "kept"),
    (2, "-80", Operation.INSERT, T0 + 1, 2, 5, "moved away"),
    (3, "-80", Operation.DELETE, T0 + 2, 1, 5, None),  # the move's first half
    (3, "-80", Operation.UPDATE, T0 + 2, 2, 1, "kept, updated"),
    (4, "80-", Operation.INSERT, T0 + 3, 1, 5, "moved here"),  # its second half
    (4, "80-", Operation.DELETE, T0 + 3, 2, 5, None),  # then deleted on its new shard
]


def _at(n: int) -> Vgtid:
    return Vgtid(tuple(ShardGtid("ks", shard, f"MariaDB/0-1-{n}") for shard in SHARDS))


def _image(key: int, value: str | None) -> tuple[Any, ...]:
    return (key, value)


def _stage(root: Path, seq: int) -> str:
    stager = WindowStager(str(root), SYNC, seq, key_columns={TABLE: ["id"]})
    stager.set_schema("ks", TABLE, FIELDS)
    before: dict[int, str] = {}
    for window, shard, op, ts, order, key, value in EVENTS:
        if window < seq:
            before[key] = value or before.get(key, "")
            continue
        if window > seq:
            continue
        old = _image(key, before.get(key)) if op is not Operation.INSERT else None
        new = _image(key, value) if op is not Operation.DELETE else None
        stager.add_change("ks", TABLE, shard, op, ts, order, old, new)
    # A snapshot has no stop; the catch-ups stopped early (max_events), short of position 100.
    stop = None if seq == 1 else _at(100)
    manifest = stager.finish(_at(seq - 1), stop, _at(seq))
    return manifest.path


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()


def test_a_chain_read_in_one_scan_keeps_each_windows_place(spark: Any, tmp_path: Path) -> None:
    target = TableTarget(TABLE, str(tmp_path / "delta" / TABLE), ("id",), ("id",))
    for seq in (1, 2, 3, 4):
        window = WindowToMerge(seq, _stage(tmp_path / "stage", seq), (TABLE,) if seq == 1 else ())
        report = merge(spark, MergePlan(SYNC, (window,), {TABLE: target}))
        assert report.statuses() == {(seq, TABLE): TableStatus.WRITTEN}, report
    rows = {r["id"]: r["v"] for r in spark.read.format("delta").load(target.path).collect()}
    assert rows == {1: "kept, updated"}
