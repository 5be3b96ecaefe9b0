"""Benchmark: one small window's spark-submit of the merge job, ``--packages`` vs cached ``--jars``.

Not a test; prints figures. ``spark-submit --packages`` runs an Ivy resolution on every submit,
even with every jar already in the Ivy cache; the merge operator now remembers the jars the first
submit resolved (``merge/jar_cache.py``) and passes them as ``--jars`` afterwards. This measures
what that saves per window, end to end (process start to exit, as the merge task waits for it).

    .venv/bin/python bench/bench_submit.py [--changes 500] [--runs 3] [--dir DIR]

One window of ``--changes`` changes (``bench_merge.py``'s table and mix) is staged once; each
submit merges it into a Delta table of its own (a new table: the job writes it whole), with the
same command line except ``--packages DELTA`` vs ``--jars <the jars a first submit reported>``.
The modes alternate; the median of each counts. The Ivy cache is warm for both (a first,
untimed submit fills it and reports the jars).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_provider_vitess.merge.jar_cache import cached_jars, remember_jars
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, spark_submit_args
from airflow_provider_vitess.operators.merge import default_application

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_merge", _HERE / "bench_merge.py")
assert _spec is not None and _spec.loader is not None
bench_merge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_merge)

JOB = Path(default_application())  # the file the merge operator submits
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


def submit(work: Path, manifest: str, run: str, jars: list[str] | None, jars_file: Path | None) -> float:
    """One spark-submit of the merge job into a new table; seconds from start to exit."""
    target = TableTarget(bench_merge.TABLE, str(work / "delta" / run), ("id",), ("id",))
    plan = MergePlan("bench", (WindowToMerge(2, manifest),), {bench_merge.TABLE: target})
    args = spark_submit_args(local=True, extra={"spark.jars.ivy": str(work / "ivy")})
    if jars is not None:  # what the operator does with a remembered resolution
        args = ["--jars", ",".join(jars), *args[2:]]
    cmd = [str(SPARK_SUBMIT), "--master", "local[2]", *args, str(JOB), "--plan-json", plan.to_json()]
    if jars_file is not None:
        cmd += ["--jars-file", str(jars_file)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0 or "VITESS_MERGE_REPORT" not in proc.stdout:
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise SystemExit(f"submit {run} failed ({proc.returncode}):\n{tail}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--changes", type=int, default=500)
    p.add_argument("--runs", type=int, default=3, help="timed submits per mode")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_submit-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rng = random.Random(7)
        manifest = bench_merge.stage_window(
            work / "stage", "bench", 2, 2 * bench_merge.RECENT, args.changes, 0, rng
        )
        key = (DELTA_PACKAGE, None, None)
        jars_file = work / "jars.txt"
        first = submit(work, manifest, "first", None, jars_file)
        remember_jars(work / "jar-cache", key, jars_file.read_text().split(","))
        jars = cached_jars(work / "jar-cache", key)
        assert jars, "the job reported no jars"
        print(f"first submit (fills the Ivy cache, reports {len(jars)} jars): {first:.1f}s", flush=True)
        times: dict[str, list[float]] = {"--packages": [], "--jars": []}
        for i in range(args.runs):
            for mode in times:
                took = submit(work, manifest, f"{mode[2:]}-{i}", jars if mode == "--jars" else None, None)
                times[mode].append(took)
                print(f"run {i + 1} {mode:<10} {took:6.1f}s", flush=True)
        med = {m: statistics.median(t) for m, t in times.items()}
        for mode, t in times.items():
            print(f"{mode:<10} median {med[mode]:6.1f}s (best {min(t):.1f}s of {len(t)})")
        saved = med["--packages"] - med["--jars"]
        print(f"saved per window: {saved:.1f}s ({saved / med['--packages']:.0%} of the submit)")
        print("load:", os.getloadavg())
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
