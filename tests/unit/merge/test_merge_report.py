"""The merge report's JSON and stdout line, the plan's JSON round trip, and the Spark settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import (
    REPORT_PREFIX,
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
    parse_report_line,
)
from airflow_provider_vitess.merge.spark_conf import (
    DELTA_PACKAGE,
    QUICK_JIT,
    installed_spark_line,
    spark_conf,
    spark_submit_args,
)


def test_report_round_trip_and_line() -> None:
    report = MergeReport(
        "orders",
        (
            WindowResult(
                3,
                (
                    TableResult(
                        "corder",
                        "/d/corder",
                        TableStatus.WRITTEN,
                        WriteMode.MERGE,
                        10,
                        2,
                        7,
                        ("add column x int",),
                        3,
                    ),
                    TableResult("customer", "/d/customer", TableStatus.ALREADY_APPLIED),
                ),
            ),
        ),
    )
    assert MergeReport.from_json(report.to_json()) == report
    lines = ["noise", "VITESS_MERGE_PROGRESS {}", f"2026 INFO {REPORT_PREFIX}{report.to_json()}"]
    parsed = parse_report_line(lines)
    assert parsed == report
    assert parsed.statuses() == {
        (3, "corder"): TableStatus.WRITTEN,
        (3, "customer"): TableStatus.ALREADY_APPLIED,
    }
    assert parsed.window(3).table("corder").delta_version == 7
    assert parse_report_line(["nothing"]) is None
    with pytest.raises(MergePlanError, match="not a valid merge report"):
        MergeReport.from_json("{")


def test_an_iceberg_result_carries_its_format_and_snapshot_and_a_delta_one_is_written_as_before() -> None:
    iceberg = TableResult(
        "corder", "/w/ns/corder", TableStatus.WRITTEN, table_version=4, table_format="iceberg",
        snapshot_id=3141592653589793238,
    )  # fmt: skip
    report = MergeReport("orders", (WindowResult(3, (iceberg,)),))
    written = json.loads(report.to_json())["windows"][0]["tables"][0]
    assert (written["table_format"], written["snapshot_id"], written["table_version"]) == (
        "iceberg",
        3141592653589793238,
        4,
    )
    assert MergeReport.from_json(report.to_json()) == report
    # A Delta table's result is written without the new keys, as before them...
    delta = MergeReport(
        "orders", (WindowResult(3, (TableResult("t", "/d/t", TableStatus.WRITTEN, delta_version=7),)),)
    )
    assert set(json.loads(delta.to_json())["windows"][0]["tables"][0]) == {
        "table", "path", "status", "mode", "rows_upserted", "rows_deleted", "delta_version",
        "schema_changes", "files_touched", "rows_inserted", "rows_updated", "table_version",
    }  # fmt: skip
    # ...and a report without them (an older job's) reads as Delta's, without a snapshot.
    old = '{"sync_id": "o", "windows": [{"seq": 3, "tables": [{"table": "t", "path": "/d/t", "status": "written", "delta_version": 7}]}]}'  # noqa: E501
    result = MergeReport.from_json(old).window(3).table("t")
    assert (result.table_format, result.snapshot_id, result.table_version) == ("delta", None, 7)


def test_plan_round_trip_keeps_renames_and_replace_tables() -> None:
    plan = MergePlan(
        "sync-1",
        (WindowToMerge(1, "/s/sync-1/window=0000000001/_manifest.json", ("t",)), WindowToMerge(2, "/s/x")),
        {"t": TableTarget("t", "/d/t", ("region_code", "id"), ("region", "id"), {"region": "region_code"})},
    )
    again = MergePlan.from_json(plan.to_json())
    assert again == plan
    assert again.txn_app_id("t") == "airflow-provider-vitess:sync-1:t"


def test_spark_settings_name_the_delta_package_and_extensions() -> None:
    # The Delta built for the installed PySpark's Spark line (4.2 in the repo's own .venv).
    assert installed_spark_line().delta_package == DELTA_PACKAGE
    assert installed_spark_line().spark != "4.2" or DELTA_PACKAGE == "io.delta:delta-spark_2.13:4.4.0"
    conf = spark_conf(extra={"spark.sql.shuffle.partitions": "8"})
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    args = spark_submit_args()
    assert args[:2] == ["--packages", DELTA_PACKAGE]
    assert "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog" in args


def test_a_local_submit_compiles_with_the_quick_jit_tier_and_the_users_setting_wins() -> None:
    assert "-XX:TieredStopAtLevel=1" in spark_conf(local=True)["spark.driver.extraJavaOptions"].split()
    assert "spark.driver.extraJavaOptions" not in spark_conf()  # a cluster's driver: its own
    theirs = spark_conf(local=True, extra={"spark.driver.extraJavaOptions": "-Xss4m"})
    assert theirs["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_the_quick_jit_tier_keeps_the_tiered_code_cache_size() -> None:
    """``-XX:TieredStopAtLevel=1`` alone gives the JVM a 48 MiB code cache, which a window of a
    few dozen tables fills (the JVM fails "Out of space in CodeCache" and Spark stops its
    context): the driver's options keep the 240 MiB of tiered compilation. Asked of the JVM
    the job runs on."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    assert java, "no java: Spark's JVM is needed"
    flags = subprocess.run(
        [java, *QUICK_JIT.split(), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    size = next(int(line.split()[3]) for line in flags.splitlines() if " ReservedCodeCacheSize " in line)
    assert size >= 240 * 1024 * 1024
