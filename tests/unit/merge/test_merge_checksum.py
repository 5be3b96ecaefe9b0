"""A Delta version's checksum file as the Spark Connect merge reads it (no Spark needed to parse).

The sample is the shape Delta 4.4 writes (``_delta_log/<version>.crc`` of a table the merge
wrote, cut to a few fields of each kind): fields the merge does not read are ignored, and a
fact the file leaves out is None, never a default that would pass for a fact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_vitess.merge.job.checksum import Checksum, checksum_path
from airflow_provider_vitess.merge.job.steps import TableSize

WRITTEN: dict[str, Any] = {
    "txnId": "29c1a39b-ef1c-4a95-99a5-b23fd107e0be",
    "tableSizeBytes": 387343,
    "numFiles": 3,
    "numDeletedRecordsOpt": 0,
    "numMetadata": 1,
    "numProtocol": 1,
    "setTransactions": [
        {"appId": "airflow-provider-vitess:s1:orders", "version": 7, "lastUpdated": 1795799016032},
        {"appId": "airflow-provider-vitess:s1:customer", "version": 5, "lastUpdated": 1795799016032},
    ],
    "domainMetadata": [],
    "metadata": {
        "id": "368c475d-e168-455b-a09d-a27fc68df8d6",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": '{"type":"struct","fields":[]}',
        "partitionColumns": [],
        "configuration": {"delta.enableDeletionVectors": "true", "delta.columnMapping.mode": "name"},
        "createdTime": 1795799014000,
    },
    "protocol": {"minReaderVersion": 3, "minWriterVersion": 7},
    "allFiles": [{"path": "part-0.parquet", "size": 387343, "dataChange": False}],
}


def test_a_written_checksum_gives_files_bytes_properties_and_each_app_ids_transaction() -> None:
    crc = Checksum.from_json(json.dumps(WRITTEN))
    assert crc.size == TableSize(3, 387343)
    assert crc.properties == {"delta.enableDeletionVectors": "true", "delta.columnMapping.mode": "name"}
    assert crc.knows_txns()
    assert crc.txn_version("airflow-provider-vitess:s1:orders") == 7
    assert crc.txn_version("airflow-provider-vitess:s1:customer") == 5
    assert crc.txn_version("airflow-provider-vitess:s2:orders") is None  # never written


def test_an_empty_transaction_list_says_no_app_id_wrote_the_table() -> None:
    crc = Checksum.from_json(json.dumps({**WRITTEN, "setTransactions": []}))
    assert crc.knows_txns() and crc.txn_version("airflow-provider-vitess:s1:orders") is None


@pytest.mark.parametrize(
    ("left_out", "unknown"),
    [
        ("setTransactions", "txns"),
        ("numFiles", "size"),
        ("tableSizeBytes", "size"),
        ("metadata", "properties"),
    ],
)
def test_a_fact_the_file_leaves_out_is_unknown_not_a_default(left_out: str, unknown: str) -> None:
    """Delta leaves ``setTransactions`` out past 100 app ids or with a retention property, and
    older writers other fields: the merge then asks the table (``connect.table_state``)."""
    crc = Checksum.from_json(json.dumps({k: v for k, v in WRITTEN.items() if k != left_out}))
    known = {"txns": crc.knows_txns(), "size": crc.size is not None, "properties": crc.properties is not None}
    assert [fact for fact, is_known in known.items() if not is_known] == [unknown]


def test_a_damaged_checksum_is_refused_naming_the_file() -> None:
    with pytest.raises(ValueError, match=r"^/t/_delta_log/00000000000000000012.crc is not a valid Delta"):
        Checksum.from_json('{"numFiles": "three"}', source=checksum_path("/t/", 12))
    with pytest.raises(ValueError, match="not a valid Delta checksum file"):
        Checksum.from_json('{"numFiles": 3', source="x")
