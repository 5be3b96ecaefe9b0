"""The Spark Connect mode's parts that need no server: its arguments, the SQL literals of MERGE,
and the process a Connect merge leaves behind (creating a remote session sends nothing)."""

from __future__ import annotations

import datetime
import os
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql.connect.client.core import SparkConnectClient
from pyspark.sql.connect.session import SparkSession as RemoteSession
from pyspark.sql.utils import is_remote

from airflow_provider_vitess.merge.job import run
from airflow_provider_vitess.merge.job.apply import sql_literal
from airflow_provider_vitess.merge.job.connect import (
    MODE_VARIABLES,
    TOKEN_ENV,
    _main,
    redacted,
    remote_sessions,
    run_merge,
    server_args,
    split_token,
)
from airflow_provider_vitess.merge.job.delta_access import is_connect
from airflow_provider_vitess.merge.plan import MergePlan, MergePlanError, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.spark_conf import (
    BASE_CONF,
    DELTA_PACKAGE,
    HADOOP_AWS_PACKAGE,
    connect_server_package,
)


def conf_of(args: list[str]) -> dict[str, str]:
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_the_server_runs_with_the_jobs_delta_and_session_settings_on_its_port() -> None:
    args = server_args(port=16123, local_dir="/tmp/x")
    server = connect_server_package()  # PySpark 3's server package; PySpark 4 ships it
    delta = f"{DELTA_PACKAGE},{server}" if server else DELTA_PACKAGE
    assert args[:2] == ["--packages", delta]
    conf = conf_of(args)
    assert {k: conf[k] for k in BASE_CONF} == dict(BASE_CONF)
    assert conf["spark.connect.grpc.binding.port"] == "16123"
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.local.dir"] == "/tmp/x"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert "spark.driver.extraJavaOptions" not in conf  # a long-lived JVM: C2's code pays back
    cluster = server_args(local=False, s3=True, authenticated=True)
    assert cluster[1] == f"{DELTA_PACKAGE},{HADOOP_AWS_PACKAGE}" + (f",{server}" if server else "")
    assert "spark.sql.shuffle.partitions" not in conf_of(cluster)
    assert conf_of(cluster)["spark.connect.grpc.binding.address"] == "0.0.0.0"


def test_an_iceberg_server_has_icebergs_runtime_extensions_and_jdbc_driver_or_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Iceberg's jars and SQL extensions are fixed when the server starts: ``--iceberg`` gives
    them for the installed Spark line, which the merge's sessions cannot add later; a line
    without Iceberg's runtime is refused by name."""
    from airflow_provider_vitess.merge.spark_conf import installed_spark_line
    from airflow_provider_vitess.versions import UnsupportedSparkVersionError

    line = installed_spark_line()
    if line.iceberg is None:
        with pytest.raises(UnsupportedSparkVersionError, match=f"Iceberg targets on Spark {line.spark}"):
            server_args(iceberg=True)
        assert _main(["server-args", "--iceberg"]) == 2
        assert f"Iceberg targets on Spark {line.spark}" in capsys.readouterr().err
        return
    args = server_args(iceberg=True)
    assert args[1].split(",")[1:3] == [line.iceberg, "org.postgresql:postgresql:42.7.14"]
    assert conf_of(args)["spark.sql.extensions"] == (
        "io.delta.sql.DeltaSparkSessionExtension,org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    )


def test_a_server_off_loopback_requires_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(
        ValueError,
        match=r"listens on 0\.0\.0\.0 and must require a token: set SPARK_CONNECT_AUTHENTICATE_TOKEN",
    ):
        server_args(local=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert _main(["server-args", "--cluster"]) == 2
    assert "must require a token" in capsys.readouterr().err
    monkeypatch.setenv(TOKEN_ENV, "a-secret-token")
    assert _main(["server-args", "--cluster"]) == 0
    printed = capsys.readouterr().out
    assert "spark.connect.grpc.binding.address=0.0.0.0" in printed and "a-secret-token" not in printed


def test_the_token_leaves_the_url_decoded_and_logs_see_it_redacted() -> None:
    url = "sc://vtgate-spark:15002/;user_id=me;token=ab/c%2Bd%3D;use_ssl=true"
    assert split_token(url) == ("sc://vtgate-spark:15002/;user_id=me;use_ssl=true", "ab/c+d=")
    assert redacted(url) == "sc://vtgate-spark:15002/;user_id=me;use_ssl=true;token=***"
    assert split_token("sc://localhost:15002") == ("sc://localhost:15002", None)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "'42'"),
        (-7, "'-7'"),
        (Decimal("-12.50"), "'-12.50'"),
        (1.5, "'1.5'"),
        (2.5e-300, "'2.5e-300'"),
        (datetime.date(1000, 1, 1), "DATE '1000-01-01'"),
        ("x", "CAST(X'78' AS STRING)"),
        # A quote, a backslash or a comment in a key value is only hex digits in the SQL.
        ("a';--\\", "CAST(X'61273b2d2d5c' AS STRING)"),
        ("é", "CAST(X'c3a9' AS STRING)"),
    ],
)
def test_key_values_become_sql_literals_that_no_value_can_end(value: object, text: str) -> None:
    assert sql_literal(value) == text


@pytest.mark.parametrize("value", [True, b"\x00", float("nan"), datetime.datetime(2026, 1, 1)])
def test_values_without_a_safe_literal_are_refused(value: object) -> None:
    with pytest.raises(TypeError, match="no SQL literal for key value"):
        sql_literal(value)


