"""The commit a write made, as the merge reads it from the version's commit file.

The sample is the shape Delta 4.4 writes for a MERGE (``_delta_log/<version>.json``: one action
per line, ``commitInfo`` first, cut to a few fields of each action)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_vitess.merge.job.delta_log import Commit, commit_info, log_file

COMMIT_INFO = {
    "timestamp": 1795810660083,
    "operation": "MERGE",
    "readVersion": 0,
    "operationMetrics": {
        "numTargetRowsDeleted": "2",
        "numTargetRowsUpdated": "15",
        "numTargetRowsInserted": "0",
        "numTargetFilesRemoved": "1",
        "numSourceRows": "17",
    },
    "engineInfo": "Apache-Spark/4.2.0 Delta-Lake/4.4.0",
}
TXN = {"txn": {"appId": "airflow-provider-vitess:s1:orders", "version": 7, "lastUpdated": 1795810660068}}
ADD = {"add": {"path": "part-0.parquet", "size": 2081, "dataChange": True}}


def lines(*actions: object) -> str:
    return "\n".join(json.dumps(a) for a in actions) + "\n"


def test_the_commit_info_action_gives_the_operation_and_its_metrics() -> None:
    text = lines({"commitInfo": COMMIT_INFO}, TXN, ADD)
    assert commit_info(text, 12) == Commit(
        12,
        "MERGE",
        {
            "numTargetRowsDeleted": "2",
            "numTargetRowsUpdated": "15",
            "numTargetRowsInserted": "0",
            "numTargetFilesRemoved": "1",
            "numSourceRows": "17",
        },
    )


def test_the_commit_info_is_found_on_any_line_and_metrics_may_be_absent() -> None:
    # Delta writes commitInfo first, but other writers need not; a WRITE of no rows has no metrics.
    info = {k: v for k, v in COMMIT_INFO.items() if k != "operationMetrics"} | {"operation": "WRITE"}
    assert commit_info(lines(TXN, ADD, {"commitInfo": info}), 3) == Commit(3, "WRITE", {})


def test_a_commit_without_commit_info_is_refused_naming_the_file() -> None:
    file = log_file("/lake/orders/", 12, "json")
    assert file == "/lake/orders/_delta_log/00000000000000000012.json"
    with pytest.raises(ValueError, match=r"00000000000000000012\.json has no commitInfo"):
        commit_info(lines(TXN, ADD), 12, file)
