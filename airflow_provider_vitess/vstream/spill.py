"""An append-only list of events that moves to a temporary file when asked, to bound memory.

A catch-up window must hold units back until their cross-shard order is known, and a single
transaction may hold any number of rows. Keeping both in memory would make a window's memory grow
with its size; releasing units early would make the order depend on arrival timing. Spilling
keeps both promises: the order stays exact, and memory holds at most what the caller allows.

The limits are in bytes (:class:`MemoryLimits`), because a row may be 50 bytes or 16 MiB; row
counts are a second guard for many tiny rows, whose Python objects outweigh their bytes.

Spill files are anonymous: created already unlinked in the spill directory (``O_TMPFILE``, or
unlinked right after creation where the filesystem lacks it), so no exit path (an error,
KeyboardInterrupt, SIGTERM, even SIGKILL) can leave one behind: the kernel frees the space when
the last descriptor closes, at :meth:`SpillableEvents.close` or at process exit.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from airflow_provider_vitess.exceptions import VitessProviderError

_SETTING = "spill_dir (operator argument, or [vitess] spill_dir in the Airflow configuration)"


@dataclass(frozen=True)
class MemoryLimits:
    """What a read holds in memory before it moves buffered events to ``spill_dir``.

    ``max_buffered_*``: units the cross-shard merge holds back, all shards together.
    ``transaction_*``: one transaction still open (its COMMIT not seen yet), as it arrives.
    Bytes count the serialized rows as vtgate sent them (what a buffered event holds) plus a
    small per-event overhead. ``spill_dir`` None is the system's temporary directory.
    """

    max_buffered_bytes: int = 64 << 20
    max_buffered_rows: int = 50_000
    transaction_bytes: int = 16 << 20
    transaction_rows: int = 20_000
    spill_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_buffered_bytes", "max_buffered_rows", "transaction_bytes", "transaction_rows"):
            if getattr(self, name) <= 0:
                raise VitessProviderError(f"memory limit {name} must be > 0, got {getattr(self, name)}")


def spill_directory(path: str | None) -> str:
    """The directory spill files go to (``None``: the system's temporary directory), checked
    now so a wrong setting fails before a read rather than at its first spill."""
    where = os.path.abspath(os.path.expanduser(path)) if path else tempfile.gettempdir()
    if not os.path.isdir(where):
        raise VitessProviderError(f"spill directory {where!r} does not exist: create it or change {_SETTING}")
    if not os.access(where, os.W_OK | os.X_OK):
        raise VitessProviderError(
            f"spill directory {where!r} is not writable by this process: fix its permissions or "
            f"change {_SETTING}"
        )
    return where


class SpillableEvents:
    """Events in append order; ``spill()`` writes those in memory to disk (read back in order).

    :param directory: where the spill file is created (None: the system's temporary directory).
    """

    __slots__ = ("_dir", "_file", "_memory", "_memory_bytes", "_memory_rows")

    def __init__(self, directory: str | None = None) -> None:
        self._dir = directory
        self._memory: list[Any] = []
        self._memory_rows = 0
        self._memory_bytes = 0
        self._file: IO[bytes] | None = None

    def append(self, event: Any, rows: int = 0, nbytes: int = 0) -> None:
        self._memory.append(event)
        self._memory_rows += rows
        self._memory_bytes += nbytes

    @property
    def memory_rows(self) -> int:
        """Rows held in memory (the secondary memory bound)."""
        return self._memory_rows

    @property
    def memory_bytes(self) -> int:
        """Bytes held in memory, as the appends counted them (the memory bound)."""
        return self._memory_bytes

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def spill(self) -> None:
        """Moves the in-memory events to disk."""
        if not self._memory:
            return
        try:
            if self._file is None:
                # Anonymous (see the module docstring); lives until close() or process exit.
                self._file = tempfile.TemporaryFile(prefix="vitess-window-", dir=self._dir)  # noqa: SIM115
            self._file.seek(0, 2)
            pickle.dump(self._memory, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as exc:
            where = self._dir or tempfile.gettempdir()
            raise VitessProviderError(
                f"cannot spill buffered events to {where!r}: {exc}; free space there or point {_SETTING} "
                "at a larger disk"
            ) from exc
        self._memory, self._memory_rows, self._memory_bytes = [], 0, 0

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
        """Frees the events and the spill file's space (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._memory, self._memory_rows, self._memory_bytes = [], 0, 0
