"""An append-only list of events that moves to a temporary file when asked, to bound memory.

A catch-up window must hold units back until their cross-shard order is known, and a single
transaction may hold any number of rows. Keeping both in memory would make a window's memory grow
with its size; releasing units early would make the order depend on arrival timing. Spilling
keeps both promises: the order stays exact, and memory holds at most what the caller allows.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from typing import IO, Any


class SpillableEvents:
    """Events in append order; ``spill()`` writes those in memory to disk (read back in order)."""

    __slots__ = ("_file", "_memory", "_memory_rows", "_spilled_rows")

    def __init__(self) -> None:
        self._memory: list[Any] = []
        self._memory_rows = 0
        self._spilled_rows = 0
        self._file: IO[bytes] | None = None

    def append(self, event: Any, rows: int = 0) -> None:
        self._memory.append(event)
        self._memory_rows += rows

    @property
    def memory_rows(self) -> int:
        """Rows held in memory (what counts against a memory bound)."""
        return self._memory_rows

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def spill(self) -> int:
        """Moves the in-memory events to disk; returns how many rows left memory."""
        if not self._memory:
            return 0
        if self._file is None:
            # Lives as long as the unit (closed by close()); deleted by the OS once closed.
            self._file = tempfile.TemporaryFile(prefix="vitess-window-")  # noqa: SIM115
        self._file.seek(0, 2)
        pickle.dump(self._memory, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        moved = self._memory_rows
        self._spilled_rows += moved
        self._memory, self._memory_rows = [], 0
        return moved

    def __iter__(self) -> Iterator[Any]:
        if self._file is not None:
            self._file.seek(0)
            while True:
                try:
                    chunk = pickle.load(self._file)
                except EOFError:
                    break
                yield from chunk
        yield from self._memory

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._memory, self._memory_rows = [], 0
