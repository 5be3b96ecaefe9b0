"""Asset URIs, asset event extras and OpenLineage names of a sync's tables."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_vitess.checkpoints import WindowKind
from airflow_provider_vitess.get_provider_info import get_provider_info
from airflow_provider_vitess.lineage import assets
from airflow_provider_vitess.lineage.uris import (
    convert_asset_to_openlineage,
    location_dataset,
    location_uri,
    vitess_dataset,
)
from airflow_provider_vitess.merge.report import (
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
)
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

COMMITTED = Vgtid(
    (
        ShardGtid("customer", "-80", "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"),
        ShardGtid("customer", "80-", "MySQL56/4e11fa47-71ca-11e1-9e33-c80aa9429562:1-9"),
    )
)


@pytest.mark.parametrize(
    ("location", "uri", "dataset"),
    [
        ("/lake/delta/t/", "file:///lake/delta/t", ("file", "/lake/delta/t")),
        ("file:/lake/delta/t", "file:///lake/delta/t", ("file", "/lake/delta/t")),
        ("s3a://bucket/delta/t", "s3://bucket/delta/t", ("s3://bucket", "delta/t")),
        ("S3://bucket/delta/t/", "s3://bucket/delta/t", ("s3://bucket", "delta/t")),
        (
            "abfss://c@acct.dfs.core.windows.net/t",
            "abfss://c@acct.dfs.core.windows.net/t",
            ("abfss://c@acct.dfs.core.windows.net", "t"),
        ),
    ],
)
def test_a_delta_location_is_an_asset_uri_and_an_openlineage_dataset(
    location: str, uri: str, dataset: tuple[str, str]
) -> None:
    assert location_uri(location) == uri
    assert tuple(location_dataset(location)) == dataset


def test_table_uris_follow_the_merge_targets() -> None:
    uris = assets.table_uris("/lake/delta/", ["a", "b"], {"b": {"path": "s3a://other/b"}})
    assert uris == {"a": "file:///lake/delta/a", "b": "s3://other/b"}


def test_vitess_asset_uri_is_checked_and_normalized_by_the_provider_handler() -> None:
    # Through Airflow's own Asset: the provider's asset-uris entry registers the handler.
    asset = Asset("vitess://VTGATE.example/customer/corder")
    assert asset.uri == "vitess://vtgate.example:15991/customer/corder"
    dataset = convert_asset_to_openlineage(asset, None)
    assert (dataset.namespace, dataset.name) == ("vitess://vtgate.example:15991", "customer.corder")
    assert tuple(vitess_dataset("vtgate.example:15991", "customer", "corder")) == (
        dataset.namespace,
        dataset.name,
    )
    with pytest.raises(ValueError, match="keyspace"):
        Asset("vitess://vtgate.example:15991/only_a_table")


def test_provider_info_names_importable_asset_functions() -> None:
    (entry,) = get_provider_info()["asset-uris"]
    assert entry["schemes"] == ["vitess"]
    for key in ("handler", "factory", "to_openlineage_converter"):
        module, _, name = entry[key].rpartition(".")
        assert callable(getattr(importlib.import_module(module), name))


def _report() -> MergeReport:
    written = TableResult(
        "customer",
        "/d/customer",
        TableStatus.WRITTEN,
        WriteMode.MERGE,
        5,
        1,
        9,
        rows_inserted=2,
        rows_updated=3,
    )
    return MergeReport(
        "s",
        (
            WindowResult(
                4,
                (
                    written,
                    TableResult("corder", "/d/corder", TableStatus.NO_CHANGES),
                    TableResult("item", "/d/item", TableStatus.ALREADY_APPLIED),
                ),
            ),
        ),
    )


def test_events_only_for_tables_the_window_changed_with_their_counts() -> None:
    events = assets.window_events(_report(), 4, "catchup", COMMITTED, "2026-11-28T10:00:00+00:00")
    assert set(events) == {"customer", "item"}, "corder had no changes: no event"
    assert events["customer"] == {
        "sync_id": "s",
        "window_seq": 4,
        "kind": "catchup",
        "table": "customer",
        "committed_vgtid": json.loads(COMMITTED.to_json()),
        "mode": "merge",
        "rows_inserted": 2,
        "rows_updated": 3,
        "rows_deleted": 1,
        "table_version": 9,
        "delta_version": 9,
        "table_format": "delta",
        "as_of": "2026-11-28T10:00:00+00:00",
    }
    # An earlier, failed try wrote it: the event is still due, its counts are not known here.
    assert (events["item"]["rows_inserted"], events["item"]["rows_deleted"]) == (None, None)


def test_an_iceberg_tables_event_names_its_snapshot_and_catalog_not_a_delta_version() -> None:
    written = TableResult(
        "customer", "s3a://lake/shop/customer", TableStatus.WRITTEN, rows_inserted=1, table_version=3,
        table_format="iceberg", snapshot_id=8123, catalog="lake",
    )  # fmt: skip
    report = MergeReport("s", (WindowResult(4, (written,)),))
    extra = assets.window_events(report, 4, "catchup", COMMITTED)["customer"]
    assert {
        k: extra[k] for k in ("table_version", "delta_version", "table_format", "snapshot_id", "catalog")
    } == {
        "table_version": 3,
        "delta_version": None,
        "table_format": "iceberg",
        "snapshot_id": 8123,
        "catalog": "lake",
    }


def test_window_kind_tells_a_re_snapshot_from_the_first_snapshot() -> None:
    assert assets.window_kind(WindowKind.SNAPSHOT, streamed_before=False) == "snapshot"
    assert assets.window_kind(WindowKind.SNAPSHOT, streamed_before=True) == "re-snapshot"
    assert assets.window_kind(WindowKind.CATCHUP, streamed_before=True) == "catchup"


def test_outlets_are_withheld_then_only_changed_tables_come_back_with_their_extra() -> None:
    other = Asset("file:///elsewhere")
    task = SimpleNamespace(outlets=[other])
    uris = assets.declare(task, "/lake/delta", ["customer", "corder"])
    assert [o.uri for o in task.outlets] == ["file:///elsewhere", *uris.values()]
    assert assets.declare(SimpleNamespace(outlets=[]), "{{ var.value.lake }}", ["customer"]) == {}

    task.outlets = assets.withhold(task.outlets, uris)
    assert task.outlets == [other]
    outlet_events = OutletEventAccessors()  # Airflow's own (3.1's Asset is not hashable)
    emitted = assets.emit(task, {"outlet_events": outlet_events}, uris, {"customer": {"rows_inserted": 1}})
    assert emitted == ["file:///lake/delta/customer"]
    assert task.outlets == [other, Asset(uri="file:///lake/delta/customer")]
    assert outlet_events[Asset(uri="file:///lake/delta/customer")].extra == {"rows_inserted": 1}


def test_the_provider_works_without_the_openlineage_provider() -> None:
    # A fresh interpreter where importing the OpenLineage client and extractors fails, as on an
    # install without the extra (the provider package itself stays: Airflow's provider discovery
    # finds its metadata; the Spark provider's compat shim handles a missing client itself).
    script = (
        "import sys\n"
        "for name in ('openlineage', 'airflow.providers.openlineage.extractors'):\n"
        "    sys.modules[name] = None\n"
        "from airflow_provider_vitess.dag_factory import vitess_sync_dag\n"
        "dag = vitess_sync_dag('d', keyspace='k', tables=['t'], staging_location='/s',\n"
        "                      target_location='/d')\n"
        "print(sorted(o.uri for o in dag.get_task('merge').outlets))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    # The last line: Airflow 3.1/3.2 log their alembic plugins' setup to stdout.
    assert out.strip().splitlines()[-1] == "['file:///d/t']"
