"""A window read by shard groups: its one manifest, made of the groups' own (``capture/groups.py``).

Each group staged its part into the window's directory (part files named with the group) with a
manifest of its own. The window's manifest lists every group's parts, table by table, as if one
process had staged them: the merge, the look-back of later windows, retention and the checks read
it as any window's. Its end position is every group's end (each names its own shards); counts add
up; per shard figures are joined; a bound that stopped a group early is the window's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging.manifest import (
    GROUP_READS,
    Manifest,
    PartInfo,
    TableManifest,
    TableSchema,
)
from airflow_provider_vitess.staging.writer import utc_now
from airflow_provider_vitess.vgtid import Vgtid

_SUMMED = (
    "rows",
    "units",
    "journals",
    "rows_behind_copy",
    "partial_rows_discarded",
    "spilled_transactions",
    "reconnects",
)
_JOINED = ("rows_per_table", "shard_lag_transactions")


def combine(start: Vgtid, stop: Vgtid | None, parts: Sequence[Manifest]) -> Manifest:
    """The window's manifest over the groups' ``parts`` (in group order); ``stop`` None: a
    snapshot's (copied to the end of each group's copy)."""
    if not parts:
        raise StagingError("a window read by shard groups needs every group's manifest")
    first = parts[0]
    names = sorted({t for m in parts for t in m.tables})
    tables = {name: _table(name, [m.tables[name] for m in parts if name in m.tables]) for name in names}
    ends = [sg for m in parts for sg in m.end_vgtid.shard_gtids]
    order = {(sg.keyspace, sg.shard): i for i, sg in enumerate(start.shard_gtids)}
    ends.sort(key=lambda sg: order.get((sg.keyspace, sg.shard), len(order)))
    return Manifest(
        sync_id=first.sync_id,
        window_seq=first.window_seq,
        start_vgtid=start,
        stop_vgtid=stop,
        end_vgtid=Vgtid(tuple(ends)),
        tables=tables,
        ddls=tuple(d for m in parts for d in m.ddls),
        stats={**_stats([m.stats for m in parts]), GROUP_READS: _reads(parts)},
        created_at=utc_now().isoformat(),
        location=first.location,
        storage_options=first.storage_options,
    )


def _table(name: str, shares: Sequence[TableManifest]) -> TableManifest:
    parts: list[PartInfo] = sorted((p for tm in shares for p in tm.parts), key=lambda p: p.path)
    schemas: dict[str, TableSchema] = {}
    for tm in shares:
        for schema in tm.schemas:
            schemas.setdefault(schema.to_json(), schema)
    ops: Counter[str] = Counter()
    for tm in shares:
        ops.update(tm.op_counts)
    keyspaces = dict.fromkeys(ks for tm in shares for ks in tm.keyspaces)
    return replace(
        shares[0],
        keyspaces=tuple(keyspaces),
        schemas=tuple(schemas.values()),
        parts=tuple(parts),
        op_counts=dict(sorted(ops.items())),
    )


def _stats(each: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = dict(each[0])  # keys and columns: the same for every group (checked)
    for key in ("keys", "columns"):
        if any(s.get(key) != each[0].get(key) for s in each):
            raise StagingError(
                f"the groups of a window staged with different {key!r}: {[s.get(key) for s in each]}"
            )
    for key in _SUMMED:
        out[key] = sum(int(s.get(key) or 0) for s in each)
    for key in _JOINED:
        joined: Counter[str] = Counter()
        for s in each:
            joined.update(dict(s.get(key) or {}))
        out[key] = dict(joined)
    out["stopped_early"] = next((s["stopped_early"] for s in each if s.get("stopped_early")), None)
    out["retired_shards"] = [r for s in each for r in (s.get("retired_shards") or ())]
    out["read_past_max_seconds"] = any(bool(s.get("read_past_max_seconds")) for s in each)
    tops = [int(s["source_ts_max"]) for s in each if s.get("source_ts_max")]
    out["source_ts_max"] = max(tops) if tops else None
    out["group_stats"] = [dict(s) for s in each]  # each group's own figures, for the status page
    return out


def _reads(parts: Sequence[Manifest]) -> list[dict[str, Any]]:
    """Each group's shards, how far its read went in source seconds (``read_to``: its
    ``source_ts_max``, the newest commit or heartbeat it saw; None when it saw none, as a short
    copy does) and when its part was staged (``ended_at``, seconds since the epoch: its
    manifest's ``created_at``, the worker's clock). A snapshot's groups end their copies apart
    (each when its own shards are copied): the merge's key-conflict check and order take each
    shard as read to its group's end, not the window's (``merge/job/conflicts.covered``)."""
    out = []
    for m in parts:
        shards = dict.fromkeys(sg.shard for v in (m.start_vgtid, m.end_vgtid) for sg in v.shard_gtids)
        top = m.stats.get("source_ts_max")
        try:
            ended: int | None = int(datetime.fromisoformat(m.created_at).timestamp())
        except ValueError:
            ended = None
        out.append({"shards": list(shards), "read_to": int(top) if top else None, "ended_at": ended})
    return out