NOWHERE = "sc://127.0.0.1:1"  # no server: sessions are made, never used
PLAN = MergePlan(
    "s",
    (WindowToMerge(2, "/stage/s/window=0000000002/_manifest.json"),),
    {"t": TableTarget("t", "/d/t", ("id",), ("id",))},
)


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[SparkConnectClient]:
    """The sessions released on stop (the release would wait ten minutes for the absent server),
    in a process with no Connect mark."""
    for name in MODE_VARIABLES:
        monkeypatch.setenv(name, "")  # recorded: the test's end restores the variable, whatever it left
        monkeypatch.delenv(name)
    out: list[SparkConnectClient] = []
    # PySpark 3.5's client has no release_session: its session's stop() closes the client (more
    # than once: counted by client).
    stop = "release_session" if hasattr(SparkConnectClient, "release_session") else "close"
    monkeypatch.setattr(SparkConnectClient, stop, lambda self: out.append(self))
    return out


def mode() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in MODE_VARIABLES}


@pytest.mark.parametrize("fails", [False, True])
def test_a_connect_merge_leaves_the_process_for_classic_spark(
    monkeypatch: pytest.MonkeyPatch, released: list[SparkConnectClient], fails: bool
) -> None:
    seen: dict[str, Any] = {}

    def merge(spark: Any, plan: MergePlan, **kwargs: Any) -> MergeReport:
        other = kwargs["new_session"]()  # a second table's session
        seen.update(remote=is_remote(), sessions=[is_connect(spark), is_connect(other)], plan=plan)
        if fails:
            raise RuntimeError("the job failed")
        return MergeReport("s", ())

    monkeypatch.setattr(run, "merge", merge)
    if fails:
        with pytest.raises(RuntimeError, match="the job failed"):
            run_merge(NOWHERE, PLAN)
    else:
        assert run_merge(NOWHERE, PLAN) == MergeReport("s", ())
    assert seen == {"remote": True, "sessions": [True, True], "plan": PLAN}
    # Unmarked: the next classic session of this process (an Airflow worker's next task) works.
    assert mode() == dict.fromkeys(MODE_VARIABLES) and not is_remote()
    assert RemoteSession._default_session is None and RemoteSession.getActiveSession() is None
    assert len({id(c) for c in released}) == 2  # both sessions stopped


def test_blocks_at_once_keep_the_mark_until_the_last_ends_and_restore_what_was_there(
    monkeypatch: pytest.MonkeyPatch, released: list[SparkConnectClient]
) -> None:
    monkeypatch.setenv("SPARK_REMOTE", "sc://elsewhere:15002")  # the user's own, kept
    first, second = remote_sessions(NOWHERE), remote_sessions(NOWHERE)
    mine: Any = first.__enter__()()
    assert RemoteSession.getActiveSession() is mine and is_remote()
    second.__enter__()()
    first.__exit__(None, None, None)
    assert is_remote(), "the other block's merge still runs"
    assert RemoteSession.getActiveSession() is None and RemoteSession._default_session is None
    second.__exit__(None, None, None)
    assert mode() == {
        "SPARK_CONNECT_MODE_ENABLED": None,
        "SPARK_REMOTE": "sc://elsewhere:15002",
        "SPARK_LOCAL_REMOTE": None,
    }
    assert len({id(c) for c in released}) == 2


def test_a_connect_merge_refuses_by_name_the_settings_it_cannot_take() -> None:
    """spark-submit's arguments and the server's own settings would do nothing on a Connect
    merge: refused when the DAG is parsed, each named (they were accepted and ignored)."""
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    with pytest.raises(MergePlanError) as refused:
        VitessMergeOperator(
            task_id="merge",
            sync_id="s",
            target_location="/tmp/lake",
            spark_connect_conn_id="sc",
            conf={
                "spark.executor.memory": "4g",
                "spark.sql.extensions": "x",
                "spark.sql.shuffle.partitions": "3",
            },
            packages="io.delta:delta-spark_2.13:4.0.0",
            executor_cores=2,
        )
    text = str(refused.value)
    assert "conf 'spark.executor.memory', conf 'spark.sql.extensions', executor_cores, packages" in text
    assert "spark.sql.shuffle.partitions" not in text and "on the Connect server itself" in text


def test_a_connect_merge_applies_the_session_settings_it_is_given() -> None:
    from airflow_provider_vitess.dag_factory import vitess_sync_dag
    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkConnectMerge

    settings = {"spark.sql.shuffle.partitions": "3", "spark.databricks.delta.optimizeWrite.enabled": "true"}
    op = VitessMergeOperator(
        task_id="merge", sync_id="s", target_location="/tmp/lake", spark_connect_conn_id="sc", conf=settings
    )
    assert op.connect_conf == settings
    backend = op._make_backend()
    assert isinstance(backend, SparkConnectMerge) and backend.conf == settings  # every session sets them
    submit = VitessMergeOperator(task_id="merge", sync_id="s", target_location="/tmp/lake", conf=settings)
    assert submit.connect_conf == {} and (submit.conf or {})["spark.sql.shuffle.partitions"] == "3"
    with pytest.raises(MergePlanError, match=r"conf 'spark.jars.ivy' would do nothing there"):
        vitess_sync_dag(
            "connect_conf_dag",
            keyspace="customer",
            tables=["customer"],
            staging_location="/tmp/lake/staging",
            target_location="/tmp/lake/delta",
            schedule=None,
            spark_conf={"spark.jars.ivy": "/tmp/ivy"},
            merge_kwargs={"spark_connect_conn_id": "sc"},
        )
