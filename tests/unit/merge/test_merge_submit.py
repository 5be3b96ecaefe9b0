"""The merge operator's spark-submit: its command for a plan that names many tables, and a
spark-submit that cannot start on the worker."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.exceptions import is_permanent
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge


def _big_plan(tables: int) -> MergePlan:
    """A sync of ``tables`` tables on S3, as the 200-table bench keyspace has (and more)."""
    lake = "s3a://a-company-lakehouse-bucket/warehouse/vitess/production/commerce_keyspace"
    targets = {
        f"table_{i:04d}_with_a_long_name": TableTarget(
            f"table_{i:04d}_with_a_long_name",
            f"{lake}/delta/table_{i:04d}_with_a_long_name",
            ("tenant_id", "entity_id", "created_at"),
            ("tenant_id", "entity_id", "created_at"),
            last_merged_seq=41,
            last_delta_version=40,
        )
        for i in range(tables)
    }
    windows = tuple(
        WindowToMerge(seq, f"{lake}/staging/sync/window={seq:010d}/_manifest.json") for seq in range(42, 62)
    )
    return MergePlan("commerce_sync", windows, targets)


def test_a_plan_past_linuxs_argument_limit_reaches_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    plan = _big_plan(600)
    assert len(plan.to_json()) > 131072  # MAX_ARG_STRLEN: one argument longer is refused (E2BIG)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = VitessMergeOperator(
        task_id="merge", sync_id="commerce_sync", target_location="/tmp/unused", conn_id="spark_x"
    )
    seen: dict[str, Any] = {}

    def submit(self: SparkSubmitHook, application: str = "", **kwargs: Any) -> None:
        command = self._build_spark_submit_command(application)
        # The operating system's own check, with a program that accepts any arguments.
        seen["exit"] = subprocess.run(["true", *command[1:]], check=False).returncode
        plan_file = command[command.index("--plan-file") + 1]
        with open(plan_file, encoding="utf-8") as f:
            seen["plan"] = MergePlan.from_json(f.read())

    monkeypatch.setattr(SparkSubmitHook, "submit", submit)
    monkeypatch.setattr(SparkSubmitMerge, "_jars_from_cache", lambda self, job: None)
    assert op._make_backend().submit(plan, {}) is None  # no report: the job did not run
    assert seen["exit"] == 0
    assert seen["plan"] == plan
    assert "--plan-json" not in (op.application_args or [])


@pytest.mark.parametrize("setting", ["SPARK_HOME", "PYSPARK_DRIVER_PYTHON"])
def test_a_spark_submit_that_cannot_start_is_refused_naming_the_setting(
    setting: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The worker's real spark-submit (the installed PySpark's) exits 127 before Spark starts when
    SPARK_HOME names no Spark (a removed installation) or the driver's Python is a path of the
    cluster's nodes; the task says which setting, not ``Error code is: 127`` on every retry."""
    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    env_vars: dict[str, Any] = {}
    if setting == "SPARK_HOME":
        value = str(tmp_path / "spark-3.4.1-bin-hadoop3")  # an installation since removed
        monkeypatch.setenv("SPARK_HOME", value)
    else:
        value = str(tmp_path / "opt" / "cluster-venv" / "bin" / "python")  # on the cluster only
        env_vars = {"PYSPARK_DRIVER_PYTHON": value}
    op = VitessMergeOperator(
        task_id="merge",
        sync_id="s",
        target_location=str(tmp_path / "delta"),
        conn_id="spark_x",
        env_vars=env_vars,
    )
    # The premise, on the real script: this spark-submit with this environment exits 127.
    binary = shutil.which(op.submit_binary) or op.submit_binary
    env = {**os.environ, **env_vars}
    assert subprocess.run([binary, "--version"], env=env, capture_output=True).returncode == 127

    plan = MergePlan(
        "s",
        (WindowToMerge(1, str(tmp_path / "staging" / "window=0000000001" / "_manifest.json")),),
        {"t": TableTarget("t", str(tmp_path / "delta" / "t"), ("id",), ("id",))},
    )
    monkeypatch.setattr(SparkSubmitMerge, "_jars_from_cache", lambda self, job: None)  # no Ivy run
    with pytest.raises(Exception) as failed:
        op._make_backend().submit(plan, {})
    message = str(failed.value)
    assert f"{setting}={value}" in message, message
    assert "spark-submit cannot start" in message and "Remedy:" in message
    assert type(failed.value).__name__ == "SparkSubmitSetupError"
    assert is_permanent(failed.value)


