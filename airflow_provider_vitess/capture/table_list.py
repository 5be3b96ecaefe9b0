"""What a change of a sync's table list asks of its next run (pure).

The store records the sync's tables as its last run had them, and the tables that left it with
the window the sync had committed then (``removed_tables`` in the sync's config). A table new to
the list has no Delta table yet; one that left and came back has a Delta table that misses every
change made while it was out. Neither may be merged from a catch-up window: both are snapshotted
on their own first (a re-snapshot of those tables; the others keep streaming). A table that
leaves keeps its Delta table as it was, marked in the store with the window it stopped at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

REMOVED_TABLES = "removed_tables"


@dataclass(frozen=True)
class TableListChange:
    added: tuple[str, ...] = ()  # never in the sync before
    back: tuple[str, ...] = ()  # left the sync earlier, in it again
    removed: Mapping[str, int] = field(default_factory=dict)  # every table out: its last window

    @property
    def to_snapshot(self) -> tuple[str, ...]:
        return (*self.added, *self.back)

    def after_snapshot_of(self, tables: Sequence[str]) -> dict[str, int]:
        """The marks to record once ``tables`` were snapshotted (a table back is in again)."""
        return {t: seq for t, seq in self.removed.items() if t not in tables}


def table_list_change(
    recorded: Sequence[str] | None, marks: Mapping[str, int] | None, tables: Sequence[str], committed_seq: int
) -> TableListChange:
    """``recorded``: the tables of the sync's last run (None: a new sync); ``marks``: the
    recorded ``removed_tables``; ``tables``: the list now."""
    if recorded is None:
        return TableListChange()
    removed = {**{t: committed_seq for t in recorded if t not in tables}, **dict(marks or {})}
    return TableListChange(
        added=tuple(t for t in tables if t not in recorded and t not in removed),
        back=tuple(t for t in tables if t in removed),
        removed=removed,
    )
