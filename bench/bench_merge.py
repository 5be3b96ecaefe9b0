"""Benchmark: merging one window of ~10k changed keys into a 1M-row vs a 10M-row Delta table.

Not a test; prints figures. The merge's cost should follow the window, not the table: the job
adds the window's key ranges to the MERGE condition so Delta skips the files that cannot hold a
changed key; with ``--deletion-vectors`` (the table feature, off by default: it locks out
delta-rs, Polars and older Sparks) it marks changed rows instead of rewriting the files it touches.

    .venv/bin/python bench/bench_merge.py [--sizes 1000000,10000000] [--changes 10000]
        [--windows 3] [--rows-per-file 1000000] [--scattered 0] [--no-prune]
        [--deletion-vectors] [--dir DIR]

Each table (id BIGINT key, qty INT, name VARCHAR(64), price DECIMAL(10,2), at DATETIME(6)) is
built by Spark as the job's snapshot would leave it (``write_replace``: sorted by key, range
partitioned, ``--rows-per-file`` rows a file, txn version 1), not staged row by row. Then each
window is staged with the real ``WindowStager`` (Parquet + manifest) and merged with
``spark_jobs.merge_cdc.merge``: 60% updates of the newest 100,000 keys, 10% deletes among them,
30% inserts of new keys above the maximum, plus ``--scattered`` updates of random old keys. A
warm-up window on a small table runs first; then the sizes alternate window by window, and the
best time per size counts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.merge.job import apply, delta_log, tables
from airflow_provider_vitess.merge.modes import DELETION_VECTORS, TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import TableStatus
from airflow_provider_vitess.merge.spark_conf import spark_conf
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid

# The job is a script of the repository, not of the installed package.
_JOB = Path(__file__).resolve().parent.parent / "spark_jobs" / "merge_cdc.py"
_spec = importlib.util.spec_from_file_location("merge_cdc", _JOB)
assert _spec is not None and _spec.loader is not None
merge_cdc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(merge_cdc)

Q = query_pb2.Type
TABLE = "bench_orders"
FIELDS = [
    query_pb2.Field(name="id", type=Q.INT64, column_type="bigint", flags=1 | 2),
    query_pb2.Field(name="qty", type=Q.INT32, column_type="int"),
    query_pb2.Field(name="name", type=Q.VARCHAR, column_type="varchar(64)", charset=45),
    query_pb2.Field(name="price", type=Q.DECIMAL, column_type="decimal(10,2)", decimals=2, column_length=12),
    query_pb2.Field(name="at", type=Q.DATETIME, column_type="datetime(6)", decimals=6),
]
RECENT = 100_000
EPOCH = datetime.datetime(2026, 1, 1)
VGTID = Vgtid.for_keyspace("ks", "")


def build_table(
    spark: SparkSession, path: Path, rows: int, rows_per_file: int, sync: str, features: tuple[str, ...]
) -> None:
    df = spark.range(1, rows + 1).select(
        F.col("id"),
        (F.col("id") % 1000).cast("int").alias("qty"),
        F.concat(F.lit("order "), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 100000 / 100).cast("decimal(10,2)").alias("price"),
        F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id")).cast("timestamp_ntz").alias("at"),
    )
    app = MergePlan(sync, (), {}).txn_app_id(TABLE)
    apply.write_replace(
        df,
        str(path),
        ["id"],
        app,
        1,
        files=-(-rows // rows_per_file),
        column_mapping=False,
        properties=TargetShape(features=features).feature_properties(),
    )


def row(i: int, version: int) -> tuple[Any, ...]:
    return (
        i,
        version,
        f"order {i} v{version}",
        Decimal(i % 100000) / 100,
        EPOCH + datetime.timedelta(seconds=i),
    )


def stage_window(
    stage: Path, sync: str, seq: int, size: int, changes: int, scattered: int, rng: random.Random
) -> str:
    """Stages one window against a table holding ids 1..size (plus earlier windows' inserts,
    which are above ``size`` and never touched again); returns the manifest path."""
    stager = WindowStager(str(stage), sync, seq, key_columns={TABLE: ["id"]})
    stager.set_schema("ks", TABLE, FIELDS)
    inserts = int(changes * 0.3)
    deletes = int(changes * 0.1)
    recent = rng.sample(range(size - RECENT + 1, size + 1), changes - inserts)
    old = rng.sample(range(1, size - RECENT), scattered)
    ts = 1_800_000_000 + seq
    seq_no = 0

    def add(op: Operation, before: tuple[Any, ...] | None, after: tuple[Any, ...] | None) -> None:
        nonlocal seq_no
        seq_no += 1
        stager.add_change("ks", TABLE, "-", op, ts, seq_no, before, after)

    for i in recent[:deletes]:
        add(Operation.DELETE, row(i, 0), None)
    for i in recent[deletes : changes - inserts] + old:
        add(Operation.UPDATE, row(i, 0), row(i, seq))
    first_new = size + 1 + seq * changes  # never collides with another window's inserts
    for i in range(first_new, first_new + inserts):
        add(Operation.INSERT, None, row(i, seq))
    return stager.finish(VGTID, VGTID, VGTID).path


def session(work: Path) -> SparkSession:
    builder = SparkSession.builder.master("local[2]").appName("bench_merge")
    (work / "events").mkdir(parents=True, exist_ok=True)
    conf = spark_conf(
        local=True,
        extra={
            "spark.driver.memory": "3g",
            "spark.pyspark.python": sys.executable,
            "spark.local.dir": str(work / "spark-local"),
            # Rows read per MERGE phase come from the event log (task input metrics).
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(work / "events"),
            "spark.eventLog.compress": "false",
        },
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_read(events: Path) -> dict[str, tuple[int, int]]:
    """Per job group (size/seq): rows the MERGE read from the target to find the touched files,
    and to write the changes (tasks' input records, from the event log)."""
    stage_phase: dict[int, tuple[str, int]] = {}
    out: dict[str, list[int]] = {}
    for f in sorted(events.rglob("*")):
        if not f.is_file() or f.name.startswith("appstatus"):
            continue
        for line in f.read_text().splitlines():
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            if e["Event"] == "SparkListenerJobStart":
                props = e.get("Properties") or {}
                group, what = props.get("spark.jobGroup.id"), props.get("spark.job.description", "")
                phase = (
                    0
                    if "scanning files for matches" in what
                    else 1
                    if "Writing modified data" in what
                    else -1
                )
                if group and phase >= 0:
                    for st in e["Stage Infos"]:
                        stage_phase[st["Stage ID"]] = (group, phase)
            elif e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in stage_phase:
                group, phase = stage_phase[e["Stage ID"]]
                n = (e.get("Task Metrics") or {}).get("Input Metrics", {}).get("Records Read", 0)
                out.setdefault(group, [0, 0])[phase] += n
    return {g: (v[0], v[1]) for g, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--changes", type=int, default=10_000)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--rows-per-file", type=int, default=1_000_000)
    p.add_argument("--scattered", type=int, default=0, help="updates of random old keys per window")
    p.add_argument("--no-prune", action="store_true", help="MERGE without the key-range predicate")
    p.add_argument(
        "--deletion-vectors",
        action="store_true",
        help="tables with deletion vectors (default none: reader-safe)",
    )
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_merge-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(11)
    if args.no_prune:
        apply_prune = apply.prune_condition
        apply.prune_condition = lambda *a, **k: None
    spark = session(work)
    try:
        features = (DELETION_VECTORS,) if args.deletion_vectors else ()
        sizes_all = [2 * RECENT, *sizes]  # the first: warm-up
        for size in sizes_all:
            started = time.monotonic()
            build_table(spark, work / f"t{size}" / TABLE, size, args.rows_per_file, f"s{size}", features)
            print(f"built {size:>11,} rows in {time.monotonic() - started:6.1f}s", flush=True)
        times: dict[int, list[float]] = {s: [] for s in sizes_all}
        for seq in range(2, 2 + args.windows):
            for size in sizes_all if seq == 2 else sizes:
                sync = f"s{size}"
                manifest = stage_window(work / "stage", sync, seq, size, args.changes, args.scattered, rng)
                shape = TargetShape(features=features)
                target = TableTarget(TABLE, str(work / f"t{size}" / TABLE), ("id",), ("id",), shape=shape)
                plan = MergePlan(sync, (WindowToMerge(seq, manifest),), {TABLE: target})
                spark.sparkContext.setJobGroup(f"{size}/{seq}", "bench merge")
                started = time.monotonic()
                report = merge_cdc.merge(spark, plan)
                took = time.monotonic() - started
                result = report.windows[0].table(TABLE)
                assert result.status is TableStatus.WRITTEN, result
                times[size].append(took)
                commit = delta_log.last_commit(spark, target.path, tables.read_log_file)
                assert commit is not None, "the window's MERGE committed nothing"
                m = commit.metrics
                print(
                    f"window {seq} into {size:>11,} rows: {took:6.2f}s  upserted {result.rows_upserted:,} "
                    f"deleted {result.rows_deleted:,}  files touched {result.files_touched}  "
                    f"target rows copied {m.get('numTargetRowsCopied')}  scan {m.get('scanTimeMs')} ms  "
                    f"rewrite {m.get('rewriteTimeMs')} ms",
                    flush=True,
                )
        spark.stop()
        read = rows_read(work / "events")
        for size in sizes:
            for seq in range(2, 2 + args.windows):
                found, rewrite = read.get(f"{size}/{seq}", (0, 0))
                print(
                    f"window {seq} into {size:>11,} rows: rows read to find matches {found:>11,}, "
                    f"to write the changes {rewrite:>11,}"
                )
        med = {s: statistics.median(times[s]) for s in sizes}
        for s in sizes:
            print(
                f"merge of ~{args.changes:,} changed keys into {s:>11,} rows: median {med[s]:.2f}s "
                f"(best {min(times[s]):.2f}s of {len(times[s])})"
            )
        if len(sizes) >= 2:
            small, large = sizes[0], sizes[-1]
            scanned = {
                s: sum(read.get(f"{s}/{q}", (0, 0))[0] for q in range(2, 2 + args.windows))
                for s in (small, large)
            }
            print(
                f"ratio {large:,} / {small:,} rows, median time: {med[large] / med[small]:.2f} "
                "(target: close to 1)"
            )
            if scanned[small]:
                print(
                    f"ratio {large:,} / {small:,} rows, rows read to find matches: "
                    f"{scanned[large] / scanned[small]:.2f}"
                )
    finally:
        spark.stop()
        if args.no_prune:
            apply.prune_condition = apply_prune
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
