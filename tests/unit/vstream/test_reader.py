"""VStreamReader (reconnect/backoff, driven by a fake open_stream) and EventDecoder."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, topodata_pb2, vtgate_pb2
from airflow_provider_vitess.decoding import wire
from airflow_provider_vitess.decoding.events import (
    BeginEvent,
    CommitEvent,
    CopyCompletedEvent,
    DdlEvent,
    Event,
    EventDecoder,
    FieldEvent,
    HeartbeatEvent,
    JournalEvent,
    LastPkEvent,
    Operation,
    OtherEvent,
    RowEvent,
    VgtidEvent,
)
from airflow_provider_vitess.exceptions import VitessConnectionError, VStreamDeadlineError, VStreamError
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import RetryPolicy, VStreamReader
from tests.support.vevents import KS, E, T, ev, ev_field, ev_row, ev_vgtid, qrow, resp, vgtid

SC = grpc.StatusCode
UUID_GTID = "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"


def insert(i: int) -> binlogdata_pb2.VEvent:
    return ev_row((None, qrow(str(i).encode(), f"u{i}@x".encode(), None)))


# -- a scripted open_stream --------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


Step = vtgate_pb2.VStreamResponse | Exception


class FakeStream:
    """Iterator of responses that raises the scripted errors; records cancel().

    ``serialized`` (set for every test by the ``response_form`` fixture) sends each response
    as bytes, as ``VitessHook.open_vstream_raw`` does, instead of a parsed message.
    """

    serialized = False

    def __init__(self, steps: Sequence[Step]) -> None:
        self._steps = iter(steps)
        self.cancelled = False

    def __iter__(self) -> Iterator[vtgate_pb2.VStreamResponse | bytes]:
        return self

    def __next__(self) -> vtgate_pb2.VStreamResponse | bytes:
        step = next(self._steps)
        if isinstance(step, Exception):
            raise step
        return step.SerializeToString() if self.serialized else step

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture(autouse=True, params=["parsed", "serialized"])
def response_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every reader test runs on parsed responses and on response bytes."""
    monkeypatch.setattr(FakeStream, "serialized", request.param == "serialized")
    return str(request.param)


class Server:
    """Stands in for ``hook.open_vstream``: one script per call, requests recorded."""

    def __init__(self, *scripts: Sequence[Step] | Exception) -> None:
        self._scripts = list(scripts)
        self.requests: list[vtgate_pb2.VStreamRequest] = []
        self.streams: list[FakeStream] = []

    def __call__(self, request: vtgate_pb2.VStreamRequest) -> FakeStream:
        self.requests.append(request)
        script = self._scripts.pop(0)
        if isinstance(script, Exception):
            raise script  # failing at call time, before any response
        stream = FakeStream(script)
        self.streams.append(stream)
        return stream

    def start_gtids(self) -> list[str]:
        return [r.vgtid.shard_gtids[0].gtid for r in self.requests]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_reader(server: Server, clock: Clock | None = None, **kw: Any) -> VStreamReader:
    clock = clock or Clock()
    kw.setdefault("vgtid", vgtid("MySQL56/start"))
    kw.setdefault("retry", RetryPolicy(max_attempts=3, initial_delay=1.0, max_delay=5.0, jitter=0.2))
    return VStreamReader(server, sleep=clock.sleep, clock=clock, rand=lambda: 0.5, **kw)


def unavailable() -> FakeRpcError:
    return FakeRpcError(SC.UNAVAILABLE, "vtgate is restarting")


# -- reader: happy path ------------------------------------------------------------------------


