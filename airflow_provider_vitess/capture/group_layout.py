"""How a grouped sync's shards are split into groups (``capture_parallelism``).

The split is a number of groups N (the shards, sorted by key range, cut into N contiguous groups
of sizes that differ by one at most) or the groups' key ranges (``["-80", "80-"]``: a group per
range, holding the shards inside it), which must tile the keyspace: start at its beginning, each
range where the one before ends, the last open-ended. Key ranges keep a group's shards stable
when shards are added elsewhere, and let a user put a hot shard in a group of its own.

Pure functions: the plan step applies them to the shards of each window's start position.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from airflow_provider_vitess import keyrange

__all__ = ["GroupSplit", "SplitMismatchError", "group_split", "layout"]

GroupSplit = int | tuple[str, ...]  # N groups, or one group per key range


class SplitMismatchError(ValueError):
    """The keyspace's shards do not fit the split's key ranges (a shard spans a boundary)."""


def group_split(value: object) -> GroupSplit:
    """``capture_parallelism`` as given (an int, a list of key ranges, or either as text, as a
    templated field renders it) checked and normalized; ``ValueError`` names what is wrong."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else int(text)
        except ValueError:
            raise ValueError(
                f"capture_parallelism must be a number of groups or a list of key ranges, got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise ValueError(
            f"capture_parallelism must be a number of groups or a list of key ranges, got {value!r}"
        )
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"capture_parallelism must be 1 or more, got {value}")
        return value
    ranges = tuple(str(r) for r in value)
    _check_tiling(ranges)
    return ranges


def _check_tiling(ranges: tuple[str, ...]) -> None:
    if not ranges:
        raise ValueError("capture_parallelism's key ranges are empty: give at least one, e.g. ['-80', '80-']")
    try:
        bounds = sorted((keyrange.key_range(r), r) for r in ranges)
    except ValueError as exc:
        raise ValueError(f"capture_parallelism's key ranges {list(ranges)}: {exc}") from None
    at: bytes | None = b""
    for (start, end), name in bounds:
        if at is None or start != at:
            where = "the keyspace's end" if at is None else f"{at.hex() or 'the start'}"
            raise ValueError(
                f"capture_parallelism's key ranges {list(ranges)} do not tile the keyspace: {name!r} "
                f"should start at {where}; give ranges that cover it once, each starting where the "
                "one before ends (e.g. ['-40', '40-80', '80-'])"
            )
        at = end
    if at is not None:
        raise ValueError(
            f"capture_parallelism's key ranges {list(ranges)} do not reach the keyspace's end: the last "
            f"ends at {at.hex()}; make the last range open-ended (e.g. '{at.hex()}-')"
        )


def layout(shards: Sequence[str], split: GroupSplit) -> list[list[str]]:
    """``shards`` as groups: sorted by key range, contiguous. For N groups, sizes differ by one
    at most (fewer groups when there are fewer shards); for key ranges, a group per range that
    holds a shard (:class:`SplitMismatchError` when a shard spans a boundary)."""
    ordered = sorted(shards, key=lambda s: keyrange.key_range(s)[0])
    if isinstance(split, int):
        return _even(ordered, split)
    out: list[list[str]] = []
    for name in sorted(split, key=lambda r: keyrange.key_range(r)[0]):
        outer = keyrange.key_range(name)
        members = [s for s in ordered if keyrange.contains(outer, keyrange.key_range(s))]
        if members:
            out.append(members)
    placed = {s for group in out for s in group}
    spanning = [s for s in ordered if s not in placed]
    if spanning:
        raise SplitMismatchError(
            f"shard(s) {spanning} span a boundary of capture_parallelism's key ranges {list(split)}: "
            "each shard must lie inside one range; move the boundaries to shard boundaries "
            f"(the keyspace's shards now: {ordered})"
        )
    return out


def _even(ordered: list[str], parallelism: int) -> list[list[str]]:
    if parallelism < 1:
        raise ValueError(f"capture_parallelism must be 1 or more, got {parallelism}")
    n = min(parallelism, len(ordered))
    size, extra = divmod(len(ordered), n) if n else (0, 0)
    out: list[list[str]] = []
    at = 0
    for g in range(n):
        take = size + (1 if g < extra else 0)
        out.append(ordered[at : at + take])
        at += take
    return out
