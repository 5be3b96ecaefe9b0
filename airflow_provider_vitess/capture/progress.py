"""Snapshot progress per table: rows known (``count(*)``), rows copied, percent (pure logic).

``rows_known`` arrives from a concurrent ``count(*)`` and may come after copying started, or
never (a huge table, a timeout): progress is still reported, without a percent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass
class LiveCopyProgress:
    """One table's copy as a running snapshot counts it, for the task log (what the store keeps
    per table is :class:`~airflow_provider_vitess.checkpoints.TableProgress`)."""

    table: str
    rows_known: int | None = None
    rows_copied: int = 0

    @property
    def percent(self) -> float | None:
        if self.rows_known is None:
            return None
        if self.rows_known == 0:
            return 100.0
        # Rows inserted while copying can push copied past the count taken earlier.
        return min(100.0, 100.0 * self.rows_copied / self.rows_known)

    def line(self) -> str:
        known = "?" if self.rows_known is None else f"{self.rows_known:,}"
        pct = "" if self.percent is None else f" ({self.percent:.1f}%)"
        return f"{self.table}: {self.rows_copied:,} of {known} rows copied{pct}"


class ProgressTracker:
    """Counts per table and emits a progress line per table at most every ``interval`` seconds."""

    def __init__(
        self,
        tables: Iterable[str],
        *,
        emit: Callable[[LiveCopyProgress], None],
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tables = {t: LiveCopyProgress(t) for t in tables}
        self._emit, self._interval, self._clock = emit, interval, clock
        self._last = clock()

    def set_known(self, table: str, rows: int) -> None:
        self.tables[table].rows_known = rows

    def add_copied(self, table: str, rows: int) -> None:
        progress = self.tables.get(table)
        if progress is not None:
            progress.rows_copied += rows
        if self._clock() - self._last >= self._interval:
            self.report()

    def report(self) -> None:
        self._last = self._clock()
        for progress in self.tables.values():
            self._emit(progress)
