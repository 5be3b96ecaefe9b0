"""An Iceberg table's commits as the merge reads them: versions, rollbacks, windows and marks.

Pure logic over two of Iceberg's metadata tables, read by :mod:`.formats.iceberg`:

* ``metadata_log_entries``: one row per metadata file, oldest first, with the snapshot it made
  current and that snapshot's sequence number. Iceberg numbers every snapshot it commits one
  higher than the last (a replace too; never reused), and a rollback makes an older snapshot
  current again, so the current sequence number drops. The merge's *version* of an Iceberg table
  is the current snapshot's sequence number less one, so that a table's first commit is version
  0 as in Delta, and a version below the one the sync recorded means the table was rolled back or
  recreated (``.integrity``).
* ``snapshots``: each snapshot's parent and summary. A window's commit carries the sync's app id,
  the window's seq and its mark (:mod:`.marks`) in its summary (:data:`APP`, :data:`WINDOW`,
  :data:`MARK`); the windows a table holds are those of the current snapshot and its ancestors.
  A replace starts a new line of ancestry (its snapshot has no parent), and holds the window
  that replaced the table.

Iceberg has no transaction id that makes a write skip itself, as Delta's ``txnAppId`` does: the
format asks :func:`txn_version` before each write instead, under the sync's lock (one writer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from airflow_provider_vitess.merge.job.marks import parse_mark

# The snapshot summary keys a window's commit carries.
APP, WINDOW, MARK = "vitess.app", "vitess.window", "vitess.mark"


@dataclass(frozen=True)
class LogEntry:
    """A row of ``metadata_log_entries``: the snapshot a metadata file made current (None: the
    table had none yet) and its sequence number."""

    snapshot_id: int | None
    sequence_number: int | None


@dataclass(frozen=True)
class Snapshot:
    """A row of ``snapshots``."""

    snapshot_id: int
    parent_id: int | None
    summary: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Commits:
    """What the merge reads of a table's commits."""

    version: int | None  # the current snapshot's sequence number less one; None: no snapshot yet
    snapshot_id: int | None
    txn_version: int | None  # the highest window seq of the app the current line holds
    restores: tuple[int, ...] = ()
    marks: Mapping[int, str] = field(default_factory=dict)


def version_of(sequence_number: int) -> int:
    return sequence_number - 1


def read_commits(
    entries: Iterable[LogEntry], snapshots: Iterable[Snapshot], app_id: str, restores_after: int | None
) -> Commits:
    """The table's version, the windows of ``app_id`` its current snapshot's line holds, and with
    ``restores_after`` the rollbacks and the windows' marks after that version."""
    log = list(entries)
    if not log or log[-1].snapshot_id is None or log[-1].sequence_number is None:
        return Commits(None, None, None)
    current, version = log[-1].snapshot_id, version_of(log[-1].sequence_number)
    by_id = {s.snapshot_id: s for s in snapshots}
    sequence = {e.snapshot_id: e.sequence_number for e in log if e.snapshot_id is not None}
    line = list(_line(by_id, current))
    held = [
        int(s.summary[WINDOW])
        for s in line
        if s.summary.get(APP) == app_id and _is_int(s.summary.get(WINDOW))
    ]
    txn = max(held) if held else None
    if restores_after is None:
        return Commits(version, current, txn)
    marks: dict[int, str] = {}
    for s in line:
        seq = sequence.get(s.snapshot_id)
        if seq is not None and version_of(seq) > restores_after and s.summary.get(APP) == app_id:
            parsed = parse_mark(s.summary.get(MARK))
            if parsed is not None:
                marks[parsed[0]] = parsed[1]
    return Commits(version, current, txn, _rollbacks(log, restores_after), marks)


def snapshot_at(entries: Iterable[LogEntry], version: int) -> int | None:
    """The snapshot that was current at ``version`` (None: not in the metadata log any more)."""
    for e in entries:
        if e.sequence_number is not None and version_of(e.sequence_number) == version:
            return e.snapshot_id
    return None


def _line(by_id: Mapping[int, Snapshot], current: int) -> Iterable[Snapshot]:
    """The current snapshot and its ancestors, newest first (as far as they are kept)."""
    seen: set[int] = set()
    at: int | None = current
    while at is not None and at in by_id and at not in seen:
        seen.add(at)
        yield by_id[at]
        at = by_id[at].parent_id


def _rollbacks(log: list[LogEntry], after: int) -> tuple[int, ...]:
    """The versions the table was rolled back to, by a rollback made once it had reached
    ``after``: a metadata file whose snapshot's sequence number is below one made current before
    it."""
    found: list[int] = []
    highest: int | None = None
    for e in log:
        if e.sequence_number is None:
            continue
        if highest is not None and e.sequence_number < highest and version_of(highest) >= after:
            found.append(version_of(e.sequence_number))
        highest = e.sequence_number if highest is None else max(highest, e.sequence_number)
    return tuple(found)


def _is_int(text: str | None) -> bool:
    return text is not None and text.isdigit()
