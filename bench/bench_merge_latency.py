"""Benchmark: a small window's merge, task start -> COMMITTED, spark-submit vs Spark Connect.

Not a test; prints figures and where the time goes. A window of ``--changes`` changes over two
tables (half each: updates, deletes and inserts, as ``bench_merge.py`` stages them) is planned
and staged in a checkpoint store, then :class:`MergeRunner` (the merge operator's code path)
takes it STAGED -> MERGED -> COMMITTED with the submit function of each mode:

* ``submit``: the operator's spark-submit of ``merge/job/main.py`` (``--jars`` from the jar cache, as
  the operator passes them after its first submit; local[2], the operator's local settings);
* ``submit-cold``: the same without the driver's class-data archive (``merge/class_archive.py``,
  which the operator's local submits map after the first has written it): the JVM loads and
  verifies every class, as every submit did before;
* ``connect``: :func:`airflow_provider_vitess.merge.job.connect.run_merge` against a running Spark
  Connect server (``--connect-url``; else ``dev/spark_connect.sh`` starts one on ``--port`` and
  stops it at the end).

    .venv/bin/python bench/bench_merge_latency.py [--changes 500] [--rows 20000] [--runs 3]
        [--warmup 0] [--modes submit,connect] [--parallelism N] [--connect-url sc://...]
        [--port 15002] [--dir DIR]

Each mode first merges a snapshot window of ``--rows`` rows per table (untimed: it creates the
tables, fills the jar cache, warms the server) and, on Spark Connect, ``--warmup`` catch-up
windows (untimed: a server that has run for a while has compiled its hot code, which a fresh
one takes a few dozen windows to do; a spark-submit's JVM is new every window), then
``--runs`` catch-up windows, the modes alternating; the median counts.
Phases: spark-submit's JVM + Python start (to the job's ``main``), the session, manifests read
and checksums verified, Delta table states, the tables (each table's merge, concurrent), the
job's exit, and the store's MERGED/COMMITTED.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.merge import class_archive, jar_cache
from airflow_provider_vitess.merge.job import connect
from airflow_provider_vitess.merge.job.main import TIMING_PREFIX
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import REPORT_PREFIX, MergeReport
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.merge.spark_conf import (
    DELTA_PACKAGE,
    DRIVER_JAVA_OPTIONS,
    LOCAL_SUBMIT_CONF,
    spark_submit_args,
)
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid

_HERE = Path(__file__).resolve().parent
# bench_submit's spark-submit of the job (and bench_merge's table, through it).
_spec = importlib.util.spec_from_file_location("bench_submit", _HERE / "bench_submit.py")
assert _spec is not None and _spec.loader is not None
bench_submit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_submit)
bench_merge = bench_submit.bench_merge
JOB, SPARK_SUBMIT = bench_submit.JOB, bench_submit.SPARK_SUBMIT
TABLES = ("bench_a", "bench_b")
VGTID = Vgtid.for_keyspace("ks", "")
Timings = dict[str, float]


def stage(store: CheckpointStore, root: Path, sync: str, rows: int, changes: int, rng: random.Random) -> None:
    """Plan and stage the sync's next window: a snapshot of ``rows`` rows per table (the first),
    else ``changes`` changes split over the tables."""
    _, committed = store.committed(sync)
    kind = WindowKind.SNAPSHOT if committed == 0 else WindowKind.CATCHUP
    seq = store.plan_window(sync, kind, VGTID)
    stager = WindowStager(str(root / "stage"), sync, seq, key_columns={t: ["id"] for t in TABLES})
    ts, n = 1_800_000_000 + seq, 0
    for table in TABLES:
        stager.set_schema("ks", table, bench_merge.FIELDS)

        def add(op: Operation, before: Any, after: Any, table: str = table) -> None:
            nonlocal n
            n += 1
            stager.add_change("ks", table, "-", op, ts, n, before, after)

        if kind is WindowKind.SNAPSHOT:
            for i in range(1, rows + 1):
                add(Operation.INSERT, None, bench_merge.row(i, 0))
            continue
        share = changes // len(TABLES)
        inserts, deletes = int(share * 0.3), int(share * 0.1)
        touched = rng.sample(range(1, rows + 1), share - inserts)
        for i in touched[:deletes]:
            add(Operation.DELETE, bench_merge.row(i, 0), None)
        for i in touched[deletes:]:
            add(Operation.UPDATE, bench_merge.row(i, 0), bench_merge.row(i, seq))
        first = rows + 1 + seq * share
        for i in range(first, first + inserts):
            add(Operation.INSERT, None, bench_merge.row(i, seq))
    manifest = stager.finish(VGTID, VGTID, VGTID)
    store.mark_staged(sync, seq, VGTID, manifest.path)


def new_sync(store: CheckpointStore, sync: str) -> None:
    keys = {t: KeyChoice(t, ("id",), ("id",), "PRIMARY", "primary key").to_dict() for t in TABLES}
    store.ensure_sync(sync, "ks", TABLES, {"keys": keys})


class Submit:
    """spark-submit of the job as the operator runs it (with its driver's class-data archive,
    ``merge/class_archive.py``; ``archive`` False: without, the JVM loading every class);
    remembers each run's phases."""

    def __init__(self, work: Path, parallelism: int | None, archive: bool = True) -> None:
        self.work, self.parallelism, self.archive = work, parallelism, archive
        self.cache, self.phases = work / "jar-cache", {}  # type: ignore[var-annotated]
        self.key = (DELTA_PACKAGE, None, None)

    def __call__(self, plan: MergePlan) -> MergeReport:
        jars = jar_cache.cached_jars(self.cache, self.key)
        extra = {"spark.jars.ivy": str(self.work / "ivy")}
        java = class_archive.java_executable(os.environ) if self.archive else None
        use = None
        if java is not None:
            key = (os.environ.get("SPARK_HOME"), *self.key, None)  # the operator's: packages, jars
            use = class_archive.archive_for(self.cache / "class-archives", key, java)
            extra[DRIVER_JAVA_OPTIONS] = f"{LOCAL_SUBMIT_CONF[DRIVER_JAVA_OPTIONS]} {use.option}"
        args = spark_submit_args(local=True, extra=extra)
        if jars is not None:
            args = ["--jars", ",".join(jars), *args[2:]]
        cmd = [str(SPARK_SUBMIT), "--master", "local[2]", *args, str(JOB), "--plan-json", plan.to_json()]
        jars_file = self.work / "jars.txt"
        if jars is None:
            cmd += ["--jars-file", str(jars_file)]
        if self.parallelism:
            cmd += ["--parallelism", str(self.parallelism)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        spawned = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        exited = time.time()
        if proc.returncode != 0 or REPORT_PREFIX not in proc.stdout:
            raise SystemExit(
                f"submit failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        if use is not None:
            class_archive.settle(use, failed=False)
        if jars is None:
            jar_cache.remember_jars(self.cache, self.key, jars_file.read_text().split(","))
        lines = proc.stdout.splitlines()
        timing = json.loads(next(ln for ln in lines if ln.startswith(TIMING_PREFIX))[len(TIMING_PREFIX) :])
        report = next(ln for ln in lines if ln.startswith(REPORT_PREFIX))[len(REPORT_PREFIX) :]
        entered, ended = timing.pop("entered"), timing.pop("ended")
        self.phases = {"jvm+python start": entered - spawned, **timing, "job exit": exited - ended}
        return MergeReport.from_json(report)


class Connect:
    """The merge on a Spark Connect server; remembers each run's phases."""

    def __init__(self, url: str, parallelism: int | None) -> None:
        self.url, self.parallelism, self.phases = url, parallelism, {}  # type: ignore[var-annotated]

    def __call__(self, plan: MergePlan) -> MergeReport:
        timings: Timings = {}
        report = connect.run_merge(self.url, plan, parallelism=self.parallelism, timings=timings)
        self.phases = timings
        return report


def run_window(
    store: CheckpointStore, root: Path, sync: str, submit: Callable[[MergePlan], MergeReport], phases: Any
) -> tuple[float, Timings]:
    """One window from task start to COMMITTED; its total and its phases."""
    runner = MergeRunner(store, sync, str(root / "delta"), holder="bench")
    started = time.monotonic()
    submitted: list[float] = []

    def timed(plan: MergePlan) -> MergeReport:
        submitted.append(time.monotonic())
        report = submit(plan)
        submitted.append(time.monotonic())
        return report

    outcome = runner.run(timed)
    total = time.monotonic() - started
    assert outcome.seq is not None and outcome.report is not None, outcome.message
    out = {
        "plan (store)": submitted[0] - started,
        **phases(),
        "commit (store)": total - submitted[1] + started,
    }
    return total, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--changes", type=int, default=500)
    p.add_argument("--rows", type=int, default=20_000, help="rows per table before the windows")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed Spark Connect windows after the snapshot (a long-running server's JIT is warm)",
    )
    p.add_argument("--modes", default="submit,connect")
    p.add_argument("--parallelism", type=int, help="tables merged at once (default: all)")
    p.add_argument("--connect-url", help="a running Spark Connect server (default: start one)")
    p.add_argument("--port", type=int, default=connect.DEFAULT_PORT, help="for the server started here")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_latency-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    script = _HERE.parent / "dev" / "spark_connect.sh"
    server_env = {
        **os.environ,
        "SPARK_CONNECT_PORT": str(args.port),
        "SPARK_CONNECT_STATE_DIR": str(work / "sc"),
    }
    started_server = False
    try:
        submits: dict[str, Any] = {}
        if "submit" in modes:
            submits["submit"] = Submit(work, args.parallelism)
        if "submit-cold" in modes:
            submits["submit-cold"] = Submit(work, args.parallelism, archive=False)
        if "connect" in modes:
            url = args.connect_url
            if url is None:
                out = subprocess.run([str(script), "start"], env=server_env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"could not start the Spark Connect server:\n{out.stderr[-3000:]}")
                url, started_server = out.stdout.strip().splitlines()[-1], True
            submits["connect"] = Connect(url, args.parallelism)
        store = CheckpointStore(f"sqlite:///{work / 'store.db'}")
        store.migrate()
        rng = random.Random(7)
        for mode, submit in submits.items():  # untimed: the tables, the jar cache, a warm server
            new_sync(store, f"bench-{mode}")
            stage(store, work / mode, f"bench-{mode}", args.rows, args.changes, rng)
            took, _ = run_window(store, work / mode, f"bench-{mode}", submit, lambda s=submit: s.phases)
            print(
                f"{mode}: snapshot of {args.rows} rows x {len(TABLES)} tables merged in {took:.1f}s",
                flush=True,
            )
            warm = []
            for _ in range(args.warmup if mode == "connect" else 0):  # a submit's JVM is always new
                stage(store, work / mode, f"bench-{mode}", args.rows, args.changes, rng)
                warm.append(run_window(store, work / mode, f"bench-{mode}", submit, lambda: {})[0])
            if warm:
                print(f"{mode}: {len(warm)} warm-up windows (untimed) " + " ".join(f"{t:.1f}s" for t in warm))
        totals: dict[str, list[float]] = {m: [] for m in submits}
        phases: dict[str, list[Timings]] = {m: [] for m in submits}
        for i in range(args.runs):
            for mode, submit in submits.items():
                stage(store, work / mode, f"bench-{mode}", args.rows, args.changes, rng)
                took, ph = run_window(store, work / mode, f"bench-{mode}", submit, lambda s=submit: s.phases)
                totals[mode].append(took)
                phases[mode].append(ph)
                print(f"run {i + 1} {mode:<11} {took:6.1f}s  " + _phases(ph), flush=True)
        print(f"\n{args.changes}-change window over {len(TABLES)} tables, task start -> COMMITTED (median):")
        for mode, t in totals.items():
            median = {k: statistics.median(p[k] for p in phases[mode]) for k in phases[mode][0]}
            print(f"  {mode:<11} {statistics.median(t):6.1f}s (best {min(t):.1f}s)  " + _phases(median))
        print("load:", os.getloadavg())
    finally:
        if started_server:
            subprocess.run([str(script), "stop"], env=server_env, capture_output=True, check=False)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def _phases(phases: Timings) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in phases.items())


if __name__ == "__main__":
    main()
