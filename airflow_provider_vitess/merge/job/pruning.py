"""Which key ranges a window touches: the target-only predicate that lets Delta skip files (pure).

Delta's MERGE finds the files to rewrite by scanning the target with the *target-only* conjuncts
of the merge condition (data skipping on each file's min/max statistics), then joining with the
source. A bare ``t.key = s.key`` condition scans every file, so the cost of a merge would grow
with the table. The job adds ``(t.k BETWEEN lo1 AND hi1) OR (t.k BETWEEN lo2 AND hi2) ...`` on
the first key column, from the window's distinct keys: a file whose [min, max] misses every range
is never read. Keys are usually clustered (AUTO_INCREMENT ids, recent rows change most), so a few
ranges cover a window's keys tightly; splitting at the largest gaps keeps scattered updates of old
rows from stretching one range over the whole table.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeVar

V = TypeVar("V")

MAX_RANGES = 16
# More distinct keys than this in a window: one [min, max] range, computed by Spark.
MAX_COLLECTED_KEYS = 200_000


def _chunks(values: Sequence[V], n: int) -> list[tuple[V, V]]:
    size = -(-len(values) // n)
    return [(values[i], values[min(i + size, len(values)) - 1]) for i in range(0, len(values), size)]


def key_ranges(
    values: Sequence[V], max_ranges: int = MAX_RANGES, distance: Callable[[V, V], float] | None = None
) -> list[tuple[V, V]]:
    """At most ``max_ranges`` closed ranges covering the sorted distinct ``values``.

    With ``distance`` (numbers, dates) the ranges are split at the largest gaps between
    neighbours, so the total span covered is as small as it can be with that many ranges;
    without (strings), the values are cut into equal-count chunks.
    """
    if not values:
        return []
    if max_ranges < 1:
        raise ValueError("max_ranges must be >= 1")
    if len(values) <= max_ranges:
        return [(v, v) for v in values]
    if distance is None:
        return _chunks(values, max_ranges)
    gaps = sorted(range(1, len(values)), key=lambda i: (-distance(values[i - 1], values[i]), i))
    cuts = sorted(gaps[: max_ranges - 1])
    out, start = [], 0
    for cut in cuts:
        out.append((values[start], values[cut - 1]))
        start = cut
    out.append((values[start], values[-1]))
    return out


def numeric_distance(a: Any, b: Any) -> float:
    """Gap between two sorted key values of a numeric or date type."""
    if isinstance(a, datetime.date) and isinstance(b, datetime.date):
        return float((b - a).days)
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return float(Decimal(b) - Decimal(a))
    return float(b - a)


_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$")


def sql_literal(value: Any) -> str:
    """A key value as SQL literal text: numbers and dates by their checked digits, strings as
    UTF-8 hex (``X'..'`` cast to STRING), so no value can end the literal."""
    if isinstance(value, str):
        return f"CAST(X'{value.encode().hex()}' AS STRING)"
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        text = format(value, "f") if isinstance(value, Decimal) else repr(value)
        if _NUMBER.match(text):
            return f"'{text}'"
    raise TypeError(f"no SQL literal for key value of type {type(value).__name__}")
