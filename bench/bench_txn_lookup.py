"""Benchmark: the Spark Connect merge's txn-version lookup on a Delta table with a long log.

Not a test; prints figures. A table that a sync has merged into for weeks has a commit per
window in its log for the log retention (30 days by default: ~8,600 commits at a window every
5 minutes). Over Spark Connect the merge reads this sync's last transaction version from the
log with Spark (no JVM to ask ``DeltaLog``); this compares, on one table of ``--commits``
commits each carrying a txn action, alternating, ``--runs`` times:

* ``snapshot files``: :func:`airflow_provider_vitess.merge.job.connect_tables.txn_version`, which reads the
  checkpoint Delta writes every 10 commits and the commits after it (what Delta itself reads);
* ``whole log``: every commit and checkpoint file of the log (the read before, and the fallback).

    .venv/bin/python bench/bench_txn_lookup.py [--commits 1000] [--runs 5] [--port 15012]

A Spark Connect server is started with ``dev/spark_connect.sh`` (and stopped at the end).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from airflow_provider_vitess.merge.job import connect, connect_tables  # noqa: E402

APP = "bench-sync"


def build(spark: object, table: str, commits: int) -> None:
    """``commits`` versions, each a small append carrying (APP, its version) as its txn."""
    frame = spark.range(1)  # type: ignore[attr-defined]
    for v in range(commits):
        frame.write.format("delta").mode("append").option("txnAppId", APP).option("txnVersion", v).save(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--commits", type=int, default=1000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--port", type=int, default=15012, help="for the Spark Connect server started here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_txn-"))
    script = REPO / "dev" / "spark_connect.sh"
    env = {**os.environ, "SPARK_CONNECT_PORT": str(args.port), "SPARK_CONNECT_STATE_DIR": str(work / "sc")}
    try:
        out = subprocess.run([str(script), "start"], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"could not start the Spark Connect server:\n{out.stderr[-3000:]}")
        url = out.stdout.strip().splitlines()[-1]
        table = str(work / "t")
        with connect.remote_sessions(url) as new_session:
            spark = new_session()
            began = time.perf_counter()
            build(spark, table, args.commits)
            print(f"{args.commits} commits written in {time.perf_counter() - began:.0f}s", flush=True)
            version = connect_tables.table_version(spark, table)
            log_dir = f"{table}/_delta_log"
            reads = {
                "snapshot files": lambda: connect_tables.txn_version(spark, table, APP, version),
                "whole log": lambda: connect_tables._max_txn(spark, [], APP, whole_log=log_dir),
            }
            times: dict[str, list[float]] = {name: [] for name in reads}
            for run in range(args.runs + 1):  # the first round warms the server up: not counted
                for name, read in reads.items():
                    began = time.perf_counter()
                    found = read()
                    took = time.perf_counter() - began
                    assert found == args.commits - 1, f"{name}: txn version {found}"
                    if run:
                        times[name].append(took)
                        print(f"run {run} {name:<15} {took:6.2f}s", flush=True)
        snap, whole = (statistics.median(times[n]) for n in reads)
        print(f"\ntxn-version lookup on a table of {args.commits} commits (median of {args.runs}):")
        print(f"  snapshot files {snap:6.2f}s")
        print(f"  whole log      {whole:6.2f}s")
        print(f"  ratio whole log / snapshot files: {whole / snap:.1f}x")
        print("load:", os.getloadavg())
    finally:
        subprocess.run([str(script), "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
