"""Item by item: the task page's extra links, the sensor's deferrable default, templated
connection ids and how the UI renders the dict arguments (no server needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.get_provider_info import get_provider_info
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.plugins.links import (
    DeltaTableLink,
    SparkUILink,
    VitessSyncStatusLink,
    location_url,
    spark_history_url,
    status_page_url,
)
from airflow_provider_vitess.sensors.changes import VitessChangesSensor

SYNC: dict[str, Any] = {
    "sync_id": "orders",
    "keyspace": "customer",
    "tables": ["corder"],
    "staging_location": "/s",
}


def _sensor(**kwargs: Any) -> VitessChangesSensor:
    return VitessChangesSensor(
        task_id="wait", sync_id="orders", keyspace="customer", tables="corder", **kwargs
    )


@pytest.mark.parametrize(("setting", "expected"), [(None, False), ("True", True), ("False", False)])
def test_the_sensor_defers_as_airflow_default_deferrable_says(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, expected: bool
) -> None:
    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    assert _sensor().deferrable is expected
    assert _sensor(deferrable=not expected).deferrable is (not expected), "an explicit value wins"


def test_connection_ids_are_templated_and_dicts_render_as_json() -> None:
    for operator in (VitessSnapshotOperator, VitessCatchUpOperator):
        assert {"vitess_conn_id", "checkpoint_conn_id", "key_columns", "key_overrides"} <= set(
            operator.template_fields
        )
        assert operator.template_fields_renderers == {
            "storage_options": "json",
            "key_columns": "json",
            "key_overrides": "json",
            "include_columns": "json",
            "exclude_columns": "json",
            "hash_columns": "json",
        }
    assert {"vitess_conn_id", "checkpoint_conn_id"} <= set(VitessChangesSensor.template_fields)
    assert {"checkpoint_conn_id", "targets", "spark_history_url"} <= set(VitessMergeOperator.template_fields)
    assert VitessMergeOperator.template_fields_renderers["targets"] == "json"


def test_templated_connection_ids_are_rendered(tmp_path: Path) -> None:
    op = VitessSnapshotOperator(
        task_id="snap",
        vitess_conn_id="{{ params.vitess }}",
        checkpoint_conn_id="meta_{{ params.env }}",
        **SYNC,
    )
    op.render_template_fields({"params": {"vitess": "vitess_prod", "env": "prod"}})
    assert (op.vitess_conn_id, op.checkpoint_conn_id) == ("vitess_prod", "meta_prod")


def test_link_urls() -> None:
    assert status_page_url("http://af:8080", "orders") == "http://af:8080/vitess/#orders"
    assert status_page_url("", "a b/c") == "/vitess/#a%20b%2Fc"
    assert location_url("/lake/delta/../delta") == "file:///lake/delta"
    assert location_url("s3a://lake/delta") == "s3a://lake/delta"
    assert location_url(None) == ""
    assert spark_history_url("http://hist:18080/", "local-1700000000000") == (
        "http://hist:18080/history/local-1700000000000/"
    )
    assert spark_history_url(None, "app-1") == "" and spark_history_url("http://h", None) == ""


def test_each_operator_links_to_the_status_page_and_the_merge_to_its_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.internal:8080/")
    merge = VitessMergeOperator(
        task_id="merge",
        sync_id="orders",
        target_location="/lake/delta",
        spark_history_url="http://hist:18080",
    )
    links = {link.name: link for link in merge.operator_extra_links}
    assert set(links) == {"Vitess sync status", "Delta tables", "Spark UI"}
    assert (
        links["Vitess sync status"].get_link(merge, ti_key=None)
        == "http://airflow.internal:8080/vitess/#orders"
    )
    assert links["Delta tables"].get_link(merge, ti_key=None) == "file:///lake/delta"
    assert links["Spark UI"].get_link(merge, ti_key=None) == "", "no application id before the job ran"
    merge.spark_application_id = "local-1764000000000"
    assert links["Spark UI"].get_link(merge, ti_key=None) == "http://hist:18080/history/local-1764000000000/"
    for op in (VitessSnapshotOperator(task_id="s", **SYNC), _sensor(deferrable=True)):
        [link] = op.operator_extra_links
        assert link.get_link(op, ti_key=None) == "http://airflow.internal:8080/vitess/#orders"


def test_the_provider_registers_its_links_and_plugin() -> None:
    info = get_provider_info()
    assert info["extra-links"] == [
        f"{cls.__module__}.{cls.__qualname__}" for cls in (VitessSyncStatusLink, DeltaTableLink, SparkUILink)
    ]
    assert info["plugins"] == [
        {"name": "vitess_status", "plugin-class": "airflow_provider_vitess.plugins.status.VitessStatusPlugin"}
    ]
    assert info["config"]["vitess"]["options"]["status_checkpoint_conn_ids"]["default"] == "default"