def test_events_are_typed_and_last_vgtid_tracked() -> None:
    server = Server([resp(ev_field(), ev(E.BEGIN), insert(1)), resp(ev_vgtid("MySQL56/a:1"), ev(E.COMMIT))])
    flags = vtgate_pb2.VStreamFlags(minimize_skew=True, heartbeat_interval=5)
    filt = binlogdata_pb2.Filter(rules=[binlogdata_pb2.Rule(match="customer")])
    reader = make_reader(server, filter=filt, flags=flags, tablet_type="replica")
    kinds = [type(e) for e in reader.events()]
    assert kinds == [FieldEvent, BeginEvent, RowEvent, VgtidEvent, CommitEvent]
    assert reader.last_vgtid == vgtid("MySQL56/a:1")
    (request,) = server.requests
    assert request.tablet_type == topodata_pb2.REPLICA
    assert request.vgtid == vgtid("MySQL56/start")
    assert request.filter == filt and request.flags == flags
    assert reader.reconnects == 0


def test_keyspace_alone_starts_from_current() -> None:
    server = Server([])
    list(VStreamReader(server, keyspace=KS).events())
    (request,) = server.requests
    assert list(request.vgtid.shard_gtids) == [
        binlogdata_pb2.ShardGtid(keyspace=KS, shard="", gtid="current")
    ]
    assert request.tablet_type == topodata_pb2.PRIMARY


def test_start_from_vgtid_value_and_bad_arguments() -> None:
    server = Server([])
    list(VStreamReader(server, vgtid=Vgtid.for_keyspace(KS, "")).events())
    assert server.requests[0].vgtid.shard_gtids[0].gtid == ""
    with pytest.raises(ValueError, match="start vgtid or a keyspace"):
        VStreamReader(server)
    with pytest.raises(ValueError, match="unknown tablet type 'leader'"):
        VStreamReader(server, keyspace=KS, tablet_type="leader")


# -- reader: reconnects --------------------------------------------------------------------------


def test_resume_from_last_vgtid_redelivers_partial_transaction() -> None:
    first: list[Step] = [
        resp(ev_field(), ev(E.BEGIN), insert(1), ev_vgtid("MySQL56/a:1"), ev(E.COMMIT)),
        resp(ev(E.BEGIN), insert(2)),  # transaction 2 cut before its VGTID
        unavailable(),
    ]
    second = [resp(ev_field(), ev(E.BEGIN), insert(2), ev_vgtid("MySQL56/a:2"), ev(E.COMMIT))]
    server, clock = Server(first, second), Clock()
    reader = make_reader(server, clock)
    rows = [e.changes[0].after for e in reader.events() if isinstance(e, RowEvent)]
    assert rows == [(1, "u1@x", None), (2, "u2@x", None), (2, "u2@x", None)]  # at-least-once
    assert server.start_gtids() == ["MySQL56/start", "MySQL56/a:1"]
    assert clock.sleeps == [1.0]
    assert reader.reconnects == 1
    assert reader.last_vgtid == vgtid("MySQL56/a:2")
    assert server.streams[0].cancelled


def test_cut_before_any_vgtid_restarts_from_start_position() -> None:
    server = Server([resp(ev_field(), ev(E.BEGIN)), unavailable()], [resp(ev_vgtid("MySQL56/a:1"))])
    reader = make_reader(server)
    list(reader.events())
    assert server.start_gtids() == ["MySQL56/start", "MySQL56/start"]


def test_backoff_grows_caps_and_gives_up_after_max_attempts() -> None:
    clock = Clock()
    server = Server(*([[unavailable()]] * 5))
    policy = RetryPolicy(max_attempts=4, initial_delay=1.0, multiplier=2.0, max_delay=5.0, jitter=0.2)
    reader = make_reader(server, clock, retry=policy)
    with pytest.raises(VitessConnectionError) as info:
        list(reader.events())
    assert clock.sleeps == [1.0, 2.0, 4.0, 5.0]
    assert len(server.requests) == 5
    assert server.start_gtids() == ["MySQL56/start"] * 5
    message = str(info.value)
    assert "gave up after 4 reconnect attempts" in message
    assert "gRPC status UNAVAILABLE: vtgate is restarting" in message
    assert "keyspace customer" in message


