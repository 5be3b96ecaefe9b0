"""Shard names as key ranges: which live shards took over a resharded one."""

from __future__ import annotations

import pytest

from airflow_provider_vitess.keyrange import key_range, successors


def test_shard_names_are_key_ranges() -> None:
    assert key_range("0") == (b"", None)
    assert key_range("-80") == (b"", b"\x80")
    assert key_range("80-") == (b"\x80", None)
    assert key_range("40-80") == (b"\x40", b"\x80")
    with pytest.raises(ValueError, match="'x1' is not a key range"):
        key_range("x1")
    with pytest.raises(ValueError, match="'zz-' is not a key range of hex bounds"):
        key_range("zz-")


def test_successors_are_the_live_shards_overlapping_a_retired_one() -> None:
    assert successors(["0"], ["-80", "80-"]) == {"0": ("-80", "80-")}
    # Only -80 was split: 80- stays live and takes nothing over.
    assert successors(["-80", "80-"], ["-40", "40-80", "80-"]) == {"-80": ("-40", "40-80")}
    # Merging back: a longer bound compares as bytes (80 < 8000 < 81).
    assert successors(["-80", "80-c0", "c0-"], ["-8000", "8000-"]) == {
        "-80": ("-8000",),
        "80-c0": ("8000-",),
        "c0-": ("8000-",),
    }
    assert successors(["-80"], ["-80", "80-"]) == {}
