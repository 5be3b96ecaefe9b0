"""The merge job's entry point for spark-submit: ``spark-submit .../merge/job/main.py``.

``VitessMergeOperator`` submits this file (inside the installed provider) with the plan; the
Spark settings come from :mod:`airflow_provider_vitess.merge.spark_conf`::

    spark-submit --packages io.delta:delta-spark_2.13:4.4.0 \\
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
        airflow_provider_vitess/merge/job/main.py (--plan-json JSON | --plan-file PATH) \\
        [--report-file PATH] [--rows-per-file N] [--parallelism N]

It makes the driver's classic session and runs :func:`.run.merge` (what a run does: there). The
driver's Python must have this provider and ``delta-spark`` installed; executors need only
PySpark. For S3, the usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``; :mod:`airflow_provider_vitess.object_storage`)
configure both fsspec and S3A: the job sets them on its session, not on the command line.

Output: one stdout line ``VITESS_MERGE_REPORT <json>`` (:class:`~airflow_provider_vitess.merge.
report.MergeReport`), the same JSON in ``--report-file``, and ``VITESS_MERGE_PROGRESS <json>``
lines as each (window, table) starts writing and commits. Exit status 0; 2 for a plan or staged
input the job refuses (message on stderr and as ``VITESS_MERGE_ERROR <json>``); 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from airflow_provider_vitess.exceptions import VitessProviderError, is_permanent
from airflow_provider_vitess.merge.job.connect import MODE_VARIABLES
from airflow_provider_vitess.merge.job.run import DEFAULT_ROWS_PER_FILE, merge, use_s3_settings
from airflow_provider_vitess.merge.job.sessions import DEFAULT_PARALLELISM
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import PROGRESS_PREFIX, REPORT_PREFIX
from airflow_provider_vitess.merge.spark_conf import spark_conf
from airflow_provider_vitess.object_storage import S3Settings

log = logging.getLogger("vitess_merge")
ERROR_PREFIX = "VITESS_MERGE_ERROR "
TIMING_PREFIX = "VITESS_MERGE_TIMING "  # seconds per phase, for bench/bench_merge_latency.py


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="main.py", description=__doc__.split("\n", 1)[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan-json", help="the MergePlan as JSON text")
    src.add_argument("--plan-file", help="a file (local path or fsspec URL) holding the MergePlan JSON")
    p.add_argument("--report-file", help="also write the report JSON here")
    p.add_argument("--jars-file", help="write the jars Spark was given (spark.jars), for later --jars")
    p.add_argument(
        "--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE, help="rows per file on replace"
    )
    p.add_argument("--parallelism", type=int, help=f"tables merged at once (default {DEFAULT_PARALLELISM})")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def _read_text(path: str) -> str:
    import fsspec

    with fsspec.open(path, "r", encoding="utf-8") as f:
        return str(f.read())


def _write_text(path: str, text: str) -> None:
    import fsspec

    with fsspec.open(path, "w", encoding="utf-8") as f:
        f.write(text)


def session(app_name: str) -> SparkSession:
    """The job's session: spark-submit's settings, plus :func:`spark_conf` for whatever they lack
    (so ``python main.py`` works too)."""
    from pyspark import SparkConf

    # A process that opened a Spark Connect session marks its environment for Connect
    # (pyspark.sql.utils.is_remote), and a spark-submit it starts inherits the mark: this
    # session is a classic one, whoever started the job.
    for name in MODE_VARIABLES:
        os.environ.pop(name, None)
    given = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    s3 = S3Settings.from_environment(os.environ)
    for key, value in {**spark_conf(), **(s3.hadoop_conf() if s3 else {})}.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    return builder.getOrCreate()


def _report_error(report_file: str | None, exc: Exception) -> None:
    """The error as ``VITESS_MERGE_ERROR <json>`` and in the report file, with whether a retry
    can fix it: the operator fails a permanent one at once (``exceptions.is_permanent``)."""
    text = json.dumps({"error": str(exc)[:2000], "type": type(exc).__name__, "permanent": is_permanent(exc)})
    print(ERROR_PREFIX + text, flush=True)
    if report_file:
        try:
            _write_text(report_file, text)
        except Exception as write_error:  # the stdout line above still tells
            log.warning("could not write the error to %s: %s", report_file, write_error)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    entered = time.time()  # wall clock: the benchmark subtracts its spawn time (JVM + Python start)
    args = _args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    s3 = S3Settings.from_environment(os.environ)
    if s3 is not None:
        use_s3_settings(s3)
    try:
        if args.plan_json is not None:
            plan = MergePlan.from_json(args.plan_json)
        else:
            plan = MergePlan.from_json(_read_text(args.plan_file), source=f"plan file {args.plan_file}")
        began = time.monotonic()
        spark = spark or session(f"vitess-merge {plan.sync_id}")
        timings = {"session": time.monotonic() - began}
        if args.jars_file:
            _write_text(args.jars_file, spark.sparkContext.getConf().get("spark.jars", ""))

        def emit(seq: int, table: str, phase: str) -> None:
            print(PROGRESS_PREFIX + json.dumps({"seq": seq, "table": table, "phase": phase}), flush=True)

        report = merge(
            spark,
            plan,
            rows_per_file=args.rows_per_file,
            progress=emit,
            timings=timings,
            parallelism=args.parallelism,
        )
    except VitessProviderError as exc:
        print(f"merge failed: {exc}", file=sys.stderr, flush=True)
        _report_error(args.report_file, exc)
        return 2
    except Exception as exc:
        log.exception("merge failed")
        _report_error(args.report_file, exc)
        return 1
    # Which Spark application did it, for the operator's "Spark UI" link (not part of the report).
    app = {"application_id": spark.sparkContext.applicationId, "ui_url": spark.sparkContext.uiWebUrl}
    text = json.dumps({**json.loads(report.to_json()), "spark": app}, sort_keys=True)
    if args.report_file:
        _write_text(args.report_file, text)
    print(REPORT_PREFIX + text, flush=True)
    print(TIMING_PREFIX + json.dumps({"entered": entered, "ended": time.time(), **timings}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