def test_jitter_bounds() -> None:
    policy = RetryPolicy(initial_delay=2.0, multiplier=3.0, max_delay=100.0, jitter=0.25)
    assert policy.delay(1, 0.0) == pytest.approx(1.5)
    assert policy.delay(1, 0.5) == pytest.approx(2.0)
    assert policy.delay(2, 0.999999) == pytest.approx(7.5, rel=1e-5)
    assert policy.delay(5, 1.0) == 100.0  # never above the cap, even with jitter
    assert policy.delay(10_000, 0.5) == 100.0  # no overflow


def test_gives_up_on_max_elapsed() -> None:
    clock = Clock()
    server = Server(*([[unavailable()]] * 10))
    policy = RetryPolicy(max_attempts=100, max_elapsed=10.0, initial_delay=2.0, multiplier=2.0, jitter=0.0)
    reader = make_reader(server, clock, retry=policy)
    with pytest.raises(VitessConnectionError, match=r"gave up after 2 reconnect attempts in 6\.0s"):
        list(reader.events())
    # 2 s, then 4 s (elapsed 6 s); the next 8 s would end past 10 s.
    assert clock.sleeps == [2.0, 4.0]


def test_progress_resets_the_backoff() -> None:
    clock = Clock()
    server = Server(
        [unavailable()],
        [unavailable()],
        [resp(ev_vgtid("MySQL56/a:1")), unavailable()],  # progress, then cut
        [resp(ev(E.HEARTBEAT, timestamp=5, current_time=5 * 10**9)), unavailable()],  # healthy, then cut
        [resp(ev_vgtid("MySQL56/a:2"))],
    )
    reader = make_reader(server, clock, retry=RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0))
    list(reader.events())
    assert clock.sleeps == [1.0, 2.0, 1.0, 1.0]
    assert server.start_gtids() == [
        "MySQL56/start",
        "MySQL56/start",
        "MySQL56/start",
        "MySQL56/a:1",
        "MySQL56/a:1",
    ]
    assert reader.reconnects == 4


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (SC.UNAVAILABLE, "connection refused"),
        (SC.RESOURCE_EXHAUSTED, "transaction pool connection limit exceeded"),
        (SC.ABORTED, "vttablet: transaction rolled back"),
        (SC.INTERNAL, "Received RST_STREAM with error code 2"),
        (SC.INTERNAL, "transport is closing"),
        # vtgate's stream from a tablet broke (tablet restart, reparent): vtgate passes it on.
        (SC.UNKNOWN, "vstream ended unexpectedly"),
        (SC.UNKNOWN, "rpc error: code = Unknown desc = stream timeout"),
        (SC.CANCELLED, "grpc: the client connection is closing"),
        # No stream call of ours carries a deadline: one from the server side is a cut.
        (SC.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    ],
)
def test_transient_codes_are_retried(code: grpc.StatusCode, details: str) -> None:
    clock = Clock()
    server = Server([FakeRpcError(code, details)], [resp(ev_vgtid("MySQL56/a:1"))])
    list(make_reader(server, clock).events())
    assert len(server.requests) == 2 and clock.sleeps == [1.0]


def test_error_at_call_time_is_retried() -> None:
    clock = Clock()
    server = Server(unavailable(), [resp(ev_vgtid("MySQL56/a:1"))])
    list(make_reader(server, clock).events())
    assert len(server.requests) == 2 and clock.sleeps == [1.0]


def test_exhausted_non_connection_error_is_vstream_error() -> None:
    server = Server(*([[FakeRpcError(SC.ABORTED, "tx killed")]] * 4))
    with pytest.raises(VStreamError, match=r"gave up after 3 reconnect attempts.*ABORTED: tx killed") as info:
        list(make_reader(server).events())
    assert not isinstance(info.value, VitessConnectionError)


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (SC.INVALID_ARGUMENT, "vgtid is invalid"),
        (SC.NOT_FOUND, "table customer2 not found"),
        (SC.FAILED_PRECONDITION, "Cannot determine tablet for shard -80"),
        (SC.UNKNOWN, "unknown keyspace nope"),
        (SC.INTERNAL, "not all journaling participants are in the stream"),
        (SC.CANCELLED, "context canceled"),
    ],
)
def test_non_transient_codes_fail_at_once(code: grpc.StatusCode, details: str) -> None:
    clock = Clock()
    server = Server([FakeRpcError(code, details)])
    with pytest.raises(VStreamError) as info:
        list(make_reader(server, clock).events())
    assert str(info.value) == f"VStream for keyspace customer failed with gRPC status {code.name}: {details}"
    assert len(server.requests) == 1 and clock.sleeps == []
    assert server.streams[0].cancelled