def test_a_spark_submit_that_can_start_is_not_refused() -> None:
    from airflow_provider_vitess.merge.submit_env import spark_submit_problem
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    op = VitessMergeOperator(task_id="merge", sync_id="s", target_location="/tmp/unused")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    assert spark_submit_problem(op.submit_binary, {**env, **(op.env_vars or {})}) is None
    pyspark = Path(importlib.import_module("pyspark").__file__ or "").parent
    assert spark_submit_problem(op.submit_binary, {**env, "SPARK_HOME": str(pyspark)}) is None


@pytest.mark.parametrize("spark", ["4.1.3", "4.2.0"])
def test_an_iceberg_plans_submit_loads_icebergs_runtime_for_the_clusters_spark_or_is_refused(
    spark: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cluster's Spark (the connection's ``spark_version``) picks Iceberg's runtime beside
    Delta's, and Iceberg's SQL extensions join Delta's; a line without a runtime is refused by
    name before spark-submit runs."""
    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.versions import UnsupportedSparkVersionError

    conn = {"conn_type": "spark", "host": "local[2]", "extra": {"spark_version": spark}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps(conn))
    op = VitessMergeOperator(
        task_id="merge",
        sync_id="s",
        target_location=str(tmp_path / "lake"),
        conn_id="spark_x",
        table_format="iceberg",
    )
    plan = MergePlan(
        "s",
        (WindowToMerge(1, str(tmp_path / "staging" / "window=0000000001" / "_manifest.json")),),
        {"t": TableTarget("t", str(tmp_path / "lake" / "t"), ("id",), ("id",))},
        "iceberg",
    )
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    backend = op._make_backend()
    assert isinstance(backend, SparkSubmitMerge)
    if spark == "4.2.0":
        with pytest.raises(UnsupportedSparkVersionError, match=r"Iceberg targets on Spark 4\.2: .*Remedy"):
            backend.job(plan, tmp_path / "plan.json", tmp_path / "report.json")
        return
    job = backend.job(plan, tmp_path / "plan.json", tmp_path / "report.json")
    assert job["packages"] == (
        "io.delta:delta-spark_4.1_2.13:4.4.0,org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
    )
    assert job["conf"]["spark.sql.extensions"] == (
        "io.delta.sql.DeltaSparkSessionExtension,org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    )
    # A Delta plan of the same operator loads neither.
    delta = backend.job(MergePlan("s", plan.windows, plan.targets), tmp_path / "p", tmp_path / "r")
    assert "iceberg" not in delta["packages"] and "Iceberg" not in str(delta.get("conf"))


@pytest.mark.parametrize(
    "given",
    [
        {"change_data_feed": True},
        {"table_features": ["deletion_vectors"]},
        {"targets": {"t": {"change_data_feed": True}}},
    ],
)
def test_delta_only_choices_of_an_iceberg_sync_are_refused_when_the_dag_is_parsed(
    given: dict[str, Any],
) -> None:
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    with pytest.raises(ValueError, match=r"are Delta's and an Iceberg table has no such thing.*Remedy"):
        VitessMergeOperator(
            task_id="merge",
            sync_id="s",
            target_location="/lake/x",
            tables=["t"],
            table_format="iceberg",
            **given,
        )
    with pytest.raises(ValueError, match=r"table_format 'hudi' is not one of delta, iceberg"):
        VitessMergeOperator(task_id="merge", sync_id="s", target_location="/lake/x", table_format="hudi")


def test_an_iceberg_jdbc_catalogs_credentials_reach_the_job_in_its_environment_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The catalog's name, URL and warehouse go in the plan; its user and password only in the
    spark-submit's environment (never in the plan, the conf or the command line), with its JDBC
    driver among the packages. A master that would turn the environment into command-line
    settings is refused, naming the setting."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_vitess.connections import iceberg_catalog
    from airflow_provider_vitess.exceptions import VitessConnectionError
    from airflow_provider_vitess.merge.iceberg_catalog import ENV_PASSWORD, ENV_USER
    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    secret = "s3cr3t-catalog-pw"
    catalog_conn = {
        "conn_type": "postgres",
        "host": "db.internal",
        "port": 5432,
        "schema": "iceberg",
        "login": "lake",
        "password": secret,
        "extra": {"catalog": "lake", "sslmode": "require"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_CAT", json.dumps(catalog_conn))
    for master, name in (("local[2]", "SPARK_LOCAL"), ("yarn", "SPARK_YARN")):
        conn = {"conn_type": "spark", "host": master, "extra": {"spark_version": "4.1.3"}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{name}", json.dumps(conn))
    catalog = iceberg_catalog("iceberg_cat")
    assert catalog is not None
    assert catalog.document() == {
        "name": "lake",
        "uri": "jdbc:postgresql://db.internal:5432/iceberg?sslmode=require",
        "driver": "org.postgresql:postgresql:42.7.14",
    }
    assert secret not in repr(catalog)
    plan = MergePlan(
        "s",
        (WindowToMerge(1, str(tmp_path / "staging" / "window=0000000001" / "_manifest.json")),),
        {"t": TableTarget("t", str(tmp_path / "lake" / "ns" / "t"), ("id",), ("id",))},
        "iceberg",
        catalog.document(),
    )
    assert secret not in plan.to_json() and '"uri"' in plan.to_json()
    assert MergePlan.from_json(plan.to_json()) == plan

    def submit(conn_id: str) -> SparkSubmitMerge:
        backend = VitessMergeOperator(
            task_id="merge",
            sync_id="s",
            target_location=str(tmp_path / "lake" / "ns"),
            conn_id=conn_id,
            table_format="iceberg",
            iceberg_catalog_conn_id="iceberg_cat",
        )._make_backend(catalog)
        assert isinstance(backend, SparkSubmitMerge)
        return backend

    job = submit("spark_local").job(plan, tmp_path / "plan.json", tmp_path / "r.json")
    assert job["env_vars"][ENV_USER] == "lake" and job["env_vars"][ENV_PASSWORD] == secret
    assert job["packages"].endswith(",org.postgresql:postgresql:42.7.14")
    assert secret not in json.dumps(job.get("conf"))
    hook_args = {k: v for k, v in job.items() if k != "env_vars"}
    command = SparkSubmitHook(**hook_args)._build_spark_submit_command("app.py")
    assert not [part for part in command if secret in part]
    with pytest.raises(
        VitessConnectionError, match=r"iceberg_catalog_conn_id cannot be used with the 'yarn' master"
    ):
        submit("spark_yarn").job(plan, tmp_path / "plan.json", tmp_path / "r.json")


def test_an_iceberg_catalog_is_refused_for_delta_tables_and_a_bad_connection_is_named() -> None:
    from airflow_provider_vitess.capture.sync_parts import TargetDefaults
    from airflow_provider_vitess.exceptions import VitessConnectionError
    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
    from airflow_provider_vitess.merge.plan import MergePlanError
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    with pytest.raises(
        ValueError, match=r"iceberg_catalog_conn_id 'cat' is given for delta tables.*table_format='iceberg'"
    ):
        VitessMergeOperator(
            task_id="m", sync_id="s", target_location="/lake/x", iceberg_catalog_conn_id="cat"
        )
    with pytest.raises(ValueError, match=r"iceberg_catalog_conn_id 'cat' is given for delta tables"):
        TargetDefaults(iceberg_catalog_conn_id="cat")
    assert (
        TargetDefaults(table_format="iceberg", iceberg_catalog_conn_id="cat").iceberg_catalog_conn_id == "cat"
    )
    with pytest.raises(MergePlanError, match=r"an Iceberg catalog is given for delta tables"):
        MergePlan("s", (), {}, "delta", {"name": "c", "uri": "jdbc:postgresql://h/d", "driver": "d"})
    parts: dict[str, Any] = dict(
        conn_id="cat", host="h", port=None, schema="d", login=None, password=None, extra={}
    )
    with pytest.raises(
        VitessConnectionError,
        match=r"connection 'cat' has type 'mysql'; an Iceberg JDBC catalog needs a 'postgres'",
    ):
        IcebergCatalog.from_connection(conn_type="mysql", **parts)
    with pytest.raises(
        VitessConnectionError, match=r"unknown extra\(s\) 'warehose'.*known: catalog, sslmode, warehouse"
    ):
        IcebergCatalog.from_connection(conn_type="postgres", **{**parts, "extra": {"warehose": "s3a://x"}})
    with pytest.raises(VitessConnectionError, match=r"needs the database's host and its name"):
        IcebergCatalog.from_connection(conn_type="postgres", **{**parts, "schema": None})
    with pytest.raises(VitessConnectionError, match=r"sslmode must be one of"):
        IcebergCatalog.from_connection(conn_type="postgres", **{**parts, "extra": {"sslmode": "on"}})
    plain = IcebergCatalog.from_connection(conn_type="postgres", **parts)
    # Without a catalog name the connection's id names it; without credentials, none are passed.
    assert (plain.name, plain.uri, plain.environment()) == ("cat", "jdbc:postgresql://h/d", {})
    assert plain.spark_conf("s3a://lake") == {
        "type": "jdbc",
        "uri": "jdbc:postgresql://h/d",
        "warehouse": "s3a://lake",
        "jdbc.schema-version": "V1",
    }
