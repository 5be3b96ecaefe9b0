"""An ``aws`` connection -> s3fs options, the merge job's environment, S3A settings (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE, HADOOP_AWS_PACKAGE, packages_for
from airflow_provider_vitess.object_storage import Credentials, S3Settings, is_s3_url
from airflow_provider_vitess.operators._sync import s3_settings

ENDPOINT = "http://127.0.0.1:9000"
PROVIDER = "org.apache.hadoop.fs.s3a."


def _settings(
    extra: dict[str, Any], login: str | None = "AKID", password: str | None = "s3cr3t"
) -> S3Settings:
    return S3Settings.from_connection(
        conn_id="lake", conn_type="aws", login=login, password=password, extra=extra
    )


def test_an_s3_compatible_connection_gives_path_style_options_to_both_sides() -> None:
    s3 = _settings({"endpoint_url": ENDPOINT, "region_name": "eu-west-3"})
    assert s3.storage_options() == {
        "key": "AKID",
        "secret": "s3cr3t",
        "endpoint_url": ENDPOINT,
        "client_kwargs": {"region_name": "eu-west-3"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }
    assert s3.hadoop_conf() == {
        "spark.hadoop.fs.s3a.access.key": "AKID",
        "spark.hadoop.fs.s3a.secret.key": "s3cr3t",
        "spark.hadoop.fs.s3a.aws.credentials.provider": PROVIDER + "SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.endpoint": ENDPOINT,
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
        "spark.hadoop.fs.s3a.path.style.access": "true",
    }


def test_the_job_environment_round_trips_and_names_the_standard_aws_variables() -> None:
    s3 = _settings(
        {"endpoint_url": ENDPOINT, "region_name": "us-east-1", "aws_session_token": "tok"},
    )
    env = s3.environment()
    assert env == {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ENDPOINT_URL_S3": ENDPOINT,
        "AWS_REGION": "us-east-1",
        "VITESS_S3_ADDRESSING_STYLE": "path",
    }
    back = S3Settings.from_environment({**env, "PATH": "/bin"})
    assert back is not None
    assert back.hadoop_conf() == s3.hadoop_conf()
    assert back.hadoop_conf()["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )
    assert S3Settings.from_environment({"PATH": "/bin"}) is None


def test_aws_itself_is_addressed_by_host_and_without_keys_uses_the_default_chain() -> None:
    s3 = _settings({"region_name": "us-west-2"}, login=None, password=None)
    assert s3.storage_options() == {"client_kwargs": {"region_name": "us-west-2"}}
    assert s3.hadoop_conf() == {"spark.hadoop.fs.s3a.endpoint.region": "us-west-2"}
    virtual = _settings({"endpoint_url": ENDPOINT, "config_kwargs": {"s3": {"addressing_style": "virtual"}}})
    assert "spark.hadoop.fs.s3a.path.style.access" not in virtual.hadoop_conf()
    assert virtual.storage_options()["config_kwargs"] == {"s3": {"addressing_style": "virtual"}}


def test_the_secrets_stay_out_of_repr() -> None:
    s3 = _settings({"endpoint_url": ENDPOINT, "aws_session_token": "tok"})
    assert "s3cr3t" not in repr(s3) and "tok" not in repr(s3)
    assert set(s3.secrets) == {"s3cr3t", "tok"}


@pytest.mark.parametrize(
    ("conn_type", "extra", "login", "password", "message"),
    [
        ("postgres", {}, "a", "b", "needs an 'aws' connection"),
        ("aws", {"role_arn": "arn:aws:iam::1:role/x"}, "a", "b", "'role_arn' choose the credentials through"),
        ("aws", {"profile_name": "dev"}, None, None, "'profile_name' choose the credentials through"),
        ("aws", {"endpoint": ENDPOINT}, "a", "b", "unknown extra(s) 'endpoint'"),
        ("aws", {"endpoint_url": "127.0.0.1:9000"}, "a", "b", "must start with http"),
        ("aws", {}, "a", None, "without a secret key"),
        ("aws", {"config_kwargs": {"s3": {"addressing_style": "sideways"}}}, "a", "b", "addressing_style"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    conn_type: str, extra: dict[str, Any], login: str | None, password: str | None, message: str
) -> None:
    with pytest.raises(VitessConnectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        S3Settings.from_connection(
            conn_id="lake", conn_type=conn_type, login=login, password=password, extra=extra
        )


def test_the_operators_read_the_airflow_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_S3",
        json.dumps(
            {"conn_type": "aws", "login": "AKID", "password": "s/3+cr=t", "extra": {"endpoint_url": ENDPOINT}}
        ),
    )
    s3 = s3_settings("lake_s3")
    assert s3 is not None and s3.secret_access_key == "s/3+cr=t" and s3.endpoint_url == ENDPOINT
    assert s3_settings(None) is None


def test_keys_the_amazon_providers_hook_resolved_replace_the_connections() -> None:
    extra = {"role_arn": "arn:aws:iam::1:role/lake", "endpoint_url": ENDPOINT}
    s3 = S3Settings.from_connection(
        conn_id="lake", conn_type="aws", login="SOURCE", password="source-secret", extra=extra,
        resolved=Credentials("ASIA1", "temp-secret", "temp-token"),
    )  # fmt: skip
    keys = (s3.access_key_id, s3.secret_access_key, s3.session_token)
    assert keys == ("ASIA1", "temp-secret", "temp-token")
    provider = s3.hadoop_conf()["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert provider == PROVIDER + "TemporaryAWSCredentialsProvider"
    assert s3.storage_options()["token"] == "temp-token" and s3.endpoint_url == ENDPOINT


def _profile_connection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``lake_s3`` names profile ``lake`` of a shared credentials file, as a user's ``~/.aws`` would."""
    credentials = tmp_path / "credentials"
    credentials.write_text("[lake]\naws_access_key_id = AKPROFILE\naws_secret_access_key = profile-s3cr3t\n")
    (tmp_path / "config").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_S3",
        json.dumps({"conn_type": "aws", "extra": {"profile_name": "lake", "endpoint_url": ENDPOINT}}),
    )