@pytest.mark.parametrize("code", [SC.UNAUTHENTICATED, SC.PERMISSION_DENIED])
def test_auth_errors_are_connection_errors(code: grpc.StatusCode) -> None:
    server = Server([FakeRpcError(code, "bad user")])
    with pytest.raises(VitessConnectionError, match=rf"vtgate refused the VStream.*{code.name}\): bad user"):
        list(make_reader(server).events())
    assert len(server.requests) == 1


def test_deadline_exceeded_is_final_when_the_caller_bounds_its_call() -> None:
    server = Server([FakeRpcError(SC.DEADLINE_EXCEEDED, "Deadline Exceeded")])
    with pytest.raises(VStreamError, match="DEADLINE_EXCEEDED"):
        list(make_reader(server, retry=RetryPolicy(retry_deadline_exceeded=False)).events())
    assert len(server.requests) == 1


class SilentStream(FakeStream):
    """A stream whose connection went quiet: ``next()`` blocks until the call is cancelled."""

    def __init__(self) -> None:
        super().__init__([])
        self._cancelled = threading.Event()

    def __next__(self) -> vtgate_pb2.VStreamResponse | bytes:
        if not self._cancelled.wait(30):
            raise AssertionError("the reader never cancelled a silent stream")
        raise FakeRpcError(SC.CANCELLED, "Locally cancelled by application!")

    def cancel(self) -> None:
        super().cancel()
        self._cancelled.set()


def test_a_stream_silent_past_its_heartbeats_is_cancelled_and_reopened() -> None:
    server = Server([resp(ev_vgtid("MySQL56/a:1"))])
    silent = SilentStream()
    calls = iter([silent])

    def open_stream(request: vtgate_pb2.VStreamRequest) -> FakeStream:
        stream = next(calls, None)
        return stream if stream is not None else server(request)

    clock = Clock()
    reader = make_reader(
        open_stream,  # type: ignore[arg-type]
        clock,
        flags=vtgate_pb2.VStreamFlags(heartbeat_interval=1),
        idle_timeout=0.2,
    )
    began = time.monotonic()
    events = list(reader.events())
    assert silent.cancelled and reader.reconnects == 1 and clock.sleeps == [1.0]
    assert [type(e).__name__ for e in events] == ["VgtidEvent"]
    assert time.monotonic() - began < 5


def test_heartbeats_asked_for_set_the_idle_timeout_and_none_asked_for_leave_keepalive_alone() -> None:
    with_beats = make_reader(Server(), flags=vtgate_pb2.VStreamFlags(heartbeat_interval=3))
    assert with_beats._idle_timeout == 15.0
    assert make_reader(Server(), flags=vtgate_pb2.VStreamFlags(heartbeat_interval=1))._idle_timeout == 10.0
    assert make_reader(Server())._idle_timeout is None


def test_a_bounded_read_ends_with_a_deadline_error() -> None:
    silent = SilentStream()
    reader = make_reader(lambda request: silent, deadline=time.monotonic() + 0.3)  # type: ignore[arg-type]
    began = time.monotonic()
    with pytest.raises(VStreamDeadlineError, match="did not finish by its deadline"):
        list(reader.events())
    assert silent.cancelled and time.monotonic() - began < 3


def test_message_too_large_is_not_retried() -> None:
    server = Server(
        [FakeRpcError(SC.RESOURCE_EXHAUSTED, "Received message larger than max (5000000 vs. 4194304)")]
    )
    with pytest.raises(VStreamError, match=r"RESOURCE_EXHAUSTED.*max receive message length"):
        list(make_reader(server).events())
    assert len(server.requests) == 1


