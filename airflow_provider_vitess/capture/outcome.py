"""What a capture run hands back: the staged window, the task summary and the metrics.

Pure values, no I/O: the operators turn them into an XCom value and Airflow metrics, so what a
task reports is decided here, next to the runner, and not in the Airflow edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.checkpoints import WindowKind
from airflow_provider_vitess.staging import Manifest
from airflow_provider_vitess.vgtid import Vgtid, transactions_missing
from airflow_provider_vitess.vstream.window import ReadResult


@dataclass(frozen=True)
class WindowOutcome:
    seq: int
    kind: WindowKind
    manifest: Manifest
    resumed: bool
    result: ReadResult | None  # None when the window had already been staged


@dataclass(frozen=True)
class SnapshotNeed:
    """Whether a snapshot task has work: ``tables`` to copy, or why not (``needed`` False)."""

    needed: bool
    tables: tuple[str, ...]
    resnapshot: bool  # the sync already streams: a re-snapshot of ``tables``
    committed_seq: int | None
    # What an unmerged snapshot window must hold to be resumed rather than replaced
    # (``SnapshotRun._replace_unmerged``): the tables asked for or needed now (``resnapshot_tables``,
    # tables that joined, every table of a first or forced snapshot), and whether a new copy was
    # asked for (``resnapshot_tables`` or ``only_if_needed=False``): then a staged one is replaced.
    fresh: tuple[str, ...] = ()
    asked: bool = False

    def not_needed(self, sync_id: str) -> dict[str, Any]:
        """The snapshot task's XCom value when there is nothing to copy."""
        return {"sync_id": sync_id, "snapshot": "not needed", "committed_seq": self.committed_seq}


def shard_lag(stop: Vgtid, reached: Vgtid, retired: Sequence[str] = ()) -> dict[str, int]:
    """Per shard, transactions of the stop position not yet read: 0 once a window is complete
    (also for a stop shard a reshard's journal retired: it has nothing more to read)."""
    lag = {}
    for sg in stop.shard_gtids:
        name = f"{sg.keyspace}/{sg.shard}"
        got = reached.shard(sg.keyspace, sg.shard)
        if got is None and name in retired:
            lag[name] = 0
            continue
        lag[name] = transactions_missing(got.gtid, sg.gtid) if got is not None and got.gtid else -1
    return lag


def summary(outcome: WindowOutcome) -> dict[str, Any]:
    """The XCom value of a capture task: what was staged, where, and up to which VGTID."""
    m = outcome.manifest
    return {
        "sync_id": m.sync_id,
        "window_seq": m.window_seq,
        "kind": outcome.kind.value,
        "resumed": outcome.resumed,
        "manifest_path": m.path,
        "rows": m.rows,
        "rows_per_table": {t: tm.rows for t, tm in m.tables.items()},
        "op_counts": {t: dict(tm.op_counts) for t, tm in m.tables.items()},
        "ddls": [d.to_dict() for d in m.ddls],
        "end_vgtid": m.end_vgtid.to_json(),
        "stats": dict(m.stats),
    }


def window_metrics(outcome: WindowOutcome, elapsed: float) -> dict[str, float]:
    """Gauges of a staged window (``vitess.snapshot.*`` / ``vitess.catch_up.*``): rows, and for
    a catch-up the per-shard lag behind its stop and the read rate."""
    m = outcome.manifest
    if outcome.kind is WindowKind.SNAPSHOT:
        return {"rows": m.rows}
    lag = dict(m.stats).get("shard_lag_transactions", {})
    values: dict[str, float] = {"events": m.rows}
    values.update({f"lag.{shard.replace('/', '.')}": n for shard, n in lag.items()})
    if outcome.result is not None and elapsed > 0:
        values["processed_per_second"] = outcome.result.rows / elapsed
    return values
