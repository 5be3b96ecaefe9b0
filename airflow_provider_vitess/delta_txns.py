"""The transaction versions a Delta table holds, read from its ``_delta_log`` without Spark.

The capture side (an Airflow worker, no JVM) asks one question of a target before a sync's
first snapshot: does the table already hold windows of this sync (``txn`` actions with its app
id)? A checkpoint store that has never seen the sync while its targets do is a replaced or
restored store, and a snapshot numbered from window 1 would be taken for already applied.

A table's transactions are the latest ``txn`` action per app id over its log: the last classic
checkpoint (``_last_checkpoint`` names it; single- or multi-part Parquet) plus every commit
file after it. Log formats this reader does not know (V2 checkpoints with sidecars) give
``None`` for "cannot tell", never an empty answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import fsspec

_COMMIT = re.compile(r"^(\d{20})\.json$")


def txn_app_id(sync_id: str, table: str) -> str:
    """The Delta transaction app id under which ``sync_id`` writes ``table`` (its version is the
    window seq): one per table, so each table's progress is its own."""
    return f"airflow-provider-vitess:{sync_id}:{table}"


def transaction_versions(
    path: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, int] | None:
    """``{app id: version}`` of the Delta table at ``path``: ``{}`` when no table is there,
    ``None`` when its log is in a form this reader cannot follow."""
    fs, root = fsspec.core.url_to_fs(path, **dict(storage_options or {}))
    log_dir = f"{root.rstrip('/')}/_delta_log"
    if not fs.exists(log_dir):
        return {}
    names = {name.rsplit("/", 1)[-1] for name in fs.ls(log_dir, detail=False)}
    versions: dict[str, int] = {}
    after = -1
    if "_last_checkpoint" in names:
        with fs.open(f"{log_dir}/_last_checkpoint", "r") as f:
            last = json.load(f)
        after = int(last["version"])
        if last.get("v2Checkpoint") is not None:
            return None
        parts = int(last.get("parts") or 0)
        files = (
            [f"{log_dir}/{after:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
            if parts
            else [f"{log_dir}/{after:020d}.checkpoint.parquet"]
        )
        for name in files:
            if not fs.exists(name):
                return None
            versions.update(_checkpoint_txns(fs, name))
    commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)) and int(m.group(1)) > after)
    for version in commits:
        with fs.open(f"{log_dir}/{version:020d}.json", "r") as f:
            for line in f:
                txn = json.loads(line).get("txn") if line.strip() else None
                if txn is not None:
                    versions[str(txn["appId"])] = int(txn["version"])
    return versions


def _checkpoint_txns(fs: Any, name: str) -> dict[str, int]:
    import pyarrow.parquet as pq

    with fs.open(name, "rb") as f:
        column = pq.read_table(f, columns=["txn"]).column("txn").to_pylist()
    return {str(t["appId"]): int(t["version"]) for t in column if t is not None}
