"""The Spark Connect mode's pure parts: the server's arguments and the SQL literals of MERGE."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from airflow_provider_vitess.merge.apply import sql_literal
from airflow_provider_vitess.merge.connect import server_args
from airflow_provider_vitess.merge.spark_conf import BASE_CONF, DELTA_PACKAGE, HADOOP_AWS_PACKAGE


def conf_of(args: list[str]) -> dict[str, str]:
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_the_server_runs_with_the_jobs_delta_and_session_settings_on_its_port() -> None:
    args = server_args(port=16123, local_dir="/tmp/x")
    assert args[:2] == ["--packages", DELTA_PACKAGE]
    conf = conf_of(args)
    assert {k: conf[k] for k in BASE_CONF} == dict(BASE_CONF)
    assert conf["spark.connect.grpc.binding.port"] == "16123"
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.local.dir"] == "/tmp/x"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    cluster = server_args(local=False, s3=True)
    assert cluster[1] == f"{DELTA_PACKAGE},{HADOOP_AWS_PACKAGE}"
    assert "spark.sql.shuffle.partitions" not in conf_of(cluster)


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
