"""Benchmark: one window's merge into a 1M-row table in each target mode, next to ``mirror``.

Not a test; prints figures (issue 29's bench). For each mode (``mirror``, ``soft_delete``,
``history``, ``changelog``) a table of ``--rows`` rows is built by Spark as the mode's snapshot
would leave it (sorted by key, range partitioned, one file per ``--rows-per-file`` rows, txn
version 1; ``history``: current versions, ``changelog``: ``snapshot`` rows), then windows of
each ``--changes`` size (default 500 and 100,000 changes: 60% updates of recent keys, 10%
deletes among them, 30% inserts of new keys) are staged with the real ``WindowStager`` and
merged with the job's ``merge`` (the code the operator's job runs), the modes alternating window
by window. The median per (mode, size) counts; the ratios to ``mirror`` are printed with the
issue's targets (``history`` and ``soft_delete`` <= 2x, ``changelog`` <= 1x).

``--formats delta,iceberg`` runs each mode in each table format on the same windows and prints
Iceberg's time next to Delta's (issue 40); Iceberg needs Spark 4.1's PySpark first on the path
(``make iceberg-spark``, then ``PYTHONPATH=~/.cache/airflow-provider-vitess/spark-4.1.3``).

    .venv/bin/python bench/bench_modes.py [--rows 1000000] [--changes 500,100000] [--windows 3]
        [--rows-per-file 1000000] [--modes mirror,soft_delete,history,changelog] [--dir DIR]
        [--formats delta]
"""

from __future__ import annotations

import argparse
import datetime
import random
import shutil
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.merge.job import formats as table_formats
from airflow_provider_vitess.merge.job import shapes
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.modes import (
    COMMIT_TS,
    CURRENT,
    DELETED,
    DELETED_AT,
    OP,
    ORDER,
    SHARD,
    SYNCED_AT,
    VALID_FROM,
    VALID_TO,
    WINDOW_SEQ,
    TargetMode,
    TargetShape,
)
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.merge.spark_conf import spark_conf
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid

Q = query_pb2.Type
TABLE = "bench_orders"
FIELDS = [
    query_pb2.Field(name="id", type=Q.INT64, column_type="bigint", flags=1 | 2),
    query_pb2.Field(name="qty", type=Q.INT32, column_type="int"),
    query_pb2.Field(name="name", type=Q.VARCHAR, column_type="varchar(64)", charset=45),
    query_pb2.Field(name="price", type=Q.DECIMAL, column_type="decimal(10,2)", decimals=2, column_length=12),
    query_pb2.Field(name="at", type=Q.DATETIME, column_type="datetime(6)", decimals=6),
]
RECENT = 200_000
EPOCH = datetime.datetime(2026, 1, 1)
VGTID = Vgtid.for_keyspace("ks", "")


def snapshot_rows(spark: SparkSession, rows: int, shape: TargetShape) -> DataFrame:
    """The table as the mode's snapshot leaves it."""
    df = spark.range(1, rows + 1).select(
        F.col("id"),
        (F.col("id") % 1000).cast("int").alias("qty"),
        F.concat(F.lit("order "), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 100000 / 100).cast("decimal(10,2)").alias("price"),
        F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id")).cast("timestamp_ntz").alias("at"),
    )
    values = {
        OP: F.lit("snapshot" if shape.mode is TargetMode.CHANGELOG else "insert"),
        COMMIT_TS: F.lit(None),
        WINDOW_SEQ: F.lit(1),
        SYNCED_AT: F.current_timestamp(),
        DELETED: F.lit(False),
        DELETED_AT: F.lit(None),
        VALID_FROM: F.lit(None),
        VALID_TO: F.lit(None),
        CURRENT: F.lit(True),
        SHARD: F.lit("-"),
        ORDER: F.col("id") * 2 + 1,
    }
    return df.select("*", *shapes.meta_columns(shape, values))


def row(i: int, version: int) -> tuple[Any, ...]:
    return (
        i,
        version,
        f"order {i} v{version}",
        Decimal(i % 100000) / 100,
        EPOCH + datetime.timedelta(seconds=i),
    )


def stage_window(stage: Path, sync: str, seq: int, size: int, changes: int, rng: random.Random) -> str:
    """One window against a table of ids 1..size (earlier windows' inserts are above ``size``
    and never touched again); returns the manifest path."""
    stager = WindowStager(str(stage), sync, seq, key_columns={TABLE: ["id"]})
    stager.set_schema("ks", TABLE, FIELDS)
    inserts, deletes = int(changes * 0.3), int(changes * 0.1)
    recent = rng.sample(range(size - RECENT + 1, size + 1), changes - inserts)
    ts, n = 1_800_000_000 + seq, 0

    def add(op: Operation, before: tuple[Any, ...] | None, after: tuple[Any, ...] | None) -> None:
        nonlocal n
        n += 1
        stager.add_change("ks", TABLE, "-", op, ts, n, before, after)

    for i in recent[:deletes]:
        add(Operation.DELETE, row(i, 0), None)
    for i in recent[deletes:]:
        add(Operation.UPDATE, row(i, 0), row(i, seq))
    first_new = size + 1 + seq * changes
    for i in range(first_new, first_new + inserts):
        add(Operation.INSERT, None, row(i, seq))
    return stager.finish(VGTID, VGTID, VGTID).path