def test_a_profile_is_resolved_by_the_amazon_providers_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    masked: list[str] = []
    # The hook masks what it resolves with the mask_secret its module bound at import.
    from airflow.providers.amazon.aws.hooks import base_aws

    monkeypatch.setattr(base_aws, "mask_secret", lambda secret, name=None: masked.append(secret))
    _profile_connection(monkeypatch, tmp_path)
    s3 = s3_settings("lake_s3")
    assert s3 is not None
    assert (s3.access_key_id, s3.secret_access_key) == ("AKPROFILE", "profile-s3cr3t")
    assert s3.endpoint_url == ENDPOINT
    # Not the connection's password, which Airflow masks by itself: the hook masks it as it resolves it.
    assert "profile-s3cr3t" in masked, masked


def test_without_the_amazon_provider_a_profile_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    _profile_connection(monkeypatch, tmp_path)
    with pytest.raises(VitessConnectionError, match="pip install apache-airflow-providers-amazon"):
        s3_settings("lake_s3")


def test_s3a_jars_are_added_only_for_s3_locations() -> None:
    assert is_s3_url("s3a://lake/x") and is_s3_url("S3://lake") and not is_s3_url("/tmp/s3a://x")
    assert packages_for(["/tmp/lake/delta/t", "file:///tmp/stage"]) == DELTA_PACKAGE
    assert (
        packages_for(["/tmp/lake/delta/t", "s3a://lake/staging/x"]) == f"{DELTA_PACKAGE},{HADOOP_AWS_PACKAGE}"
    )


def _merge_operator(monkeypatch: pytest.MonkeyPatch, master: str) -> Any:
    from airflow_provider_vitess.operators.merge import VitessMergeOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": master}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_S3",
        json.dumps(
            {"conn_type": "aws", "login": "AKID", "password": "s3cr3t", "extra": {"endpoint_url": ENDPOINT}}
        ),
    )
    return VitessMergeOperator(
        task_id="merge", sync_id="s", target_location="s3a://lake/d", conn_id="spark_x", aws_conn_id="lake_s3"
    )


def _submit_job(op: Any) -> Any:
    """The SparkSubmitHook the merge's spark-submit backend runs for a plan."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    plan = MergePlan("s", (WindowToMerge(1, "s3a://lake/stage/s/window=0000000001/_manifest.json"),), {})
    return SparkSubmitHook(**op._make_backend().job(plan, Path("/tmp/plan.json"), Path("/tmp/report.json")))


def test_the_merge_gets_the_keys_in_its_process_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    op = _merge_operator(monkeypatch, "local[2]")
    hook = _submit_job(op)
    assert hook._env_vars["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"
    assert "s3cr3t" not in str(op.env_vars), "the secret went into a rendered field"
    assert "s3cr3t" not in " ".join(hook._build_spark_submit_command(op.application))


@pytest.mark.parametrize("master", ["yarn", "k8s://https://kube:6443"])
def test_masters_that_put_the_environment_on_the_command_line_are_refused(
    monkeypatch: pytest.MonkeyPatch, master: str
) -> None:
    with pytest.raises(VitessConnectionError, match="command line"):
        _submit_job(_merge_operator(monkeypatch, master))
