"""The follow loop's sequencing (``capture/follow.py``): a round at once, one per change after,
the end when the source is quiet or the time is spent. A clock of its own: no waiting."""

from __future__ import annotations

import pytest

from airflow_provider_vitess.capture.follow import QUIET, SPENT, FollowBounds, follow


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_round_at_once_then_one_per_change_until_the_source_is_quiet() -> None:
    clock = Clock()
    rounds: list[float] = []
    # Changes found at the checks made at these times; every round takes 2 s.
    changes_at = {2.0, 5.0}

    def round_() -> int:
        rounds.append(clock.now)
        clock.now += 2.0
        return len(rounds)

    def changed() -> bool:
        return clock.now in changes_at

    outcome = follow(
        round_, changed, FollowBounds(600, idle_seconds=10, poll_seconds=1), clock=clock, sleep=clock.sleep
    )
    # 0: the first round; 2: a change at once; 4: none, 5: one after a poll; then quiet from 7 to 17.
    assert rounds == [0.0, 2.0, 5.0]
    assert outcome.results == [1, 2, 3] and outcome.stopped == QUIET
    assert clock.now == 17.0


def test_a_busy_source_ends_the_follow_when_its_seconds_are_spent() -> None:
    clock = Clock()
    count = 0

    def round_() -> None:
        nonlocal count
        count += 1
        clock.now += 3.0

    outcome = follow(round_, lambda: True, FollowBounds(10, idle_seconds=60), clock=clock, sleep=clock.sleep)
    # Rounds start at 0, 3, 6 and 9 (before 10 s); the one from 9 runs to its end at 12.
    assert count == 4 and outcome.stopped == SPENT and clock.now == 12.0


def test_a_quiet_source_near_the_end_stops_at_the_end_not_after_the_idle_time() -> None:
    clock = Clock()
    outcome = follow(lambda: None, lambda: False, FollowBounds(5, idle_seconds=60, poll_seconds=1),
                     clock=clock, sleep=clock.sleep)  # fmt: skip
    assert outcome.stopped == SPENT and clock.now == 5.0 and len(outcome.results) == 1


@pytest.mark.parametrize("field", ["seconds", "idle_seconds", "poll_seconds"])
def test_bounds_must_be_positive(field: str) -> None:
    given = {"seconds": 1.0, "idle_seconds": 1.0, "poll_seconds": 1.0, field: 0.0}
    with pytest.raises(ValueError, match=f"follow: {field} must be more than 0"):
        FollowBounds(**given)
