"""Key ranges for the merge's data-skipping predicate."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pytest

from airflow_provider_vitess.merge.job.pruning import key_ranges, numeric_distance


def covers(ranges: list[tuple[int, int]], values: list[int]) -> bool:
    return all(any(lo <= v <= hi for lo, hi in ranges) for v in values)


def test_few_values_are_points() -> None:
    assert key_ranges([1, 5, 9], 4, numeric_distance) == [(1, 1), (5, 5), (9, 9)]
    assert key_ranges([], 4) == []


def test_split_at_the_largest_gaps() -> None:
    # Scattered updates of old rows plus a block of new ids: the block stays one tight range.
    old = [17, 5_000, 812_345]
    new = list(range(9_990_000, 9_999_000))
    ranges = key_ranges(old + new, 4, numeric_distance)
    assert ranges == [(17, 17), (5_000, 5_000), (812_345, 812_345), (9_990_000, 9_998_999)]


def test_ranges_always_cover_every_value_and_stay_within_the_limit() -> None:
    rng = random.Random(7)
    for _ in range(50):
        values = sorted(set(rng.randint(-(10**12), 10**12) for _ in range(rng.randint(1, 500))))
        n = rng.randint(1, 70)
        ranges = key_ranges(values, n, numeric_distance)
        assert len(ranges) <= n
        assert covers(ranges, values)
        assert all(lo <= hi for lo, hi in ranges)
        assert [lo for lo, _ in ranges] == sorted(lo for lo, _ in ranges)


def test_strings_are_cut_in_equal_chunks() -> None:
    values = [f"k{i:04d}" for i in range(100)]
    ranges = key_ranges(values, 4)
    assert ranges == [("k0000", "k0024"), ("k0025", "k0049"), ("k0050", "k0074"), ("k0075", "k0099")]


def test_distance_of_dates_and_decimals() -> None:
    assert numeric_distance(datetime.date(2024, 1, 1), datetime.date(2024, 3, 1)) == 60
    assert numeric_distance(Decimal("1.5"), Decimal("4")) == 2.5
    with pytest.raises(ValueError):
        key_ranges([1, 2], 0)
