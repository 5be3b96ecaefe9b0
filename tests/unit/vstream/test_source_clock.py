"""The source time a stop read from REPLICA/RDONLY tablets stands for (``vstream/source_clock.py``):
the worker's time before the lag was read, lowered by the largest lag of the stop's shards' tablets
and the lag's one-second grain; no time at all when a lag is not known. (Read on the real cluster:
``tests/integration/checkpoints/test_replica_lag.py``.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_provider_vitess.checkpoints.freshness import STOP_LAG_UNKNOWN
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream.source_clock import STOP_LAG_SECONDS, STOP_TABLET_TYPE, SourceClock

ASKED = datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc)
STOP = Vgtid(tuple(ShardGtid("ks", shard, "MariaDB/0-1-5") for shard in ("-80", "80-")))


def test_a_primary_s_stop_is_as_of_the_moment_before_it_was_taken() -> None:
    assert SourceClock("PRIMARY", ASKED).time_of(STOP, "test") == (ASKED, {})


def test_a_replica_s_stop_is_lowered_by_the_largest_lag_of_its_shards_tablets() -> None:
    clock = SourceClock("REPLICA", ASKED, {"-80": [3.0, 40.0], "80-": [7.0], "other": [900.0]})
    at, stats = clock.time_of(STOP, "test")
    assert at == ASKED - timedelta(seconds=41)  # 40 s, and the whole second it was cut down by
    assert stats == {STOP_TABLET_TYPE: "REPLICA", STOP_LAG_SECONDS: 40.0}


def test_a_lag_not_known_for_a_shard_claims_no_time_and_says_why() -> None:
    stopped = SourceClock(
        "RDONLY", ASKED, {"-80": [1.0], "80-": [2.0]}, {"80-": "tablet zone1-300 reports lag 'NULL'"}
    )
    at, stats = stopped.time_of(STOP, "test")
    assert at is None and "80-: tablet zone1-300 reports lag 'NULL'" in stats[STOP_LAG_UNKNOWN]
    # A shard whose only tablet cannot be asked: that tablet is named, and only it (it is in
    # vtgate's list).
    unasked = SourceClock("REPLICA", ASKED, {"-80": [1.0]}, {"80-": "tablet zone1-300 reports lag '-1'"})
    assert unasked.lag_of(STOP) == "80-: tablet zone1-300 reports lag '-1'"
    missing = SourceClock("REPLICA", ASKED, {"-80": [1.0]})
    at, stats = missing.time_of(STOP, "test")
    assert at is None and stats[STOP_LAG_UNKNOWN] == "80-: no REPLICA tablet in vtgate's list"
    failed = SourceClock("REPLICA", ASKED, failure="SHOW VITESS_REPLICATION_STATUS failed: boom")
    assert failed.time_of(STOP, "test") == (
        None,
        {STOP_TABLET_TYPE: "REPLICA", STOP_LAG_UNKNOWN: "SHOW VITESS_REPLICATION_STATUS failed: boom"},
    )
