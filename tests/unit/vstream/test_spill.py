"""Reads are bounded in bytes, spill to the configured directory, and free their spill files on
every exit path (return, early stop, error, KeyboardInterrupt, SIGTERM).

The streams are real ``VStreamResponse`` messages, scripted, as vtgate sends them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2
from airflow_provider_vitess.decoding.events import BeginEvent, CommitEvent, RowEvent
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.ordering import ShardMerger, ShardTransaction, TransactionAssembler
from airflow_provider_vitess.vstream.spill import MemoryLimits, SpillableEvents, spill_directory
from airflow_provider_vitess.vstream.window import ReadBounds, WindowReader
from tests.support.local import REPO
from tests.support.spill import spill_fds

E = binlogdata_pb2.VEventType
KS = "ks"
A, B = "-80", "80-"
WIDE = 100_000  # bytes of one row's value: "wide" against the limits the tests set


# -- scripted VStream ------------------------------------------------------------------------


def ev(shard: str, type_: int, ts: int, **kw: Any) -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=type_, keyspace=KS, shard=shard, timestamp=ts, **kw)  # type: ignore[arg-type]


def field(shard: str) -> binlogdata_pb2.VEvent:
    fields = [
        query_pb2.Field(name="id", type=query_pb2.Type.INT64, charset=63),
        query_pb2.Field(name="body", type=query_pb2.Type.BLOB, charset=63),
    ]
    return ev(shard, E.FIELD, 0, field_event=binlogdata_pb2.FieldEvent(table_name=f"{KS}.t", fields=fields))


def row(shard: str, ts: int, row_id: int, size: int = WIDE) -> binlogdata_pb2.VEvent:
    key, body = str(row_id).encode(), bytes([row_id % 251]) * size
    change = binlogdata_pb2.RowChange(after=query_pb2.Row(lengths=[len(key), len(body)], values=key + body))
    re_ = binlogdata_pb2.RowEvent(table_name=f"{KS}.t", row_changes=[change], keyspace=KS, shard=shard)
    return ev(shard, E.ROW, ts, row_event=re_)


def position(shard: str, pos: int) -> binlogdata_pb2.VEvent:
    sg = binlogdata_pb2.ShardGtid(keyspace=KS, shard=shard, gtid=f"MariaDB/0-1-{pos}")
    return ev(shard, E.VGTID, 0, vgtid=binlogdata_pb2.VGtid(shard_gtids=[sg]))


def txn(shard: str, ts: int, pos: int, row_ids: Sequence[int]) -> list[binlogdata_pb2.VEvent]:
    return [
        ev(shard, E.BEGIN, ts),
        *(row(shard, ts, i) for i in row_ids),
        position(shard, pos),
        ev(shard, E.COMMIT, ts),
    ]


START = Vgtid.from_proto(
    binlogdata_pb2.VGtid(
        shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=s, gtid="MariaDB/0-1-1") for s in (A, B)]
    )
)
STOP = Vgtid.from_proto(
    binlogdata_pb2.VGtid(
        shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=s, gtid="MariaDB/0-1-99") for s in (A, B)]
    )
)


class Stager:
    """Records the rows staged, and the spill files open while they were."""

    def __init__(self, directory: Path | None = None) -> None:
        self.rows: list[int] = []
        self.directory = directory
        self.spill_files_seen = 0

    def set_schema(self, keyspace: str, table: str, fields: Sequence[Any], shard: str = "") -> None:
        pass

    def add_rows(
        self, keyspace: str, table: str, shard: str, commit_ts: int, first_seq: int, changes: Sequence[Any]
    ) -> None:
        self.rows.extend(int(c.after[0]) for c in changes)
        if self.directory is not None:
            self.spill_files_seen = max(self.spill_files_seen, len(spill_fds(self.directory)))

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None:
        pass


class Script:
    """One VStream call: the events, one response each, then ``then`` (an exception to raise,
    or a callable to run), then the ``after`` events. Records the spill files open at ``then``."""

    def __init__(
        self,
        events: Sequence[binlogdata_pb2.VEvent],
        directory: Path,
        then: Any = None,
        after: Sequence[binlogdata_pb2.VEvent] = (),
    ) -> None:
        self.events, self.directory, self.then, self.after = list(events), directory, then, after
        self.open_at_end: list[str] = []

    def __call__(self, request: vtgate_pb2.VStreamRequest) -> Iterator[vtgate_pb2.VStreamResponse]:
        for e in self.events:
            yield vtgate_pb2.VStreamResponse(events=[e])
        self.open_at_end = spill_fds(self.directory)
        if isinstance(self.then, BaseException):
            raise self.then
        if callable(self.then):
            self.then()
        for e in self.after:
            yield vtgate_pb2.VStreamResponse(events=[e])


def reader(script: Script, directory: Path, **kw: Any) -> tuple[WindowReader, Stager]:
    """A catch-up window over both shards that spills everything it buffers to ``directory``."""
    limits = MemoryLimits(max_buffered_bytes=1, transaction_bytes=1, spill_dir=str(directory))
    stager = Stager(directory)
    window = WindowReader(
        script, stager, keyspace=KS, tables=["t"], start=START, stop=STOP, memory=limits, **kw
    )
    return window, stager


# -- limits in bytes -----------------------------------------------------------------------


def common(shard: str, ts: int) -> dict[str, Any]:
    return {"keyspace": KS, "shard": shard, "timestamp": ts, "current_time": 0}


def wide_event(ts: int) -> RowEvent:
    from airflow_provider_vitess.decoding.events import RawRows

    re_ = row(A, ts, 1).row_event
    return RowEvent(
        **common(A, ts),
        table="t",
        column_names=("id", "body"),
        changes=RawRows(re_.SerializeToString(), 1, None),  # type: ignore[arg-type]
    )


def test_a_transaction_of_few_wide_rows_spills_by_bytes(tmp_path: Path) -> None:
    """Three rows, far under the row cap, but 300 KB: past a 200 KB limit they go to disk."""
    asm = TransactionAssembler(MemoryLimits(transaction_bytes=200_000, spill_dir=str(tmp_path)))
    asm.push(BeginEvent(**common(A, 5)))
    for _ in range(3):
        asm.push(wide_event(5))
    (done,) = asm.push(CommitEvent(**common(A, 5)))
    assert isinstance(done, ShardTransaction)
    assert done.rows == 3 and done.events.spilled
    assert done.events.memory_bytes <= 200_000
    assert len(list(done.events)) == 3
    done.events.close()


def test_the_merge_spills_held_units_by_bytes_and_keeps_their_order(tmp_path: Path) -> None:
    merger = ShardMerger([(KS, A), (KS, B)], max_buffered_bytes=250_000)
    units = []
    for ts in (1, 2, 3):
        events = SpillableEvents(str(tmp_path))
        events.append(f"unit {ts}", 1, 100_000)
        units.append(ShardTransaction(KS, A, ts, ts, 0, events, None, 1))
        assert list(merger.push(units[-1])) == []  # B has said nothing: all are held
    assert merger.buffered_bytes <= 250_000 and merger.stats.spilled_units == 1
    assert units[0].events.spilled and spill_fds(tmp_path)
    released = list(merger.mark_done((KS, B)))
    assert [list(u.events) for u in released] == [["unit 1"], ["unit 2"], ["unit 3"]]
    assert merger.buffered_bytes == 0


def test_limits_must_be_positive() -> None:
    with pytest.raises(VitessProviderError, match="transaction_bytes must be > 0"):
        MemoryLimits(transaction_bytes=0)


# -- the spill directory -------------------------------------------------------------------


def test_spill_files_go_to_the_configured_directory_and_have_no_name(tmp_path: Path) -> None:
    events = SpillableEvents(str(tmp_path))
    events.append("event", 1, 10)
    events.spill()
    (open_file,) = spill_fds(tmp_path)
    assert open_file.endswith("(deleted)")  # anonymous: nothing to leave behind
    assert os.listdir(tmp_path) == []
    assert list(events) == ["event"]
    events.close()
    assert spill_fds(tmp_path) == []


def test_a_missing_spill_directory_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    with pytest.raises(VitessProviderError, match=r"does not exist: create it or change spill_dir"):
        spill_directory(str(tmp_path / "nope"))
    assert spill_directory(None)  # the system's temporary directory
    assert spill_directory(str(tmp_path)) == str(tmp_path)


def test_a_spill_that_cannot_be_written_names_the_directory(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    events = SpillableEvents(str(gone))
    gone.rmdir()
    events.append("event", 1, 10)
    with pytest.raises(VitessProviderError, match=r"cannot spill buffered events to .*gone.*spill_dir"):
        events.spill()


# -- every exit path frees the spill files -------------------------------------------------


def test_a_window_that_reaches_its_stop_frees_its_spill_files(tmp_path: Path) -> None:
    events = [*txn(A, 10, 2, [1, 2]), *txn(B, 11, 3, [3]), *txn(A, 12, 99, [4]), *txn(B, 13, 99, [5])]
    script = Script([field(A), field(B), *events], tmp_path)
    window, stager = reader(script, tmp_path)
    result = window.run()
    assert stager.rows == [1, 2, 3, 4, 5] and result.stopped_early is None
    assert stager.spill_files_seen > 0  # it did spill, there
    assert spill_fds(tmp_path) == []


def test_an_early_stop_frees_the_units_it_leaves_buffered(tmp_path: Path) -> None:
    """max_seconds ends the window while shard A's units wait for B: they are the next
    window's, and their spill files must go now, not when the reader is collected."""
    clock = {"now": 0.0}
    script = Script(
        [field(A), *txn(A, 10, 2, [1]), *txn(A, 11, 3, [2])],
        tmp_path,
        then=lambda: clock.update(now=100.0),  # time passes...
        after=[ev("", E.HEARTBEAT, 0)],  # ... and the next event finds the bound reached
    )
    window, stager = reader(script, tmp_path, bounds=ReadBounds(max_seconds=5), clock=lambda: clock["now"])
    result = window.run()
    assert result.stopped_early == "max_seconds=5" and stager.rows == []
    assert script.open_at_end  # units were held, spilled
    assert spill_fds(tmp_path) == []


