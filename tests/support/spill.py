"""What a spilling read leaves open: shared by the spill tests (unit) and the wide rows' (integration)."""

from __future__ import annotations

import os
from pathlib import Path


def spill_fds(directory: Path) -> list[str]:
    """This process's open files in ``directory`` (an anonymous spill file reads
    ``<dir>/#<inode> (deleted)`` in /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            out.append(target)
    return out
