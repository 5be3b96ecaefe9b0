"""Network faults between the client and the real vtgate (``faultproxy.FaultProxy``).

Every read here is done twice over the same window: once through an unharmed proxy (the
reference, which also measures how many bytes the window takes on the wire) and once with a
fault at a seeded point of those bytes. A window read from the same start to the same stop
stages the same rows with the same sequence numbers (``vstream/ordering.py``), so the faulty
read must stage exactly the reference's rows: nothing lost, nothing twice. The reference itself
replays to ``SELECT *`` through vtgate.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, topodata_pb2, vtgate_pb2
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import VStreamError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import ReadResult, WindowReader, capture_stop_position
from tests.support.fault_rows import TABLE, execute, insert_rows, setup_table
from tests.support.faultproxy import FaultProxy
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.replay import ListStager, StagedChange, replay

pytestmark = pytest.mark.integration

ONE_SHARD_CUSTOMER = 1  # every row of the big transaction on one shard: one shard transaction


@pytest.fixture
def proxy(vitess: LocalVitess) -> Iterator[FaultProxy]:
    p = FaultProxy(vitess.grpc_port)
    p.start()
    yield p
    p.stop()


def _hook(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, name: str, grpc_port: int, **extra: Any
) -> VitessHook:
    env, value = connection_uri_env(name, dataclasses.replace(vitess, grpc_port=grpc_port), **extra)
    monkeypatch.setenv(env, value)
    return VitessHook(name)


def _source(hook: VitessHook) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET workload = 'olap'")  # OLTP results stop at 10,000 rows
        cur.execute(f"SELECT * FROM customer.{TABLE}")
        return {(r[0],): tuple(r) for r in cur.fetchall()}
    finally:
        raw.close()


def _reader(
    hook: VitessHook, stager: ListStager, start: Vgtid, stop: Vgtid | None, open_stream: Any = None
) -> WindowReader:
    return WindowReader(
        open_stream or hook.open_vstream_raw,
        stager,
        keyspace="customer",
        tables=[TABLE],
        start=start,
        stop=stop,
        flags=hook.vstream_flags(heartbeat_interval=1),
        reset_connection=hook.reset_channel,
    )


def _read(hook: VitessHook, start: Vgtid, stop: Vgtid | None) -> tuple[list[StagedChange], ReadResult]:
    stager = ListStager()
    result = _reader(hook, stager, start, stop).run()
    return stager.changes, result


def _no_duplicates(changes: list[StagedChange]) -> None:
    seqs = Counter(c.seq for c in changes)
    assert max(seqs.values()) == 1
    inserted = Counter(c.after[0] for c in changes if c.before is None and c.after is not None)
    twice = [k for k, n in inserted.items() if n > 1]
    assert not twice, f"{len(twice)} rows staged twice, e.g. id {sorted(twice)[:5]}"


def _catch_up_backlog(hook: VitessHook, seed: int) -> tuple[Vgtid, Vgtid]:
    """Small transactions on both shards around one large one-shard transaction (~1.3 MB)."""
    rng = random.Random(seed)
    setup_table(hook)
    start = capture_stop_position(hook.open_vstream_raw, "customer")
    insert_rows(hook, rng, range(1, 21))
    insert_rows(hook, rng, range(100_000, 106_000), customer=ONE_SHARD_CUSTOMER)
    insert_rows(hook, rng, range(21, 41))
    execute(hook, f"UPDATE customer.{TABLE} SET payload = 'x' WHERE id < 30")
    execute(hook, f"DELETE FROM customer.{TABLE} WHERE id BETWEEN 35 AND 38")
    return start, capture_stop_position(hook.open_vstream_raw, "customer")


def _reference(
    hook: VitessHook, proxy: FaultProxy, start: Vgtid, stop: Vgtid | None
) -> tuple[list[StagedChange], int]:
    """The window read through the unharmed proxy, and the bytes it took on the wire."""
    before = proxy.stats.bytes_down
    changes, result = _read(hook, start, stop)
    assert result.stats["reconnects"] == 0
    assert replay(changes, key_index=[0]) == _source(hook)
    _no_duplicates(changes)
    return changes, proxy.stats.bytes_down - before


@pytest.mark.parametrize("seed", [1, 2])
def test_cut_mid_transaction_in_a_catch_up_stages_each_row_once(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port)
    start, stop = _catch_up_backlog(hook, seed)
    expected, wire_bytes = _reference(hook, proxy, start, stop)
    # The large transaction is most of the window's bytes: a cut in its middle half falls inside
    # it, after vtgate has sent some of its responses (the reader resumes from the VGTID before it).
    cut_at = random.Random(seed).randint(wire_bytes * 3 // 10, wire_bytes * 6 // 10)
    # A cut drops what gRPC received but the reader had not taken yet: at LAN speed the whole
    # transaction is in gRPC's buffers before the reader starts on it, and nothing partial is
    # ever seen. At ~0.5 MB/s the reader keeps up and holds the responses before the cut.
    proxy.slow(500_000)
    proxy.cut_after(cut_at)
    changes, result = _read(hook, start, stop)
    assert proxy.stats.cuts >= 1 and result.stats["reconnects"] >= 1
    _no_duplicates(changes)
    assert changes == expected
    assert result.stats["partial_rows_discarded"] > 0  # the cut did fall inside a transaction
    assert result.end_vgtid.has_reached(stop)


def test_cut_mid_copy_resumes_the_copy_without_duplicates(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port)
    rng = random.Random(3)
    setup_table(hook)
    for first in range(1, 12_001, 3000):
        insert_rows(hook, rng, range(first, first + 3000))
    shards = capture_stop_position(hook.open_vstream_raw, "customer")
    start = Vgtid.from_json(
        "["
        + ",".join(
            f'{{"keyspace": "customer", "shard": "{sg.shard}", "gtid": ""}}' for sg in shards.shard_gtids
        )
        + "]"
    )
    expected, wire_bytes = _reference(hook, proxy, start, None)
    proxy.cut_after(rng.randint(wire_bytes // 4, wire_bytes * 3 // 4))
    changes, result = _read(hook, start, None)
    assert proxy.stats.cuts >= 1 and result.stats["reconnects"] >= 1
    _no_duplicates(changes)
    assert replay(changes, key_index=[0]) == replay(expected, key_index=[0]) == _source(hook)


class _CutAfterFirstShardCopied:
    """One VStream call that arms the proxy's cut once a shard's own COPY_COMPLETED reaches the
    reader; gives up (a RuntimeError, not retried) when ``stop`` is set, so a read that waits
    forever ends with the test."""

    def __init__(self, call: Any, proxy: FaultProxy, stop: threading.Event, armed: list[str]) -> None:
        self._call, self._responses = call, iter(call)
        self._proxy, self._stop, self._armed = proxy, stop, armed

    def __iter__(self) -> _CutAfterFirstShardCopied:
        return self

    def __next__(self) -> bytes:
        if self._stop.is_set():
            raise RuntimeError("the test gave up on a read that did not end")
        data: bytes = next(self._responses)
        if not self._armed:
            for event in vtgate_pb2.VStreamResponse.FromString(data).events:
                if event.type == binlogdata_pb2.VEventType.COPY_COMPLETED and event.shard:
                    self._armed.append(event.shard)
                    self._proxy.cut_after(1)  # the next bytes from vtgate: mid-copy of the other shard
        return data

    def cancel(self) -> bool:
        return bool(self._call.cancel())


def test_cut_after_one_shard_finished_its_copy_still_ends_the_snapshot(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small soak seed 0 hung so for 10 minutes: the cut fell after one shard's copy ended. The
    reopened call does not copy on that shard, so vtgate never sends its stream-wide
    COPY_COMPLETED (it wants one from every shard in the same call), while heartbeats keep the
    call alive. The read must end when the other shard's copy does."""
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port)
    rng = random.Random(6)
    setup_table(hook)
    insert_rows(hook, rng, range(1, 41))  # both shards: one of them holds only these few rows
    for first in range(100_000, 112_000, 3000):  # the other one a copy of seconds on a slow link
        insert_rows(hook, rng, range(first, first + 3000), customer=ONE_SHARD_CUSTOMER)
    shards = capture_stop_position(hook.open_vstream_raw, "customer")
    start = Vgtid.from_proto(
        binlogdata_pb2.VGtid(
            shard_gtids=[
                binlogdata_pb2.ShardGtid(keyspace="customer", shard=sg.shard) for sg in shards.shard_gtids
            ]
        )
    )
    requests: list[vtgate_pb2.VStreamRequest] = []
    stop, armed = threading.Event(), list[str]()

    def open_stream(request: vtgate_pb2.VStreamRequest) -> _CutAfterFirstShardCopied:
        requests.append(vtgate_pb2.VStreamRequest.FromString(request.SerializeToString()))
        return _CutAfterFirstShardCopied(hook.open_vstream_raw(request), proxy, stop, armed)

    stager = ListStager()
    reader = _reader(hook, stager, start, None, open_stream)
    outcome: list[Any] = []
    proxy.slow(500_000)  # ~3 MB: the big shard copies for seconds after the small one is done
    thread = threading.Thread(target=lambda: outcome.append(reader.run()), daemon=True)
    thread.start()
    thread.join(timeout=90)
    stop.set()
    thread.join(timeout=30)
    assert armed and proxy.stats.cuts >= 1 and len(requests) >= 2
    # The reopened call: the finished shard has a position and no last key (it copies nothing
    # more), the other one still copies (no position yet, or a last key).
    resumed = {sg.shard: (sg.gtid, len(sg.table_p_ks)) for sg in requests[1].vgtid.shard_gtids}
    finished = resumed.pop(armed[0])
    assert finished[0] and not finished[1], finished
    assert [not gtid or pks > 0 for gtid, pks in resumed.values()] == [True], resumed
    assert outcome, "the snapshot read did not end after the cut (waited 90 s)"
    result = outcome[0]
    assert result.stats["reconnects"] >= 1
    _no_duplicates(stager.changes)
    assert replay(stager.changes, key_index=[0]) == _source(hook)


