"""Assets of a sync: one per Delta table, and one asset event per table a window changed.

A downstream DAG scheduled on a table's Asset runs when a merge changed that table, and reads in
the event's ``extra`` which window did it and how many rows moved (:func:`event_extra`). A table
the window did not touch (``no_changes`` in the merge report) gets no event.

Airflow registers an event for *every* outlet of a successful task, so the merge task declares
all its tables' Assets at parse time (:func:`declare`: the DAG graph and the asset views show
them), withholds them when it starts (:func:`withhold`) and puts back the changed ones with their
extra (:func:`emit`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_vitess.checkpoints import WindowKind
from airflow_provider_vitess.lineage.uris import location_uri
from airflow_provider_vitess.merge.plan import target_path
from airflow_provider_vitess.merge.report import MergeReport, TableResult, TableStatus
from airflow_provider_vitess.vgtid import Vgtid

# A window that copied tables of a sync that already streams re-snapshots them.
RESNAPSHOT = "re-snapshot"
# The table holds the window after these; an already applied table was written by an earlier,
# failed try of the task, whose event was never emitted.
_CHANGED = (TableStatus.WRITTEN, TableStatus.ALREADY_APPLIED)


def table_uris(
    target_location: str, tables: Iterable[str], targets: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str]:
    """Each table's Asset URI, from where the merge writes it (``targets`` overrides paths)."""
    return {t: location_uri(target_path(target_location, t, targets)) for t in tables}


def window_kind(kind: WindowKind | None, streamed_before: bool) -> str:
    """``snapshot``, ``catchup`` or ``re-snapshot`` (a snapshot of a sync that already streamed)."""
    if kind is WindowKind.SNAPSHOT and streamed_before:
        return RESNAPSHOT
    return WindowKind(kind).value


def event_extra(
    sync_id: str, seq: int, kind: str, committed: Vgtid, result: TableResult, as_of: str | None = None
) -> dict[str, Any]:
    """The ``extra`` of one table's asset event. Row counts are None when this try of the task
    did not write the table itself (an earlier try did: ``already_applied``). ``as_of``: every
    source transaction committed before it is in the table (ISO 8601, UTC). An Iceberg table's
    has the snapshot that holds the window, which Iceberg's time travel reads, and the JDBC
    catalog it is named in (None: a Hadoop catalog's, by its location); no ``delta_version``."""
    counted = result.status is TableStatus.WRITTEN
    iceberg = result.table_format == "iceberg"
    return {
        "sync_id": sync_id,
        "window_seq": seq,
        "kind": kind,
        "table": result.table,
        "committed_vgtid": json.loads(committed.to_json()),
        "mode": result.mode.value,
        "rows_inserted": result.rows_inserted if counted else None,
        "rows_updated": result.rows_updated if counted else None,
        "rows_deleted": result.rows_deleted if counted else None,
        "table_version": result.table_version,
        # Its name before table formats, kept for Delta's consumers.
        "delta_version": None if iceberg else result.delta_version,
        "table_format": result.table_format,
        **({"snapshot_id": result.snapshot_id, "catalog": result.catalog} if iceberg else {}),
        "as_of": as_of,
    }


def changed_tables(report: MergeReport, seq: int) -> list[TableResult]:
    """The tables window ``seq`` changed, by the merge report (none when it has no such window)."""
    window = next((w for w in report.windows if w.seq == seq), None)
    return [] if window is None else [t for t in window.tables if t.status in _CHANGED]


def window_events(
    report: MergeReport, seq: int, kind: str, committed: Vgtid, as_of: str | None = None
) -> dict[str, dict[str, Any]]:
    """``{table: extra}`` for each table window ``seq`` changed."""
    return {
        t.table: event_extra(report.sync_id, seq, kind, committed, t, as_of)
        for t in changed_tables(report, seq)
    }


def declare(
    task: Any,
    target_location: str,
    tables: Sequence[str] | None,
    targets: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Add each table's Asset to ``task``'s outlets (DAG parse time); returns ``{table: uri}``.
    Nothing when the tables are not known or the location is a template (rendered at run time)."""
    if not tables or "{{" in target_location:
        return {}
    from airflow.sdk import Asset

    uris = table_uris(target_location, tables, targets)
    task.outlets = [*task.outlets, *(Asset(uri=u) for u in uris.values())]
    return uris


def withhold(outlets: Sequence[Any], uris: Mapping[str, str]) -> list[Any]:
    """``outlets`` without the sync's table Assets: set at the start of a run, so that a run
    ending early (nothing to merge) or failing to report emits no event for them."""
    from airflow.sdk import Asset

    ours = set(uris.values())
    return [o for o in outlets if not (isinstance(o, Asset) and o.uri in ours)]


def emit(
    task: Any, context: Mapping[str, Any], uris: Mapping[str, str], events: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Put the changed tables' Assets back among ``task``'s outlets, each with its extra (Airflow
    registers one event per outlet when the task succeeds); returns their URIs. A table whose
    Asset was not declared gets no event (Airflow knows no such Asset)."""
    from airflow.sdk import Asset

    emitted = []
    for table, extra in events.items():
        if table in uris:
            asset = Asset(uri=uris[table])
            if asset not in task.outlets:  # a follow task's tables change round after round
                task.outlets = [*task.outlets, asset]
            context["outlet_events"][asset].extra = dict(extra)
            emitted.append(asset.uri)
    return emitted
