"""What one run of the merge job did, per window and table: the job's answer to the operator.

The job prints it as one stdout line ``VITESS_MERGE_REPORT <json>`` (and writes the JSON to
``--report-file`` when given); :func:`parse_report_line` finds it in a captured log. A window is
MERGED for the checkpoint store once every table of it is ``written``, ``already_applied`` or
``no_changes``: all three mean the Delta table holds the window.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess.merge.plan import MergePlanError

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
class TableResult:
    table: str
    path: str
    status: TableStatus
    mode: WriteMode = WriteMode.MERGE
    rows_upserted: int = 0  # rows_inserted + rows_updated
    rows_deleted: int = 0
    delta_version: int | None = None  # the commit that holds the window (written only)
    schema_changes: tuple[str, ...] = ()
    files_touched: int | None = None  # files the MERGE rewrote or marked (deletion vectors)
    rows_inserted: int = 0  # a replace inserts every row it writes
    rows_updated: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "path": self.path,
            "status": self.status.value,
            "mode": self.mode.value,
            "rows_upserted": self.rows_upserted,
            "rows_deleted": self.rows_deleted,
            "delta_version": self.delta_version,
            "schema_changes": list(self.schema_changes),
            "files_touched": self.files_touched,
            "rows_inserted": self.rows_inserted,
            "rows_updated": self.rows_updated,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableResult:
        return cls(
            table=str(d["table"]),
            path=str(d["path"]),
            status=TableStatus(d["status"]),
            mode=WriteMode(d.get("mode", "merge")),
            rows_upserted=int(d.get("rows_upserted", 0)),
            rows_deleted=int(d.get("rows_deleted", 0)),
            delta_version=None if d.get("delta_version") is None else int(d["delta_version"]),
            schema_changes=tuple(map(str, d.get("schema_changes") or ())),
            files_touched=None if d.get("files_touched") is None else int(d["files_touched"]),
            rows_inserted=int(d.get("rows_inserted", 0)),
            rows_updated=int(d.get("rows_updated", 0)),
        )


@dataclass(frozen=True)
class WindowResult:
    seq: int
    tables: tuple[TableResult, ...]

    def table(self, name: str) -> TableResult:
        return next(t for t in self.tables if t.table == name)

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "tables": [t.to_dict() for t in self.tables]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WindowResult:
        return cls(int(d["seq"]), tuple(TableResult.from_dict(t) for t in d["tables"]))


@dataclass(frozen=True)
class MergeReport:
    sync_id: str
    windows: tuple[WindowResult, ...] = field(default_factory=tuple)

    def window(self, seq: int) -> WindowResult:
        return next(w for w in self.windows if w.seq == seq)

    def merged_seqs(self) -> list[int]:
        """Windows the Delta tables now hold (every one of a report of a finished run)."""
        return [w.seq for w in self.windows]

    def statuses(self) -> dict[tuple[int, str], TableStatus]:
        return {(w.seq, t.table): t.status for w in self.windows for t in w.tables}

    def to_json(self) -> str:
        return json.dumps(
            {"sync_id": self.sync_id, "windows": [w.to_dict() for w in self.windows]}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> MergeReport:
        try:
            d = json.loads(text)
            return cls(str(d["sync_id"]), tuple(WindowResult.from_dict(w) for w in d["windows"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise MergePlanError(f"not a valid merge report: {exc!r}") from None


def parse_report_line(lines: Iterable[str]) -> MergeReport | None:
    """The report printed by the job among ``lines`` (e.g. a spark-submit log), or None."""
    found = None
    for line in lines:
        at = line.find(REPORT_PREFIX)
        if at >= 0:
            found = MergeReport.from_json(line[at + len(REPORT_PREFIX) :].strip())
    return found
