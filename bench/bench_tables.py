"""Benchmark: a keyspace of 200 small tables: snapshot of all, then a window touching 50 of them.

Not a test; prints figures. What a keyspace with hundreds of tables costs: the snapshot must
give ``count(*)`` progress for every table, and a window's merge must cost by the tables it
touches, not by a JVM or a full scan per table.

    .venv/bin/python bench/bench_tables.py [--tables 200] [--touched 50] [--rows 100]
                                           [--repeat 2] [--parallelism N] [--dir DIR] [--keep]

It starts (or reuses) the cluster of ``dev/local_vitess.sh`` and connects as the other benches
do (``bench_window.connect``). In the unsharded ``commerce`` keyspace it creates ``--tables``
tables ``bt_000`` … (id BIGINT PK, qty INT, name VARCHAR(32)) with ``--rows`` rows each, then:

1. **Snapshot** of all of them with ``CaptureRunner.snapshot()`` into a temp dir (SQLite
   checkpoint store), and a count of the tables whose ``rows_known`` (the ``count(*)``) and
   ``rows_copied`` are recorded in the store: both must be every table.
2. **Merges**, through ``MergeRunner.run`` with a spark-submit of the merge job (``--jars`` from
   a first submit, ``local[2]``, the operator's local conf), as the merge task does: the
   snapshot window, then ``--repeat`` times alternating a catch-up window touching ``--touched``
   tables and one touching 2 (each: 10 updates, 2 deletes, 5 inserts per touched table). Each
   merge is timed from ``MergeRunner.run`` to COMMITTED. Target: the ``--touched``-table window
   merges in <= 4x the time of the 2-table one (medians).

The tables are dropped at the end (also on failure) unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_window as bw

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.jar_cache import cached_jars, remember_jars
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport, TableStatus
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, spark_submit_args

KEYSPACE = "commerce"
SYNC = "bench_tables"
JOB = Path(__file__).resolve().parent.parent / "airflow_provider_vitess" / "merge" / "job.py"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


def table_names(count: int) -> list[str]:
    return [f"bt_{i:03d}" for i in range(count)]


def create_tables(hook: VitessHook, names: list[str], rows: int) -> None:
    for name in names:
        bw.execute(hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{name}")
        bw.execute(
            hook,
            f"CREATE TABLE {KEYSPACE}.{name} (id BIGINT NOT NULL PRIMARY KEY, qty INT, name VARCHAR(32))",
        )
        bw.execute(
            hook,
            f"INSERT INTO {KEYSPACE}.{name} (id, qty, name) VALUES (:id, :qty, :name)",
            [{"id": i, "qty": i % 97, "name": f"row {i}"} for i in range(1, rows + 1)],
        )


def drop_tables(hook: VitessHook, names: list[str]) -> None:
    for name in names:
        bw.execute(hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{name}")


def touch(hook: VitessHook, names: list[str], rows: int, round_: int) -> None:
    """10 updates, 2 deletes and 5 inserts in each table of ``names``."""
    for name in names:
        base = rows + 1_000 * (round_ + 1)
        bw.execute(hook, f"UPDATE {KEYSPACE}.{name} SET qty = qty + 1 WHERE id <= 10")
        bw.execute(
            hook,
            f"DELETE FROM {KEYSPACE}.{name} WHERE id IN (:a, :b)",
            {"a": 20 + 2 * round_, "b": 21 + 2 * round_},
        )
        bw.execute(
            hook,
            f"INSERT INTO {KEYSPACE}.{name} (id, qty, name) VALUES (:id, :qty, :name)",
            [{"id": base + i, "qty": i, "name": f"new {round_}.{i}"} for i in range(5)],
        )


class Submitter:
    """spark-submit of the merge job as the merge operator runs it on a local master, with the
    jars of a first submit passed as ``--jars`` (no dependency resolution per window)."""

    def __init__(self, work: Path, parallelism: int | None = None) -> None:
        self.work, self.jars_cache, self.parallelism = work, work / "jar-cache", parallelism
        self.key = (DELTA_PACKAGE, None, None)

    def __call__(self, plan: MergePlan) -> MergeReport | None:
        report_file = self.work / "report.json"
        report_file.unlink(missing_ok=True)
        args = spark_submit_args(local=True, extra={"spark.jars.ivy": str(self.work / "ivy")})
        jars = cached_jars(self.jars_cache, self.key)
        jars_file = self.work / "jars.txt"
        if jars:
            args = ["--jars", ",".join(jars), *args[2:]]
        cmd = [str(SPARK_SUBMIT), "--master", "local[2]", *args, str(JOB), "--plan-json", plan.to_json()]
        cmd += ["--report-file", str(report_file)]
        if self.parallelism:
            cmd += ["--parallelism", str(self.parallelism)]
        if not jars:
            cmd += ["--jars-file", str(jars_file)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not report_file.exists():
            raise SystemExit(
                f"merge job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        if not jars and jars_file.exists():
            remember_jars(self.jars_cache, self.key, [j for j in jars_file.read_text().split(",") if j])
        return MergeReport.from_json(report_file.read_text())


def merge(store: CheckpointStore, root: Path, submit: Submitter) -> tuple[float, int]:
    """One merge task's work, timed: MergeRunner.run to COMMITTED; (seconds, tables changed)."""
    runner = MergeRunner(store, SYNC, str(root / "delta"), holder="bench")
    began = time.perf_counter()
    outcome = runner.run(submit)
    took = time.perf_counter() - began
    if outcome.seq is None or outcome.report is None:
        raise SystemExit(f"nothing merged: {outcome.message}")
    written = {t for (_, t), status in outcome.report.statuses().items() if status is TableStatus.WRITTEN}
    return took, len(written)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--tables", type=int, default=200)
    p.add_argument("--touched", type=int, default=50)
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--repeat", type=int, default=2, help="pairs of (touched, 2)-table windows")
    p.add_argument("--parallelism", type=int, help="tables the job merges at once (default: the job's)")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the tables in the cluster")
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_tables-"))
    root.mkdir(parents=True, exist_ok=True)
    hook = bw.connect()
    names = table_names(args.tables)
    store = CheckpointStore(f"sqlite:///{root}/store.db")
    try:
        store.migrate()
        began = time.perf_counter()
        create_tables(hook, names, args.rows)
        print(
            f"{len(names)} tables x {args.rows} rows created in {time.perf_counter() - began:.1f}s",
            flush=True,
        )
        spec = SyncSpec(
            sync_id=SYNC, keyspace=KEYSPACE, tables=tuple(names), staging_location=str(root / "staging")
        )
        progress_lines: list[str] = []
        runner = CaptureRunner(
            hook, store, spec, holder="bench", emit_progress=lambda p: progress_lines.append(p.line())
        )
        began = time.perf_counter()
        outcome = runner.snapshot()
        snap_took = time.perf_counter() - began
        progress = store.progress(SYNC, outcome.seq)
        known = sum(1 for t in progress if t.rows_known == args.rows)
        copied = sum(1 for t in progress if t.rows_copied == args.rows)
        print(
            f"snapshot of {len(names)} tables: {outcome.manifest.rows:,} rows in {snap_took:.1f}s; "
            f"count(*) progress recorded for {known} tables, rows copied for {copied}",
            flush=True,
        )
        submit = Submitter(root, args.parallelism)
        snap_merge, changed = merge(store, root, submit)
        print(
            f"merge of the snapshot window ({changed} tables, first submit resolves jars): "
            f"{snap_merge:.1f}s | {uptime()}",
            flush=True,
        )
        times: dict[int, list[float]] = {args.touched: [], 2: []}
        for i in range(args.repeat):
            for count in times:
                touch(hook, names[:count], args.rows, 2 * i + (count == 2))
                runner.catch_up()
                took, changed = merge(store, root, submit)
                if changed != count:
                    raise SystemExit(f"the window touching {count} tables changed {changed}")
                times[count].append(took)
                print(
                    f"  pair {i + 1}: window of {count:3d} tables merged in {took:6.1f}s | {uptime()}",
                    flush=True,
                )
        med = {count: statistics.median(t) for count, t in times.items()}
        ratio = med[args.touched] / med[2]
        print("\nsummary (medians; ratio = measured / target)")
        print(f"  count(*) progress for all {len(names)} tables: {known == len(names)} ({known})")
        print(f"  snapshot of {len(names)} tables            {snap_took:8.1f} s")
        print(f"  merge of the snapshot, {len(names)} tables    {snap_merge:8.1f} s")
        print(f"  merge, window of 2 tables            {med[2]:8.1f} s")
        print(f"  merge, window of {args.touched} tables           {med[args.touched]:8.1f} s")
        verdict = "met" if ratio <= 4 else "missed"
        label = f"{args.touched}-table / 2-table merge"
        print(f"  {label:<36}{ratio:8.2f}   target <= 4   {ratio / 4:.2f} ({verdict})")
        print(f"  load: {uptime()}")
        print(f"  command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        print(
            json.dumps(
                {
                    "tables": len(names),
                    "known": known,
                    "snapshot_s": snap_took,
                    "snapshot_merge_s": snap_merge,
                    "merge_s": med,
                },
                default=str,
            )
        )
    finally:
        store.close()
        if not args.keep:
            drop_tables(hook, names)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
