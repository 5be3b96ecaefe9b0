"""Following a busy source in one task: catch up and merge, wait for the next change, again.

A run of an event-driven sync pays Airflow for every task it starts (a process, the DAG's
parse, the provider's imports) and for the deferral of its sensor: seconds each, more than a
small window's read and merge on a warm Spark Connect server. While changes keep coming, the
follow task (``operators/follow.py``) does the catch-up and the merge itself, window after
window, and watches the stream between them from its worker; when the source goes quiet (no
change for ``idle_seconds``) or its ``seconds`` are spent, the task ends and the next run's
deferred sensor waits in the triggerer again, holding no worker slot.

Pure sequencing: the round (catch up, merge and commit) and the change check are given; every
round is the catch-up task's and the merge task's own work, under the sync's lock, so a killed
follow task is rerun like those two tasks are (the windows' state is in the checkpoint store).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Result = TypeVar("Result")

# Why a follow ended (its summary says which).
SPENT = "follow_seconds"
QUIET = "idle_seconds"


@dataclass(frozen=True)
class FollowBounds:
    """How long one follow task goes on.

    :param seconds: its whole time: no round starts after it (the last round runs to its end).
    :param idle_seconds: it ends when no change came for this long after a round.
    :param poll_seconds: between two checks for a change.
    """

    seconds: float
    idle_seconds: float = 60.0
    poll_seconds: float = 0.5

    def __post_init__(self) -> None:
        for name in ("seconds", "idle_seconds", "poll_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"follow: {name} must be more than 0 seconds, got {getattr(self, name)!r}")


@dataclass
class FollowOutcome(Generic[Result]):
    """The rounds' results in order, and why the follow ended (:data:`SPENT` or :data:`QUIET`)."""

    results: list[Result] = field(default_factory=list)
    stopped: str = ""


def follow(
    round_: Callable[[], Result],
    changed: Callable[[], bool],
    bounds: FollowBounds,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> FollowOutcome[Result]:
    """Run ``round_`` (the first at once: whoever started the follow saw a change), then again
    each time ``changed()`` says the source has a change, until ``bounds.seconds`` are spent or
    no change came for ``bounds.idle_seconds``. ``changed()`` is asked anew after each round."""
    started = clock()
    outcome: FollowOutcome[Result] = FollowOutcome()
    outcome.results.append(round_())
    while True:
        now = clock()
        left = bounds.seconds - (now - started)
        if left <= 0:
            outcome.stopped = SPENT
            return outcome
        idle_until = now + min(bounds.idle_seconds, left)
        while not changed():
            if clock() >= idle_until:
                outcome.stopped = SPENT if clock() - started >= bounds.seconds else QUIET
                return outcome
            sleep(bounds.poll_seconds)
        outcome.results.append(round_())