def test_max_seconds_spent_inside_a_transaction_reads_on_to_its_end(tmp_path: Path) -> None:
    """A transaction longer to stream than max_seconds: cut at the bound, it would be read again
    from its BEGIN by every later window, and cut again (the sync would never pass it). The
    window stages all of it (spilled), then stops before the next transaction."""
    clock = {"now": 0.0}
    b_at_stop = binlogdata_pb2.ShardGtid(keyspace=KS, shard=B, gtid="MariaDB/0-1-99")
    start = Vgtid.from_proto(
        binlogdata_pb2.VGtid(
            shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=A, gtid="MariaDB/0-1-1"), b_at_stop]
        )
    )
    big = txn(A, 10, 2, [1, 2, 3, 4])
    script = Script(
        [field(A), *big[:3]],  # BEGIN and two rows, then the time runs out...
        tmp_path,
        then=lambda: clock.update(now=100.0),
        after=[*big[3:], *txn(A, 11, 3, [5])],  # ... with two rows and the COMMIT still to come
    )
    limits = MemoryLimits(max_buffered_bytes=1, transaction_bytes=1, spill_dir=str(tmp_path))
    stager = Stager(tmp_path)
    window = WindowReader(
        script,
        stager,
        keyspace=KS,
        tables=["t"],
        start=start,
        stop=STOP,
        memory=limits,
        bounds=ReadBounds(max_seconds=5),
        clock=lambda: clock["now"],
    )
    result = window.run()
    assert stager.rows == [1, 2, 3, 4]
    assert result.stopped_early == "max_seconds=5"
    assert result.stats["read_past_max_seconds"] is True
    assert result.stats["spilled_transactions"] == 1
    moved = result.end_vgtid.shard(KS, A)
    assert moved is not None and moved.gtid == "MariaDB/0-1-2"  # past the transaction
    assert spill_fds(tmp_path) == []


