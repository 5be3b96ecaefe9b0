"""WindowReader across a reshard: real VStream protobuf messages, as vtgate sends them.

vtgate (v0.23, ``include_reshard_journal_events``) sends the old shard's JOURNAL inside its
transaction (BEGIN, JOURNAL, VGTID, COMMIT), ends the old shard's stream, and streams the new
shards from the positions the journal names; later VGTID events name the new shards.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2
from airflow_provider_vitess.exceptions import ShardsGoneError
from airflow_provider_vitess.vstream.window import WindowReader
from tests.support.scripted_window import KS, E, Recorder, ev, gtid, positions, read, sgtid, txn, vgtid

OLD = "0"
NEW = ("-80", "80-")


JOURNAL_STARTS = {"-80": gtid(2, 10), "80-": gtid(3, 20)}


def journal(ts: int, pos: str) -> list[binlogdata_pb2.VEvent]:
    j = binlogdata_pb2.Journal(
        id=7,
        migration_type=binlogdata_pb2.MigrationType.SHARDS,
        participants=[binlogdata_pb2.KeyspaceShard(keyspace=KS, shard=OLD)],
        shard_gtids=[sgtid(s, p) for s, p in JOURNAL_STARTS.items()],
    )
    return [
        ev(OLD, E.BEGIN, ts),
        ev(OLD, E.JOURNAL, ts, journal=j),
        ev(OLD, E.VGTID, ts, vgtid=binlogdata_pb2.VGtid(shard_gtids=[sgtid(OLD, pos)])),
        ev(OLD, E.COMMIT, ts),
    ]


def reshard_stream() -> list[binlogdata_pb2.VEvent]:
    """Old shard: rows 1 and 2, then its journal; new shards: row 3 on -80 (same second as the
    journal, and "-80" sorts before "0"), row 4 on 80-."""
    return [
        *txn(OLD, 100, gtid(1, 5), 1, with_field=True),
        *txn(OLD, 101, gtid(1, 6), 2),
        *journal(102, gtid(1, 7)),
        *txn("-80", 102, gtid(2, 11), 3, with_field=True),
        *txn("80-", 103, gtid(3, 21), 4, with_field=True),
    ]


START = vgtid((OLD, gtid(1, 4)))


def test_the_window_asks_vtgate_for_reshard_journals() -> None:
    _, _, server = read(START, vgtid((OLD, gtid(1, 6))), reshard_stream())
    assert server.requests[0].flags.include_reshard_journal_events is True


def test_a_start_shard_missing_from_the_stop_is_read_to_its_journal() -> None:
    """The stop was planned after the switch (it names the new shards only): every unit of the
    old shard up to its journal belongs to the window, not just the first one."""
    stop = vgtid(("-80", gtid(2, 11)), ("80-", gtid(3, 21)))
    result, stager, _ = read(START, stop, reshard_stream())
    assert (OLD, 2) in stager.rows
    # The journal is staged before any new shard's unit, though "-80" sorts before "0" in the
    # same second: the old shard's rows come first.
    assert stager.rows == [(OLD, 1), (OLD, 2), ("-80", 3), ("80-", 4)]
    assert result.stopped_early is None


def test_the_end_position_carries_the_new_shards_and_drops_the_old() -> None:
    stop = vgtid(("-80", gtid(2, 11)), ("80-", gtid(3, 21)))
    result, _, _ = read(START, stop, reshard_stream())
    assert positions(result.end_vgtid) == {"-80": gtid(2, 11), "80-": gtid(3, 21)}
    assert result.journals == 1
    assert result.retired_shards == [f"{KS}/{OLD}"]


def test_a_stop_at_the_journal_ends_on_the_journal_positions_of_the_new_shards() -> None:
    """The stop was planned at the switch (the old shard's position includes its journal): the
    window ends there, the new shards' units are the next window's, and the position names the
    new shards at the journal's positions, so the next window reads them from there."""
    result, stager, _ = read(START, vgtid((OLD, gtid(1, 7))), reshard_stream())
    assert stager.rows == [(OLD, 1), (OLD, 2)]
    assert positions(result.end_vgtid) == JOURNAL_STARTS


def test_a_stop_before_the_journal_keeps_the_old_shard() -> None:
    result, stager, _ = read(START, vgtid((OLD, gtid(1, 6))), reshard_stream())
    assert stager.rows == [(OLD, 1), (OLD, 2)]
    assert positions(result.end_vgtid) == {OLD: gtid(1, 6)}
    assert result.journals == 0


def test_a_window_starting_past_the_journal_reads_the_new_shards_only() -> None:
    """The next window, from the position the previous one ended on at the journal."""
    start = vgtid(*JOURNAL_STARTS.items())
    stop = vgtid(("-80", gtid(2, 11)), ("80-", gtid(3, 21)))
    events = reshard_stream()[-10:]  # the new shards' transactions only
    result, stager, server = read(start, stop, events)
    assert stager.rows == [("-80", 3), ("80-", 4)]
    assert positions(result.end_vgtid) == {"-80": gtid(2, 11), "80-": gtid(3, 21)}
    assert {sg.shard for sg in server.requests[0].vgtid.shard_gtids} == set(NEW)


class ShardNotFound(grpc.RpcError):
    """vtgate v0.23's answer when the VGTID names a deleted shard (vstream_manager.go)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return (
            "failed to determine if keyspace customer has been resharded: shard provided in VGTID, 0, "
            "not found in the customer keyspace"
        )


def test_a_position_naming_deleted_shards_is_a_clear_error() -> None:
    def server(request: vtgate_pb2.VStreamRequest) -> Iterator[vtgate_pb2.VStreamResponse]:
        raise ShardNotFound()

    reader = WindowReader(
        server, Recorder(), keyspace=KS, tables=["customer"], start=START, stop=vgtid(("-80", gtid(2, 11)))
    )
    with pytest.raises(
        ShardsGoneError, match=r"shard customer/0, which keyspace customer no longer has"
    ) as err:
        reader.run()
    assert "snapshot the sync again" in str(err.value)
    assert '{"resnapshot_tables": [...]} naming every table of the sync' in str(err.value)


def test_the_request_builder_adds_journals_to_the_callers_flags() -> None:
    from airflow_provider_vitess.vstream.request import vstream_request

    given = vtgate_pb2.VStreamFlags(heartbeat_interval=3, cells="zone1")
    request = vstream_request(flags=given, reshard_journals=True)
    assert (request.flags.heartbeat_interval, request.flags.cells) == (3, "zone1")
    assert request.flags.include_reshard_journal_events is True
    assert given.include_reshard_journal_events is False  # the caller's flags are left as they were
    assert vstream_request(flags=given).flags.include_reshard_journal_events is False
