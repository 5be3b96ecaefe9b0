"""The JSON documents keep their format across the move to typed models (``utils/jsondoc.py``).

Each ``OLD_*`` text below was written by the hand-written ``to_dict``/``to_json`` code these
models replaced (commit 82da136): it must load, and what we write back must be the same document,
so a window staged, a plan built or a report kept by either version is read by the other. A bad
document fails naming its file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_vitess.exceptions import CorruptStagedDataError, MergePlanError
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.merge.job import main
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.report import (
    MergeReport,
    TableResult,
    TableStatus,
    WindowResult,
    WriteMode,
)
from airflow_provider_vitess.staging.manifest import DdlRecord, Manifest, PartInfo, load_manifest
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid

_ID = '{"name":"id","type":"INT64","column_type":"bigint","nullable":false,"arrow":"int64","charset":0,"decimals":0,"column_length":0}'  # noqa: E501
_NOTE = '{"name":"note","type":"VARCHAR","column_type":"varchar(10)","nullable":true,"arrow":"string","charset":45,"decimals":0,"column_length":40}'  # noqa: E501
_PRICE = '{"name":"price","type":"DECIMAL","column_type":"decimal(10,2)","nullable":true,"arrow":"decimal128(10, 2)","charset":0,"decimals":2,"column_length":12}'  # noqa: E501
OLD_MANIFEST = f"""{{"format_version": 1, "sync_id": "orders", "window_seq": 7,
 "start_vgtid": [{{"keyspace": "customer", "shard": "-80", "gtid": "MariaDB/0-1-5", "table_p_ks": []}}],
 "stop_vgtid": [{{"keyspace": "customer", "shard": "-80", "gtid": "MariaDB/0-1-9", "table_p_ks": []}}],
 "end_vgtid": [{{"keyspace": "customer", "shard": "-80", "gtid": "MariaDB/0-1-9", "table_p_ks": []}}],
 "created_at": "2026-11-24T19:00:00+00:00",
 "tables": {{"corder": {{"keyspaces": ["customer"], "key_columns": ["id"],
  "op_counts": {{"insert": 4, "update": 1}},
  "schemas": [{{"columns": [{_ID}, {_NOTE}], "key_columns": ["id"]}},
              {{"columns": [{_ID}, {_NOTE}, {_PRICE}], "key_columns": ["id"]}}],
  "parts": [{{"path": "corder/part-00001.parquet", "rows": 3, "bytes": 1200, "sha256": "{"a" * 64}",
              "schema": 0, "op_counts": {{"insert": 3}}, "keyspaces": ["customer"]}},
            {{"path": "corder/part-00002.parquet", "rows": 2, "bytes": 1300, "sha256": "{"b" * 64}",
              "schema": 1, "op_counts": {{"insert": 1, "update": 1}}, "keyspaces": ["customer"]}}]}}}},
 "ddls": [{{"keyspace": "customer", "shard": "-80", "statement": "alter table corder add price decimal(10,2)",
           "commit_ts": 1700000000}}],
 "stats": {{"rows": 5}}}}"""
# TableSchema.to_json of the second schema: the identity a part records in the checkpoint store.
SCHEMA_2 = (
    '{"columns":[{"arrow":"int64","charset":0,"column_length":0,"column_type":"bigint","decimals":0,'
    '"name":"id","nullable":false,"type":"INT64"},{"arrow":"string","charset":45,"column_length":40,'
    '"column_type":"varchar(10)","decimals":0,"name":"note","nullable":true,"type":"VARCHAR"},'
    '{"arrow":"decimal128(10, 2)","charset":0,"column_length":12,"column_type":"decimal(10,2)",'
    '"decimals":2,"name":"price","nullable":true,"type":"DECIMAL"}],"key_columns":["id"]}'
)
# PartInfo.to_dict: what the capture runner keeps per part in the checkpoint store.
OLD_PART = {
    "table": "corder", "path": "corder/part-00002.parquet", "rows": 2, "bytes": 1300, "sha256": "b" * 64,
    "schema_json": SCHEMA_2, "op_counts": {"insert": 1, "update": 1}, "keyspaces": ["customer"],
}  # fmt: skip
OLD_PLAN = (
    '{"sync_id": "orders", "targets": {"corder": {"key_columns": ["order_id"], "key_from_source": ["id"], '
    '"last_delta_version": 12, "last_merged_seq": 6, "path": "/delta/corder", "renames": {"id": "order_id"}, '
    '"table": "corder"}}, "windows": [{"manifest_path": "/stage/orders/window=0000000007/_manifest.json", '
    '"replace_tables": ["corder"], "seq": 7}]}'
)
OLD_REPORT = (
    '{"sync_id": "orders", "windows": [{"seq": 7, "tables": [{"delta_version": 13, "files_touched": 2, '
    '"mode": "replace", "path": "/delta/corder", "rows_deleted": 0, "rows_inserted": 5, "rows_updated": 0, '
    '"rows_upserted": 5, "schema_changes": ["add column price decimal(10,2)"], "status": "written", '
    '"table": "corder"}]}]}'
)
OLD_KEY = {
    "table": "corder", "source_columns": ["id"], "target_columns": ["order_id"], "source_index": "PRIMARY",
    "reason": "the primary key", "target_from_source": ["id"],
}  # fmt: skip


def test_a_manifest_of_the_previous_format_loads_and_is_written_back_the_same() -> None:
    m = Manifest.from_json(OLD_MANIFEST)
    end = Vgtid((ShardGtid("customer", "-80", "MariaDB/0-1-9"),))
    assert (m.sync_id, m.window_seq, m.stop_vgtid, m.end_vgtid) == ("orders", 7, end, end)
    assert m.start_vgtid == Vgtid((ShardGtid("customer", "-80", "MariaDB/0-1-5"),))
    table = m.tables["corder"]
    assert [s.names for s in table.schemas] == [("id", "note"), ("id", "note", "price")]
    assert [(p.path, p.rows, p.schema_json) for p in table.parts] == [
        ("corder/part-00001.parquet", 3, table.schemas[0].to_json()),
        ("corder/part-00002.parquet", 2, SCHEMA_2),
    ]
    assert table.parts[1] == PartInfo.from_dict(OLD_PART)
    assert table.schema_of(table.parts[1]).columns[2].decimals == 2
    assert dict(table.op_counts) == {"insert": 4, "update": 1} and m.rows == 5
    assert m.ddls == (DdlRecord("customer", "-80", "alter table corder add price decimal(10,2)", 1700000000),)
    assert (dict(m.stats), m.created_at) == ({"rows": 5}, "2026-11-24T19:00:00+00:00")
    # Byte for byte what the previous writer wrote for this manifest (json.dumps, indent=1).
    assert m.to_json() == json.dumps(json.loads(OLD_MANIFEST), indent=1, ensure_ascii=False)


def test_a_part_kept_by_the_previous_runner_loads_and_is_kept_the_same() -> None:
    part = PartInfo.from_dict(OLD_PART)
    assert (part.table, part.rows, part.bytes, dict(part.op_counts), part.keyspaces) == (
        "corder", 2, 1300, {"insert": 1, "update": 1}, ("customer",)
    )  # fmt: skip
    assert part.to_dict() == OLD_PART


def test_a_plan_of_the_previous_format_loads_and_is_written_back_the_same() -> None:
    plan = MergePlan.from_json(OLD_PLAN)
    target = TableTarget("corder", "/delta/corder", ("order_id",), ("id",), {"id": "order_id"}, 6, 12)
    window = WindowToMerge(7, "/stage/orders/window=0000000007/_manifest.json", ("corder",))
    assert plan == MergePlan("orders", (window,), {"corder": target})
    assert json.loads(plan.to_json()) == json.loads(OLD_PLAN)


def test_a_hand_written_plan_may_leave_optional_fields_out_or_null() -> None:
    plan = MergePlan.from_json(
        '{"sync_id": "s", "windows": [{"seq": 1, "manifest_path": "/m", "replace_tables": null}],'
        ' "targets": {"t": {"table": "t", "path": "/d/t", "key_columns": ["id"], "key_from_source": ["id"],'
        ' "renames": null}}}'
    )
    assert plan.windows == (WindowToMerge(1, "/m"),)
    assert plan.targets == {"t": TableTarget("t", "/d/t", ("id",), ("id",))}


def test_a_report_of_the_previous_format_loads_and_is_written_back_the_same() -> None:
    report = MergeReport.from_json(OLD_REPORT)
    result = TableResult(
        "corder", "/delta/corder", TableStatus.WRITTEN, WriteMode.REPLACE, 5, 0, 13,
        ("add column price decimal(10,2)",), 2, 5, 0,
    )  # fmt: skip
    assert report == MergeReport("orders", (WindowResult(7, (result,)),))
    assert result.table_version == 13  # the format-neutral name of delta_version
    # Written back with the neutral name beside the old one (docs/changelog.md).
    written = json.loads(OLD_REPORT)
    written["windows"][0]["tables"][0]["table_version"] = 13
    assert json.loads(report.to_json()) == written


def test_a_report_carrying_only_the_neutral_version_name_reads_as_both() -> None:
    text = OLD_REPORT.replace('"delta_version": 13', '"table_version": 13')
    result = MergeReport.from_json(text).window(7).table("corder")
    assert (result.table_version, result.delta_version) == (13, 13)
    disagreeing = OLD_REPORT.replace('"delta_version": 13', '"delta_version": 13, "table_version": 14')
    with pytest.raises(MergePlanError, match="table_version 14 and delta_version 13 are two names of one"):
        MergeReport.from_json(disagreeing)


def test_a_key_choice_recorded_by_the_previous_runner_loads_and_is_recorded_the_same() -> None:
    choice = KeyChoice.from_dict(OLD_KEY)
    assert choice == KeyChoice("corder", ("id",), ("order_id",), "PRIMARY", "the primary key", ("id",))
    assert choice.to_dict() == OLD_KEY


def test_a_bad_manifest_names_its_file_and_field(tmp_path: Path) -> None:
    wdir = tmp_path / "orders" / "window=0000000007"
    wdir.mkdir(parents=True)
    bad = OLD_MANIFEST.replace('"rows": 2', '"rows": "2"')
    bad = bad.replace('"commit_ts": 1700000000', '"commit_ts": 1.5')
    (wdir / "_manifest.json").write_text(bad)
    with pytest.raises(CorruptStagedDataError) as err:
        load_manifest(str(tmp_path), "orders", 7)
    assert str(err.value) == (
        f"manifest {wdir / '_manifest.json'} is not a valid staging manifest: "
        "tables.corder.parts.1.rows: Input should be a valid integer, got string; "
        "ddls.0.commit_ts: Input should be a valid integer, got number"
    )


def test_a_part_naming_a_schema_the_manifest_lacks_is_refused() -> None:
    with pytest.raises(CorruptStagedDataError) as err:
        Manifest.from_json(OLD_MANIFEST.replace('"schema": 1,', '"schema": 5,'), source="manifest m.json")
    assert str(err.value) == (
        "manifest m.json is not a valid staging manifest: "
        "tables.corder.parts.1.schema: 5 is not one of the table's 2 schemas"
    )


def test_a_bad_plan_file_names_its_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, report_file = tmp_path / "plan.json", tmp_path / "report.json"
    plan_file.write_text(OLD_PLAN.replace('"seq": 7', '"seq": "seven"'))
    assert main.main(["--plan-file", str(plan_file), "--report-file", str(report_file)]) == 2
    error = json.loads(report_file.read_text())
    assert error == {
        "error": f"plan file {plan_file} is not a valid merge plan: "
        "windows.0.seq: Input should be a valid integer, unable to parse string as an integer, got string",
        "type": "MergePlanError",
        "permanent": True,
    }
    assert f"merge failed: plan file {plan_file}" in capsys.readouterr().err


def test_a_bad_report_names_its_source_and_field() -> None:
    bad = OLD_REPORT.replace('"status": "written"', '"status": "done"')
    with pytest.raises(MergePlanError) as err:
        MergeReport.from_json(bad, source="report x.json")
    assert str(err.value) == (
        "report x.json is not a valid merge report: windows.0.tables.0.status: "
        "Input should be 'written', 'already_applied' or 'no_changes', got string"
    )
