"""Which re-copied tables still skip their changes up to their copy (capture/copy_positions.py)."""

from __future__ import annotations

from airflow_provider_vitess.capture.copy_positions import copy_positions
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid


def at(low: int, high: int) -> Vgtid:
    return Vgtid(
        (ShardGtid("ks", "-80", f"MariaDB/0-1-{low}"), ShardGtid("ks", "80-", f"MariaDB/0-2-{high}"))
    )


def test_a_copy_ahead_of_the_committed_position_is_kept_until_every_shard_passed_it() -> None:
    recorded = {"t": at(10, 20).to_json()}
    assert copy_positions(recorded, ["t", "u"], at(5, 5)) == {"t": at(10, 20)}
    assert copy_positions(recorded, ["t", "u"], at(10, 19)) == {"t": at(10, 20)}  # one shard behind
    assert copy_positions(recorded, ["t", "u"], at(10, 20)) == {}
    assert copy_positions(recorded, ["t", "u"], at(11, 30)) == {}


def test_nothing_recorded_a_table_out_of_the_sync_or_no_position_yet() -> None:
    assert copy_positions(None, ["t"], at(1, 1)) == {}
    assert copy_positions({"gone": at(10, 20).to_json()}, ["t"], at(1, 1)) == {}
    assert copy_positions({"t": at(10, 20).to_json()}, ["t"], None) == {"t": at(10, 20)}
