"""Shard names as key ranges, and which shards took over a resharded one.

A Vitess shard of a sharded keyspace is named by its key range, ``start-end`` in hex, either end
open (``-80``, ``80-``, ``40-80``); ``0`` and ``-`` name the whole range. After a reshard the
shards that replaced an old one are the live shards whose ranges overlap it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

KeyRange = tuple[bytes, bytes | None]  # [start, end); end None = unbounded


def key_range(shard: str) -> KeyRange:
    """The key range a shard name stands for (``ValueError`` for a name that is not one)."""
    if shard in ("0", "-", ""):
        return (b"", None)
    start, sep, end = shard.partition("-")
    if not sep:
        raise ValueError(f"shard name {shard!r} is not a key range (expected 'start-end' in hex, or '0')")
    try:
        low, high = bytes.fromhex(start), bytes.fromhex(end) if end else None
    except ValueError:
        raise ValueError(f"shard name {shard!r} is not a key range of hex bounds") from None
    # Trailing zero bytes do not change a bound (80 and 8000 are the same place), as in Vitess.
    return (low.rstrip(b"\0"), None if high is None else high.rstrip(b"\0"))


def overlaps(a: KeyRange, b: KeyRange) -> bool:
    return (b[1] is None or a[0] < b[1]) and (a[1] is None or b[0] < a[1])


def contains(outer: KeyRange, inner: KeyRange) -> bool:
    """Every key of ``inner`` is in ``outer``."""
    return inner[0] >= outer[0] and (outer[1] is None or (inner[1] is not None and inner[1] <= outer[1]))


def successors(shards: Iterable[str], live: Iterable[str]) -> Mapping[str, tuple[str, ...]]:
    """For each of ``shards`` that is no longer ``live``: the live shards that took its keys."""
    live = tuple(live)
    out = {}
    for shard in shards:
        if shard in live:
            continue
        old = key_range(shard)
        out[shard] = tuple(s for s in live if overlaps(old, key_range(s)))
    return out