def test_consumer_stopping_early_cancels_the_call() -> None:
    server = Server([resp(ev(E.BEGIN), ev(E.COMMIT))])
    events = make_reader(server).events()
    assert isinstance(next(events), BeginEvent)
    events.close()
    assert server.streams[0].cancelled


def test_row_before_field_fails_the_stream() -> None:
    server = Server([resp(insert(1))])
    with pytest.raises(VStreamError, match=r"ROW event for table 'customer'.*before any FIELD event"):
        list(make_reader(server).events())


def test_exclude_keyspace_flag_keeps_table_names() -> None:
    server = Server(
        [resp(ev_field(table="customer"), ev_row((None, qrow(b"1", b"a", None)), table="customer"))]
    )
    flags = vtgate_pb2.VStreamFlags(exclude_keyspace_from_table_name=True)
    tables = [
        e.table for e in make_reader(server, flags=flags).events() if isinstance(e, FieldEvent | RowEvent)
    ]
    assert tables == ["customer", "customer"]


# -- EventDecoder ----------------------------------------------------------------------------


class Decoder(EventDecoder):
    """EventDecoder fed the way the reader feeds it: the VEvent itself, or, on response bytes,
    its view (``decoding/wire.py``), which must decode to the same event."""

    def decode(self, ev: binlogdata_pb2.VEvent) -> Event:
        if FakeStream.serialized:
            (ev,) = wire.parse_response(resp(ev).SerializeToString()).events
        return super().decode(ev)


def test_field_and_row_events() -> None:
    dec = Decoder()
    fe = dec.decode(ev_field())
    assert isinstance(fe, FieldEvent)
    assert (fe.keyspace, fe.shard, fe.table) == (KS, "0", "customer")
    assert fe.column_names == ("id", "email", "doc")
    assert fe.timestamp == 1700000000
    re_ = dec.decode(
        ev_row(
            (None, qrow(b"1", b"a@x", b'{"k": 1}')),
            (qrow(b"1", b"a@x", None), qrow(b"1", "b😀@x".encode(), None)),
            (qrow(b"2", None, None), None),
        )
    )
    assert isinstance(re_, RowEvent)
    assert (re_.keyspace, re_.shard, re_.table) == (KS, "0", "customer")
    assert (re_.timestamp, re_.current_time) == (1700000001, 1700000002 * 10**9)
    assert [c.operation for c in re_.changes] == [Operation.INSERT, Operation.UPDATE, Operation.DELETE]
    assert re_.changes[0].after == (1, "a@x", '{"k": 1}')
    assert re_.changes[1].before == (1, "a@x", None) and re_.changes[1].after == (1, "b😀@x", None)
    assert re_.changes[2].before == (2, None, None) and re_.changes[2].after is None
    assert re_.changes[0].present_columns is None


def test_decoders_are_per_shard_and_refreshed_by_field_events() -> None:
    dec = Decoder()
    dec.decode(ev_field(shard="-80"))
    with pytest.raises(VStreamError, match="'customer' \\(keyspace 'customer', shard '80-'\\)"):
        dec.decode(ev_row((None, qrow(b"1", b"a", None)), shard="80-"))
    # A schema change: the next FIELD event replaces the column list.
    fe = binlogdata_pb2.FieldEvent(
        table_name="customer.customer",
        keyspace=KS,
        shard="-80",
        fields=[query_pb2.Field(name="id", type=T.INT64)],
    )
    dec.decode(ev(E.FIELD, field_event=fe, keyspace=KS, shard="-80"))
    re_ = dec.decode(ev_row((None, qrow(b"9")), shard="-80"))
    assert isinstance(re_, RowEvent) and re_.changes[0].after == (9,) and re_.column_names == ("id",)