def test_max_seconds_spent_before_anything_arrived_waits_for_the_first_transaction(tmp_path: Path) -> None:
    """vttablet sends heartbeats while it reads a large transaction from the binlog, before its
    BEGIN: a window that got nothing yet reads on instead of ending empty at its start."""
    clock = {"now": 0.0}
    b_at_stop = binlogdata_pb2.ShardGtid(keyspace=KS, shard=B, gtid="MariaDB/0-1-99")
    start = Vgtid.from_proto(
        binlogdata_pb2.VGtid(
            shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=A, gtid="MariaDB/0-1-1"), b_at_stop]
        )
    )
    script = Script(
        [ev("", E.HEARTBEAT, 0)],
        tmp_path,
        then=lambda: clock.update(now=100.0),
        after=[ev("", E.HEARTBEAT, 0), field(A), *txn(A, 10, 2, [1, 2]), *txn(A, 11, 3, [3])],
    )
    window = WindowReader(
        script,
        Stager(tmp_path),
        keyspace=KS,
        tables=["t"],
        start=start,
        stop=STOP,
        bounds=ReadBounds(max_seconds=5),
        clock=lambda: clock["now"],
    )
    result = window.run()
    assert result.rows == 2 and result.stopped_early == "max_seconds=5"
    moved = result.end_vgtid.shard(KS, A)
    assert moved is not None and moved.gtid == "MariaDB/0-1-2"


