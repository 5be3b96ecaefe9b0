"""Which earlier windows a merged window reads as context (merge/job/lookback.py), and the footer
statistics it decides from."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pyarrow.parquet as pq

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.merge.job import lookback
from airflow_provider_vitess.merge.job.lookback import CONTEXT_SECONDS, context_windows
from airflow_provider_vitess.staging import Manifest, WindowStager
from airflow_provider_vitess.staging.retention import MAX_WINDOWS_BACK
from airflow_provider_vitess.vgtid import Vgtid

FIELDS = [
    query_pb2.Field(name="k", type=query_pb2.INT64, column_type="bigint", flags=1),
    query_pb2.Field(name="v", type=query_pb2.INT64, column_type="bigint"),
]
V = Vgtid.for_keyspace("ks", "")


def stage(
    root: Path, seq: int, commit_ts: list[int], *, snapshot: bool = False, flush_every: int = 0
) -> Manifest:
    stager = WindowStager(
        str(root), "s", seq, key_columns={"t": ["k"]}, row_group_bytes=flush_every or 1 << 20
    )
    stager.set_schema("ks", "t", FIELDS, "-80")
    for i, ts in enumerate(commit_ts):
        stager.add_change("ks", "t", "-80", Operation.INSERT, ts, i + 1, None, (i, ts))
    return stager.finish(V, None if snapshot else V, V)


def at(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def test_commit_ts_range_reads_every_row_group_of_every_part(tmp_path: Path) -> None:
    # The extremes only in the last rows: a reader of the first row group alone gets them wrong.
    manifest = stage(tmp_path, 1, [1700000105] * 6000 + [1700000100, 1700000107], flush_every=4096)
    fs, root = manifest.window_path()
    groups = 0
    for part in manifest.tables["t"].parts:
        with fs.open(f"{root}/{part.path}", "rb") as f:
            groups += pq.ParquetFile(f).metadata.num_row_groups
    assert groups > 1
    assert lookback.commit_ts_range(manifest, "t") == (1700000100, 1700000107)
    assert lookback.commit_ts_range(manifest, "other") is None


def test_created_epoch_of_a_written_manifest_and_of_none(tmp_path: Path) -> None:
    manifest = stage(tmp_path, 1, [5])
    created = lookback.created_epoch(manifest)
    assert created is not None
    assert abs(created - datetime.datetime.now(datetime.timezone.utc).timestamp()) < 60
    assert lookback.created_epoch(dataclasses.replace(manifest, created_at="")) is None


class Windows:
    """Manifests by seq, with made-up commit ranges and creation times. Each window starts where
    the one before ended (``_at(seq - 1)`` to ``_at(seq)``) and reads to its stop unless ``early``."""

    def __init__(self, tmp_path: Path) -> None:
        self.template = stage(tmp_path, 1, [1])
        self.by_seq: dict[int, Manifest] = {}
        self.ranges: dict[int, tuple[int, int] | None] = {}

    def add(
        self,
        seq: int,
        low: int,
        high: int,
        *,
        created: float | None = None,
        snapshot: bool = False,
        rows: bool = True,
        start: Vgtid | None = None,
        end: Vgtid | None = None,
        source: int | None = None,
        early: bool = False,
    ) -> None:
        tables = self.template.tables if rows else {}
        end = _at(seq) if end is None else end
        stop = _at(1000 + seq) if early else end  # ended before its stop: a bound cut it
        self.by_seq[seq] = dataclasses.replace(
            self.template,
            window_seq=seq,
            tables=tables,
            stats={} if source is None else {"source_ts_max": source},
            created_at=at(high + 1 if created is None else created),
            start_vgtid=_at(seq - 1) if start is None else start,
            stop_vgtid=None if snapshot else stop,
            end_vgtid=end,
        )
        self.ranges[seq] = (low, high)

    def picked(self, seq: int, first: int) -> list[lookback.ContextWindow]:
        return context_windows(
            self.by_seq[seq], "t", first, self.by_seq.get, lambda m, _t: self.ranges[m.window_seq]
        )

    def pick(self, seq: int, first: int) -> list[tuple[int, int]]:
        return [(c.manifest.window_seq, c.since) for c in self.picked(seq, first)]

    def reaches(self, seq: int, first: int) -> list[tuple[int, str]]:
        return [(c.manifest.window_seq, c.reach.value) for c in self.picked(seq, first)]


def _at(n: int) -> Vgtid:
    return Vgtid.from_json(f'[{{"keyspace":"ks","shard":"-80","gtid":"MariaDB/0-1-{n}","table_p_ks":[]}}]')


def test_a_window_before_the_nearest_stop_counts_when_it_ends_within_the_margin(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 900, snapshot=True, created=600)
    w.add(2, 900, 1000, created=1001)
    w.add(3, 1000, 1000)  # read to its stop: it counts by its shards' newest events, and it ends
    w.add(4, 1000, 1100)  # the part of the look-back that positions bound
    assert w.pick(4, first=1003) == [(3, 998), (2, 998)]
    assert w.reaches(4, first=1003) == [(3, "shard_newest"), (2, "seconds")]
    # Nothing of window 2 within the margin: nothing to read, and window 1 was written too early.
    assert w.pick(4, first=1000 + CONTEXT_SECONDS + 1) == [(3, 1001)]


def test_the_window_just_before_counts_by_its_shards_newest_events_whatever_the_seconds(
    tmp_path: Path,
) -> None:
    # A move's INSERT half in window 2, its DELETE half in window 3 on a shard whose clock is 30 s
    # ahead: by seconds window 2 ends far before window 3's first commit (issue 38, item 8).
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0)
    w.add(2, 1000, 1003)
    w.add(3, 1033, 1040)
    assert w.pick(3, first=1033) == [(2, 1033 - CONTEXT_SECONDS)]
    assert w.reaches(3, first=1033) == [(2, "shard_newest")]


def test_windows_that_ended_early_count_whole_back_to_one_that_reached_its_stop(tmp_path: Path) -> None:
    # A bound (max_events) cut windows 3 and 4 in commit seconds, where the shards' clocks meet:
    # a move's halves can be windows apart; window 2 read to its stop, an instant on every shard.
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0)
    w.add(2, 100, 200, created=201)
    w.add(3, 500, 600, early=True)
    w.add(4, 0, 0, rows=False, early=True)  # no rows of the table: nothing to read, walked through
    w.add(5, 700, 800, early=True)
    w.add(6, 2000, 2001)
    assert w.reaches(6, first=2000) == [(5, "whole"), (3, "whole"), (2, "shard_newest")]
    # Past the nearest stop the seconds decide again: window 2 starts the seconds rule's part.
    w.add(2, 100, 1998, created=1999)
    w.add(3, 500, 600)
    assert w.reaches(6, first=2000) == [(5, "whole"), (3, "shard_newest"), (2, "seconds")]


def test_a_snapshot_just_before_counts_whole_and_ends_the_look_back(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 100, created=100)
    w.add(2, 0, 100, snapshot=True, created=100)
    w.add(3, 5000, 5001)
    assert w.reaches(3, first=5000) == [(2, "whole")]


def test_reached_stop_compares_each_shards_end_with_the_stop(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True)
    w.add(2, 1, 1)
    w.add(3, 1, 1, early=True)
    assert [lookback.reached_stop(w.by_seq[s]) for s in (1, 2, 3)] == [False, True, False]
    # A position that cannot be compared is not known to be reached: the whole window counts.
    unresolved = dataclasses.replace(w.by_seq[2], end_vgtid=V, stop_vgtid=V)
    assert not lookback.reached_stop(unresolved)


def test_look_back_stops_at_a_snapshot_of_the_table(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 1000, created=1000)
    w.add(2, 995, 1000, snapshot=True, created=1000)
    w.add(3, 1000, 1001)
    assert w.pick(3, first=1000) == [(2, 995)]  # window 1 also ends at 1000, but the copy decides


def test_tiny_windows_and_windows_without_the_table_are_walked_through(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 990, snapshot=True, created=600)
    w.add(2, 998, 999, created=999)
    w.add(3, 0, 0, rows=False, created=999)
    w.add(4, 999, 1000, created=1000)
    w.add(5, 1000, 1001)
    assert w.pick(5, first=1001) == [(4, 996), (2, 996)]
    picked = context_windows(w.by_seq[5], "t", 1001, w.by_seq.get, lambda m, _t: w.ranges[m.window_seq])
    # How far back each is (its events' _seq is shifted by that many SEQ_SHIFTs, read_window).
    assert [c.back for c in picked] == [1, 3]


def test_clock_skew_between_worker_and_server_is_tolerated(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0)
    # The worker's clock is 30 s behind the server's: window 2 looks written before window 3's events.
    w.add(2, 1000, 1003, created=1003 - 30)
    w.add(3, 1003, 1010)
    assert w.pick(3, first=1003) == [(2, 998)]


def test_a_discarded_window_whose_files_are_gone_is_skipped_not_the_end_of_the_look_back(
    tmp_path: Path,
) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0, end=_at(1))
    w.add(2, 1000, 1001, start=_at(1), end=_at(2))
    # Window 3 (from _at(2)) lost its staged files and was discarded (deleted, FAILED); window 4
    # read its changes again from window 2's end.
    w.add(4, 1001, 1002, start=_at(2), end=_at(4))
    assert w.pick(4, first=1001) == [(2, 996)]


def test_a_discarded_window_whose_files_are_left_is_skipped(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0, end=_at(1))
    w.add(2, 1000, 1001, start=_at(1), end=_at(2))
    w.add(3, 1000, 1003, start=_at(2), end=_at(3))  # discarded by a re-snapshot, files left
    w.add(4, 1001, 1002, start=_at(2), end=_at(4))
    assert w.pick(4, first=1001) == [(2, 996)]  # window 3's events were never merged


def test_look_back_is_bounded(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    for seq in range(1, 40):
        w.add(seq, 1000, 1000, created=1000)
    assert len(w.pick(39, first=1000)) == MAX_WINDOWS_BACK


def test_the_look_back_goes_by_the_sources_clocks_not_the_workers(tmp_path: Path) -> None:
    w = Windows(tmp_path)
    w.add(1, 0, 0, snapshot=True, created=0, source=0)
    # The capturing worker's clock is 10 minutes behind MySQL's: by it, window 2 was written long
    # before window 4's first commit. The newest source time its read saw says otherwise.
    w.add(2, 1000, 1003, created=1003 - 600, source=1004)
    w.add(3, 1003, 1003, source=1003)  # the window just before: positions bound it
    w.add(4, 1003, 1010, source=1011)
    assert w.pick(4, first=1003) == [(3, 998), (2, 998)]
    # And a worker clock far ahead does not drag the look-back past a window read long before.
    w.add(2, 100, 103, created=1003 + 600, source=104)
    assert w.pick(4, first=1003) == [(3, 998)]