def test_partial_row_images() -> None:
    dec = Decoder()
    dec.decode(ev_field())
    event = ev_row((qrow(b"1", b"a", None), qrow(b"1", None, b"JSON_INSERT(`doc`, '$.x', 1)")))
    rc = event.row_event.row_changes[0]
    rc.data_columns.CopyFrom(binlogdata_pb2.RowChange.Bitmap(count=3, cols=bytes([0b101])))
    rc.json_partial_values.CopyFrom(binlogdata_pb2.RowChange.Bitmap(count=1, cols=bytes([0b1])))
    change = dec.decode(event).changes[0]  # type: ignore[union-attr]
    assert change.present_columns == frozenset({0, 2})
    assert change.json_partial_columns == frozenset({2})
    assert change.after == (1, None, "JSON_INSERT(`doc`, '$.x', 1)")


def test_vgtid_event() -> None:
    event = Decoder().decode(ev_vgtid(UUID_GTID, shard="-80"))
    assert isinstance(event, VgtidEvent)
    assert event.positions() == {(KS, "-80"): UUID_GTID}
    assert event.to_vgtid() == Vgtid.from_proto(vgtid(UUID_GTID, shard="-80"))
    assert (event.keyspace, event.shard) == (KS, "-80")


def test_copy_completed_per_shard_and_for_the_stream() -> None:
    dec = Decoder()
    shard = dec.decode(ev(E.COPY_COMPLETED, keyspace=KS, shard="-80"))
    final = dec.decode(ev(E.COPY_COMPLETED))
    assert isinstance(shard, CopyCompletedEvent) and not shard.is_stream_complete
    assert isinstance(final, CopyCompletedEvent) and final.is_stream_complete


def test_other_event_kinds() -> None:
    dec = Decoder()
    hb = dec.decode(
        ev(E.HEARTBEAT, timestamp=7, current_time=7_500_000_000, throttled=True, throttled_reason="lag")
    )
    assert isinstance(hb, HeartbeatEvent) and (hb.timestamp, hb.current_time, hb.throttled) == (
        7,
        7_500_000_000,
        True,
    )
    ddl = dec.decode(ev(E.DDL, statement="alter table customer add column x int", keyspace=KS, shard="0"))
    assert isinstance(ddl, DdlEvent) and ddl.statement.startswith("alter table")
    journal = binlogdata_pb2.Journal(
        id=3,
        migration_type=binlogdata_pb2.SHARDS,
        participants=[binlogdata_pb2.KeyspaceShard(keyspace=KS, shard="0")],
    )
    je = dec.decode(ev(E.JOURNAL, journal=journal, keyspace=KS, shard="0"))
    assert isinstance(je, JournalEvent) and je.migration_type == "SHARDS" and je.participants == ((KS, "0"),)
    lastpk = query_pb2.QueryResult(fields=[query_pb2.Field(name="id", type=T.INT64)], rows=[qrow(b"42")])
    lp = dec.decode(
        ev(
            E.LASTPK,
            keyspace=KS,
            shard="0",
            last_p_k_event=binlogdata_pb2.LastPKEvent(
                table_last_p_k=binlogdata_pb2.TableLastPK(table_name="customer", lastpk=lastpk)
            ),
        )
    )
    assert isinstance(lp, LastPkEvent) and lp.table == "customer" and lp.lastpk_values() == (42,)
    assert not lp.completed
    other = dec.decode(ev(E.SAVEPOINT, statement="SAVEPOINT a"))
    assert isinstance(other, OtherEvent) and other.type == "SAVEPOINT" and other.statement == "SAVEPOINT a"
    assert type(other.raw) is binlogdata_pb2.VEvent and other.raw == ev(E.SAVEPOINT, statement="SAVEPOINT a")
    newer = dec.decode(ev(99, gtid="g"))
    assert isinstance(newer, OtherEvent) and newer.type == "99"
    assert type(newer.raw) is binlogdata_pb2.VEvent and newer.raw.gtid == "g"