def session(work: Path, iceberg: bool) -> SparkSession:
    builder = SparkSession.builder.master("local[2]").appName("bench_modes")
    extra = {
        "spark.driver.memory": "3g",
        "spark.pyspark.python": sys.executable,
        "spark.local.dir": str(work / "spark-local"),
    }
    for key, value in spark_conf(local=True, extra=extra, iceberg=iceberg).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--changes", default="500,100000")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--rows-per-file", type=int, default=1_000_000)
    p.add_argument("--modes", default="mirror,soft_delete,history,changelog")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    p.add_argument("--formats", default="delta", help="delta, iceberg or both: delta,iceberg")
    args = p.parse_args()
    sizes = [int(s) for s in args.changes.split(",")]
    modes = [TargetMode(m) for m in args.modes.split(",")]
    kinds = args.formats.split(",")
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_modes-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(29)
    spark = session(work, iceberg="iceberg" in kinds)
    try:
        shape_of = {m: TargetShape(m, metadata=m is not TargetMode.MIRROR) for m in modes}
        for kind in kinds:
            fmt = table_formats.for_session(spark, kind)
            for m in modes:
                started = time.monotonic()
                path, sync = work / kind / m.value / TABLE, f"bench_{m.value}"
                app = MergePlan(sync, (), {}).txn_app_id(TABLE)
                files = -(-args.rows // args.rows_per_file)
                rows = snapshot_rows(spark, args.rows, shape_of[m])
                fmt.replace(
                    rows, str(path), ["id"], app, 1, files=files, column_mapping=False, properties=None
                )
                took = time.monotonic() - started
                print(f"{kind:>7} {m.value:>11}: built {args.rows:,} rows in {took:6.1f}s", flush=True)
        times: dict[tuple[str, TargetMode, int], list[float]] = {}
        seq = 1
        for _ in range(args.windows):
            for changes in sizes:
                seq += 1
                for m in modes:
                    sync = f"bench_{m.value}"
                    manifest = stage_window(work / "stage", sync, seq, args.rows, changes, rng)
                    for kind in kinds:  # the same window into each format's table
                        path = str(work / kind / m.value / TABLE)
                        target = TableTarget(TABLE, path, ("id",), ("id",), shape=shape_of[m])
                        plan = MergePlan(sync, (WindowToMerge(seq, manifest),), {TABLE: target}, kind)
                        started = time.monotonic()
                        report = merge(spark, plan)
                        took = time.monotonic() - started
                        result = report.windows[0].table(TABLE)
                        assert result.status is TableStatus.WRITTEN, result
                        times.setdefault((kind, m, changes), []).append(took)
                        print(
                            f"window {seq} {kind:>7} {m.value:>11} {changes:>7,} changes: {took:6.2f}s",
                            flush=True,
                        )
        report_medians(times, kinds, modes, sizes, args.rows)
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def report_medians(
    times: dict[tuple[str, TargetMode, int], list[float]],
    kinds: list[str],
    modes: list[TargetMode],
    sizes: list[int],
    rows: int,
) -> None:
    """Per format and mode the median merge time, its ratio to the format's mirror (with the
    issue's targets) and, for a second format, to Delta's."""
    targets = {TargetMode.SOFT_DELETE: 2.0, TargetMode.HISTORY: 2.0, TargetMode.CHANGELOG: 1.0}
    print(f"\nmedian merge time of one window into {rows:,} rows (s), the ratio to mirror, and to Delta:")
    print(f"{'format':>7} {'mode':>11} " + " ".join(f"{c:>28,}" for c in sizes))
    for kind in kinds:
        for m in modes:
            cells = []
            for c in sizes:
                med = statistics.median(times[(kind, m, c)])
                base = times.get((kind, TargetMode.MIRROR, c))
                delta = times.get(("delta", m, c))
                ratio = (
                    f" ({med / statistics.median(base):.2f}x)" if base and m is not TargetMode.MIRROR else ""
                )
                vs = f" [{med / statistics.median(delta):.2f}x]" if delta and kind != "delta" else ""
                cells.append(f"{med:>11.2f}{ratio:>9}{vs:>8}")
            goal = f"  target <= {targets[m]:.0f}x" if m in targets else ""
            print(f"{kind:>7} {m.value:>11} " + " ".join(cells) + goal)


if __name__ == "__main__":
    main()