def test_stall_longer_than_the_keepalive_timeout_reconnects(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vtgate refuses pings more frequent than every 10 s (its keepalive enforcement policy).
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port, keepalive_seconds=10)
    start, stop = _catch_up_backlog(hook, 4)
    expected, _ = _reference(hook, proxy, start, stop)
    proxy.slow(200_000)  # the read lasts ~7 s, and is black-holed after 1 s
    stall = threading.Timer(1.0, proxy.stall)
    stall.start()
    began = time.monotonic()
    try:
        changes, result = _read(hook, start, stop)
    finally:
        stall.cancel()
    assert proxy.stats.stalled >= 1 and result.stats["reconnects"] >= 1
    assert changes == expected
    # Found by the heartbeat watchdog (10 s of silence), which drops the dead connection.
    assert time.monotonic() - began < 30


def test_slow_link_completes_the_window(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port)
    start, stop = _catch_up_backlog(hook, 5)
    expected, wire_bytes = _reference(hook, proxy, start, stop)
    proxy.slow(wire_bytes / 4)  # ~4 s for the window
    began = time.monotonic()
    changes, result = _read(hook, start, stop)
    assert time.monotonic() - began > 2  # the link really was slow
    assert result.stats["reconnects"] == 0
    assert changes == expected


def test_stop_position_honours_its_timeout_on_a_black_holed_link(
    vitess: LocalVitess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook(vitess, monkeypatch, "vitess_faults", proxy.port)
    capture_stop_position(hook.open_vstream_raw, "customer")  # the channel is up
    proxy.stall()
    proxy.slow(1)  # and every new connection crawls: no position can arrive in time
    began = time.monotonic()
    with pytest.raises(VStreamError, match="within 3s"):
        capture_stop_position(hook.open_vstream_raw, "customer", timeout=3)
    assert time.monotonic() - began < 6


def test_capture_streams_carry_no_wall_deadline(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A backlog of hours must not be cut by a fixed per-call deadline (it was 3600 s, and
    DEADLINE_EXCEEDED was final): the capture runner's real gRPC call has no deadline at all."""
    hook = _hook(vitess, monkeypatch, "vitess_faults", vitess.grpc_port)
    spec = SyncSpec("faults", "customer", (TABLE,), str(tmp_path / "staging"))
    runner = CaptureRunner(hook, CheckpointStore(f"sqlite:///{tmp_path}/store.db"), spec, holder="test")
    request = vtgate_pb2.VStreamRequest(tablet_type=topodata_pb2.PRIMARY)
    request.vgtid.CopyFrom(Vgtid.for_keyspace("customer").to_proto())
    call = runner._open(request)
    try:
        next(iter(call))  # the call is really open on vtgate
        assert call.time_remaining() is None
    finally:
        call.cancel()