def test_decoded_values_use_the_value_rules() -> None:
    dec = Decoder()
    fields = [query_pb2.Field(name="at", type=T.DATETIME), query_pb2.Field(name="d", type=T.DATE)]
    dec.decode(
        ev(
            E.FIELD,
            field_event=binlogdata_pb2.FieldEvent(
                table_name="customer.t", fields=fields, keyspace=KS, shard="0"
            ),
        )
    )
    event = dec.decode(ev_row((None, qrow(b"2024-01-02 03:04:05.5", b"0000-00-00")), table="customer.t"))
    assert isinstance(event, RowEvent)
    assert event.changes[0].after == (datetime.datetime(2024, 1, 2, 3, 4, 5, 500000), "0000-00-00")


@pytest.mark.parametrize(
    "details",
    [
        # What vtgate v0.23 really reports for a purged start position (local vtgate, binlogs
        # purged with PURGE BINARY LOGS): its tablet picker hides the tablet's MySQL error 1236.
        'error starting stream from shard GTID keyspace:"customer" shard:"-80" gtid:"MariaDB/0-1-802": '
        "failed to find a PRIMARY tablet for VStream in customer/-80 within the test cell(s): "
        "context has expired",
        "vttablet: rpc error: code = Unknown desc = stream (at source tablet) error @ 0-1-802: Could not "
        "find GTID state requested by slave in any binlog files. Probably the slave state is too old and "
        "required binlog files have been purged. (errno 1236) (sqlstate HY000)",
    ],
)
def test_a_start_position_gone_from_the_binlogs_says_to_snapshot_again(details: str) -> None:
    code = SC.CANCELLED if "context has expired" in details else SC.UNKNOWN
    server = Server([FakeRpcError(code, details)])
    reader = make_reader(server, vgtid=vgtid("MariaDB/0-1-802", shard="-80"))
    with pytest.raises(
        VStreamError, match=r"may be gone from the source's binlogs.*snapshotted again"
    ) as gone:
        list(reader.events())
    assert len(server.requests) == 1
    # The remedy says how (the run that heals), not only what.
    assert '{"resnapshot_tables": [...]} naming every table of the sync' in str(gone.value)


def _two_shards(low: str, high: str) -> binlogdata_pb2.VGtid:
    return binlogdata_pb2.VGtid(
        shard_gtids=[
            binlogdata_pb2.ShardGtid(keyspace=KS, shard="-80", gtid=low),
            binlogdata_pb2.ShardGtid(keyspace=KS, shard="80-", gtid=high),
        ]
    )


@pytest.mark.parametrize(("named", "gone"), [("MariaDB/0-1-802", True), ("MariaDB/0-1-803", False)])
def test_a_shard_that_cannot_start_from_its_start_is_gone_though_another_shard_moved_on(
    named: str, gone: bool
) -> None:
    # Seen on the local cluster: binlogs purged on shard -80 only; vtgate streams 80- (the
    # stream "started") and then gives up on -80, naming the position it could not start from.
    details = (
        f'error starting stream from shard GTID keyspace:"{KS}" shard:"-80" gtid:"{named}": failed to '
        "find a PRIMARY tablet for VStream in customer/-80 within the zone1 cell(s): context has expired"
    )
    moved = binlogdata_pb2.VEvent(type=E.VGTID, vgtid=_two_shards("MariaDB/0-1-802", "MariaDB/0-2-901"))
    server = Server([resp(moved), FakeRpcError(SC.CANCELLED, details)])
    with pytest.raises(VStreamError) as info:
        list(make_reader(server, vgtid=_two_shards("MariaDB/0-1-802", "MariaDB/0-2-900")).events())
    assert ("may be gone from the source's binlogs" in str(info.value)) is gone, str(info.value)


def test_a_stream_past_its_start_is_not_told_to_snapshot_again() -> None:
    details = "failed to find a PRIMARY tablet for VStream in customer/-80: context has expired"
    server = Server([resp(ev_vgtid("MySQL56/a:1")), FakeRpcError(SC.CANCELLED, details)])
    with pytest.raises(VStreamError) as info:
        list(make_reader(server).events())
    assert "snapshotted again" not in str(info.value)
