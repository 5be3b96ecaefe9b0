"""The collector's view of a long read: what is alive when it starts is left alone.

A capture run reads for minutes and allocates millions of short-lived objects; each full
collection re-walks every object already alive (Airflow's and ours, imported once), which was
~30% of a read's CPU (``bench/bench_stage.py``). ``gc.freeze()`` moves those objects out of the
collector's generations. It is process-wide, so only the capture runner, which owns the task's
process while it reads, turns it on, and only around the read.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive on entry are not collected (nor walked) until the block ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