@pytest.mark.parametrize("error", [RuntimeError("stream broke"), KeyboardInterrupt()])
def test_an_error_mid_transaction_frees_the_spill_files(tmp_path: Path, error: BaseException) -> None:
    script = Script([field(A), *txn(A, 10, 2, [1]), ev(A, E.BEGIN, 11), row(A, 11, 2)], tmp_path, error)
    window, _ = reader(script, tmp_path)
    with pytest.raises(type(error)):
        window.run()
    assert script.open_at_end  # the held unit and the open transaction had spilled
    assert spill_fds(tmp_path) == []  # the reader is still referenced: freed by the read itself


def test_a_snapshot_checkpoints_by_bytes(tmp_path: Path) -> None:
    copy = [*txn(A, 0, 2, [1]), *txn(A, 0, 3, [2]), *txn(A, 0, 4, [3])]
    done = binlogdata_pb2.VEvent(type=E.COPY_COMPLETED)
    script = Script([field(A), *copy, done], tmp_path)
    checkpoints: list[Vgtid] = []
    start = Vgtid.from_proto(
        binlogdata_pb2.VGtid(shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=A)])
    )
    window = WindowReader(
        script,
        Stager(),
        keyspace=KS,
        tables=["t"],
        start=start,
        stop=None,
        checkpoint_every_rows=1_000_000,
        checkpoint_every_bytes=2 * WIDE,
        on_checkpoint=checkpoints.append,
    )
    window.run()
    # Rows of ~100 KB: the 2nd row passes 200 KB (checkpoint), then the 3rd starts over.
    assert [v.shard(KS, A).gtid for v in checkpoints] == ["MariaDB/0-1-3"]  # type: ignore[union-attr]


CHILD = """
import json, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.unit.vstream import test_spill as t
directory = Path({directory!r})
def stall():
    print(json.dumps(t.spill_fds(directory)), flush=True)
    time.sleep(600)
events = [t.field(t.A), *t.txn(t.A, 10, 2, [1]), t.ev(t.A, t.E.BEGIN, 11), t.row(t.A, 11, 2)]
script = t.Script(events, directory, stall)
window, _ = t.reader(script, directory)
window.run()
"""


def test_sigterm_mid_read_leaves_nothing_in_the_spill_directory(tmp_path: Path) -> None:
    repo = str(REPO)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=repo, directory=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        open_then = json.loads(child.stdout.readline())
        assert open_then and all(f.endswith("(deleted)") for f in open_then)  # spilling, mid-read
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    time.sleep(0.1)
    assert os.listdir(tmp_path) == []


def test_the_spill_directory_comes_from_the_operator_else_the_airflow_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_provider_vitess.operators._sync import memory_limits

    monkeypatch.delenv("AIRFLOW__VITESS__SPILL_DIR", raising=False)
    assert memory_limits(None).spill_dir is None  # the system's temporary directory
    monkeypatch.setenv("AIRFLOW__VITESS__SPILL_DIR", str(tmp_path))
    assert memory_limits(None).spill_dir == str(tmp_path)
    assert memory_limits("/elsewhere").spill_dir == "/elsewhere"  # the operator's argument wins
