"""What one run of the merge job did, per window and table: the job's answer to the operator.

The job prints it as one stdout line ``VITESS_MERGE_REPORT <json>`` (and writes the JSON to
``--report-file`` when given); :func:`parse_report_line` finds it in a captured log. A window is
MERGED for the checkpoint store once every table of it is ``written``, ``already_applied`` or
``no_changes``: all three mean the Delta table holds the window.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from airflow_provider_vitess.merge.plan import MergePlanError
from airflow_provider_vitess.utils.jsondoc import JsonDocument, null_is

REPORT_PREFIX = "VITESS_MERGE_REPORT "
PROGRESS_PREFIX = "VITESS_MERGE_PROGRESS "


class TableStatus(str, enum.Enum):
    WRITTEN = "written"  # this run committed the window to the table
    ALREADY_APPLIED = "already_applied"  # the table's transaction version already covers the window
    NO_CHANGES = "no_changes"  # the window has nothing for the table; nothing to commit


class WriteMode(str, enum.Enum):
    MERGE = "merge"
    REPLACE = "replace"  # created or overwritten from the window's rows


@dataclass(frozen=True)
class TableResult(JsonDocument):
    table: str
    path: str
    status: TableStatus
    mode: WriteMode = WriteMode.MERGE
    rows_upserted: int = 0  # rows_inserted + rows_updated
    rows_deleted: int = 0
    delta_version: int | None = None  # the commit that holds the window (written only)
    schema_changes: Annotated[tuple[str, ...], null_is(())] = ()
    files_touched: int | None = None  # files the MERGE rewrote or marked (deletion vectors)
    rows_inserted: int = 0  # a replace inserts every row it writes
    rows_updated: int = 0
    # ``delta_version`` by its format-neutral name (the version of the table's format that holds
    # the window): both are written, either read; given one, the other is the same number.
    table_version: int | None = None
    # The table's format, and the Iceberg snapshot of ``table_version`` (Iceberg's time travel
    # names a snapshot, not our version): what the store records for the consistent cut. A report
    # without them (written before they were) is Delta's, without a snapshot.
    table_format: str = "delta"
    snapshot_id: int | None = None
    # The JDBC catalog an Iceberg table is named in (None: named by its location).
    catalog: str | None = None

    @model_serializer(mode="wrap")
    def _omit_delta(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A Delta table's result is written as before Iceberg (neither key), as the plan is."""
        out: dict[str, Any] = handler(self)
        if self.table_format == "delta":
            out.pop("table_format", None)
        if self.snapshot_id is None:
            out.pop("snapshot_id", None)
        if self.catalog is None:
            out.pop("catalog", None)
        return out

    def __post_init__(self) -> None:
        if self.table_version is None:
            object.__setattr__(self, "table_version", self.delta_version)
        elif self.delta_version is None:
            object.__setattr__(self, "delta_version", self.table_version)
        elif self.table_version != self.delta_version:
            raise ValueError(
                f"table {self.table}: table_version {self.table_version} and delta_version "
                f"{self.delta_version} are two names of one version and must agree"
            )


@dataclass(frozen=True)
class WindowResult:
    seq: int
    tables: tuple[TableResult, ...]

    def table(self, name: str) -> TableResult:
        return next(t for t in self.tables if t.table == name)


@dataclass(frozen=True)
class MergeReport(JsonDocument):
    sync_id: str
    windows: tuple[WindowResult, ...] = field(default_factory=tuple)
    document = "merge report"
    error = MergePlanError

    def window(self, seq: int) -> WindowResult:
        return next(w for w in self.windows if w.seq == seq)

    def merged_seqs(self) -> list[int]:
        """Windows the Delta tables now hold (every one of a report of a finished run)."""
        return [w.seq for w in self.windows]

    def statuses(self) -> dict[tuple[int, str], TableStatus]:
        return {(w.seq, t.table): t.status for w in self.windows for t in w.tables}


def parse_report_line(lines: Iterable[str]) -> MergeReport | None:
    """The report printed by the job among ``lines`` (e.g. a spark-submit log), or None."""
    found = None
    for line in lines:
        at = line.find(REPORT_PREFIX)
        if at >= 0:
            found = MergeReport.from_json(line[at + len(REPORT_PREFIX) :].strip())
    return found
