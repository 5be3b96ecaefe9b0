"""A snapshot read cut mid-copy: the copy ends when each shard's copy does, across reconnects.

vtgate (v0.23) sends its stream-wide COPY_COMPLETED only when every shard sent its own in the
*same* call; a call reopened from the last VGTID does not copy on a shard that had finished
(position, no table last-PK), so that event never comes while heartbeats keep the call alive
(small soak seed 0 waited so for 10 minutes). Scripted calls here, real VStream messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2
from airflow_provider_vitess.exceptions import CopyStalledError, is_permanent
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS
from airflow_provider_vitess.vstream.window import WindowReader

E = binlogdata_pb2.VEventType
KS = "customer"
SHARDS = ("-80", "80-")


def g(n: int) -> str:
    """A position on shard -80."""
    return f"MariaDB/0-1-{n}"


def h(n: int) -> str:
    """A position on shard 80-."""
    return f"MariaDB/0-2-{n}"


class Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"


class Vtgate:
    """Scripted calls; keeps each shard's VGTID entry and sends the whole VGTID, as vtgate does."""

    def __init__(self, calls: Sequence[Sequence[Any]]) -> None:
        self.calls = [list(c) for c in calls]
        self.requests: list[vtgate_pb2.VStreamRequest] = []

    def __call__(self, request: vtgate_pb2.VStreamRequest) -> Iterator[vtgate_pb2.VStreamResponse]:
        self.requests.append(vtgate_pb2.VStreamRequest.FromString(request.SerializeToString()))
        steps = self.calls.pop(0)

        def responses() -> Iterator[vtgate_pb2.VStreamResponse]:
            for step in steps:
                if isinstance(step, Exception):
                    raise step
                yield vtgate_pb2.VStreamResponse(events=step)

        return responses()


def _entry(shard: str, pos: str, copying: Sequence[tuple[str, int]]) -> binlogdata_pb2.ShardGtid:
    pks = [
        binlogdata_pb2.TableLastPK(
            table_name=table,
            lastpk=query_pb2.QueryResult(
                fields=[query_pb2.Field(name="id", type=query_pb2.Type.INT64)],
                rows=[query_pb2.Row(lengths=[len(str(pk))], values=str(pk).encode())],
            ),
        )
        for table, pk in copying
    ]
    return binlogdata_pb2.ShardGtid(keyspace=KS, shard=shard, gtid=pos, table_p_ks=pks)


class Shards:
    """Each shard's position and tables in copy, for whole-VGTID events."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[str, list[tuple[str, int]]]] = {s: ("", []) for s in SHARDS}

    def vgtid(self, shard: str, pos: str, copying: Sequence[tuple[str, int]] = ()) -> binlogdata_pb2.VEvent:
        self.state[shard] = (pos, list(copying))
        entries = [_entry(s, p, c) for s, (p, c) in self.state.items()]
        return binlogdata_pb2.VEvent(
            type=E.VGTID, keyspace=KS, shard=shard, vgtid=binlogdata_pb2.VGtid(shard_gtids=entries)
        )

    def rows(
        self, shard: str, table: str, pos: str, *ids: int, more: bool = True
    ) -> list[binlogdata_pb2.VEvent]:
        """A copy batch: FIELD, ROW, and the VGTID with the table's last key (``more``) or
        without it (the table's copy on the shard is done)."""
        fields = [query_pb2.Field(name="id", type=query_pb2.Type.INT64, charset=63)]
        changes = [
            binlogdata_pb2.RowChange(after=query_pb2.Row(lengths=[len(str(i))], values=str(i).encode()))
            for i in ids
        ]
        name = f"{KS}.{table}"
        return [
            binlogdata_pb2.VEvent(
                type=E.FIELD,
                keyspace=KS,
                shard=shard,
                field_event=binlogdata_pb2.FieldEvent(
                    table_name=name, fields=fields, keyspace=KS, shard=shard
                ),
            ),
            binlogdata_pb2.VEvent(
                type=E.ROW,
                keyspace=KS,
                shard=shard,
                row_event=binlogdata_pb2.RowEvent(
                    table_name=name, row_changes=changes, keyspace=KS, shard=shard
                ),
            ),
            self.vgtid(shard, pos, [(table, max(ids))] if more else []),
        ]


def copied(shard: str) -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=E.COPY_COMPLETED, keyspace=KS, shard=shard)


def heartbeats(n: int) -> list[list[binlogdata_pb2.VEvent]]:
    return [[binlogdata_pb2.VEvent(type=E.HEARTBEAT, timestamp=100)] for _ in range(n)]


class Rows:
    def __init__(self) -> None:
        self.ids: list[int] = []

    def set_schema(self, keyspace: str, table: str, fields: Sequence[Any], shard: str = "") -> None:
        pass

    def add_rows(
        self, keyspace: str, table: str, shard: str, commit_ts: int, first_seq: int, changes: Any
    ) -> None:
        self.ids.extend(int(c.after[0]) for c in changes)

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None:
        pass


def snapshot(vtgate: Vtgate, tables: Sequence[str], start: Vgtid | None = None) -> tuple[Any, Rows]:
    rows = Rows()
    start = start or Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=[_entry(s, "", []) for s in SHARDS]))
    reader = WindowReader(vtgate, rows, keyspace=KS, tables=tables, start=start, stop=None)
    reader._reader._sleep = lambda _: None  # no backoff wait between the scripted calls
    return reader.run(), rows


def test_a_cut_after_one_shard_copied_ends_when_the_other_shard_has_copied() -> None:
    s = Shards()
    first = [
        s.rows("-80", "t", g(1), 1),
        s.rows("80-", "t", h(1), 2),
        [s.vgtid("80-", h(1)), copied("80-")],  # 80- is done; its VGTID names no last key now
        Unavailable(),
    ]
    # Reopened: 80- has nothing to copy and only streams (heartbeats); -80 goes on with its copy.
    # vtgate's stream-wide COPY_COMPLETED never comes: 80- sent no COPY_COMPLETED in this call.
    second = [s.rows("-80", "t", g(2), 3, more=False), [copied("-80")], *heartbeats(3)]
    vtgate = Vtgate([first, second])
    result, rows = snapshot(vtgate, ["t"])
    assert sorted(rows.ids) == [1, 2, 3]
    resumed = {sg.shard: sg for sg in vtgate.requests[1].vgtid.shard_gtids}
    assert resumed["80-"].gtid == h(1) and not resumed["80-"].table_p_ks
    assert list(vtgate.requests[1].flags.tables_to_copy) == []  # 80- copied everything
    assert {sg.shard: (sg.gtid, len(sg.table_p_ks)) for sg in result.end_vgtid.to_proto().shard_gtids} == {
        "-80": (g(2), 0),
        "80-": (h(1), 0),
    }
    assert result.stats["reconnects"] == 1


def test_a_cut_between_two_tables_copies_that_shard_again_from_the_start() -> None:
    s = Shards()
    first = [
        s.rows("-80", "t1", g(1), 1),
        s.rows("-80", "t1", g(2), 3, more=False),  # t1 done on -80, t2 not begun: no last key
        s.rows("80-", "t1", h(1), 2),
        Unavailable(),
    ]
    second = [
        s.rows("-80", "t1", g(3), 1, 3, more=False),  # -80 copies again from the start
        s.rows("-80", "t2", g(4), 10, more=False),
        [copied("-80")],
        s.rows("80-", "t1", h(2), 2, 4, more=False),
        s.rows("80-", "t2", h(3), 20, more=False),
        [copied("80-"), binlogdata_pb2.VEvent(type=E.COPY_COMPLETED)],
    ]
    vtgate = Vtgate([first, second])
    _, rows = snapshot(vtgate, ["t1", "t2"])
    # With its position (and no last key) -80 would have skipped t2: it starts over instead;
    # 80- goes on from its last key of t1.
    resumed = {sg.shard: (sg.gtid, len(sg.table_p_ks)) for sg in vtgate.requests[1].vgtid.shard_gtids}
    assert resumed == {"-80": ("", 0), "80-": (h(1), 1)}
    assert list(vtgate.requests[1].flags.tables_to_copy) == []
    assert set(rows.ids) == {1, 2, 3, 4, 10, 20}


def test_a_resumed_snapshot_whose_shards_show_no_copy_left_copies_again_rather_than_wait() -> None:
    """A resume from a checkpoint naming a position and no last key on every shard (its tables
    all marked copied, the stream-wide event not seen): no shard would copy, nothing would end
    the read. Every shard copies again instead."""
    start = Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=[_entry(s, g(9), []) for s in SHARDS]))
    s = Shards()
    call = [
        s.rows("-80", "t", g(1), 1, more=False),
        s.rows("80-", "t", h(1), 2, more=False),
        [copied("-80")],
        [copied("80-")],
        *heartbeats(3),
    ]
    vtgate = Vtgate([call])
    _, rows = snapshot(vtgate, ["t"], start)
    assert [sg.gtid for sg in vtgate.requests[0].vgtid.shard_gtids] == ["", ""]
    assert sorted(rows.ids) == [1, 2]


def _stalled(calls: list[Any], tables: Sequence[str], stall: float | None = None) -> tuple[str, Rows]:
    """Runs a snapshot whose clock moves a minute per look; the stall error's message."""
    ticks = iter(range(0, 1_000_000, 60))  # each look at the clock: a minute later
    rows = Rows()
    start = Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=[_entry(sh, "", []) for sh in SHARDS]))
    reader = WindowReader(
        Vtgate([calls]), rows, keyspace=KS, tables=tables, start=start, stop=None,
        clock=lambda: next(ticks), copy_stall_seconds=COPY_STALL_SECONDS if stall is None else stall,
    )  # fmt: skip
    with pytest.raises(CopyStalledError) as failed:
        reader.run()
    assert is_permanent(failed.value)  # a retry with the same vttablet flags stalls the same way
    return str(failed.value), rows


def test_a_copy_that_stops_moving_while_heartbeats_go_on_fails_naming_its_shard_table_and_flag() -> None:
    """vtgate restarts a copy query that vttablet's copy-phase duration ended from the last
    copied key; one that sends no row within it restarts for ever, and the client hears only
    heartbeats. The error names the shard, the table it copies, the flag and the remedy."""
    s = Shards()
    call = [
        s.rows("-80", "a", g(1), 1, more=False),
        s.rows("-80", "b", g(2), 2, more=False),
        [copied("-80")],
        s.rows("80-", "a", h(1), 3, more=False),
        s.rows("80-", "b", h(2), 4),  # 80- names b in copy, and then: only heartbeats
        *heartbeats(30),
    ]
    message, rows = _stalled(call, ["a", "b"], stall=900)
    assert sorted(rows.ids) == [1, 2, 3, 4]
    assert re.search(r"sent no row for \d+s \(shard 80-: table 'b'\)", message), message
    assert "copy_stall_timeout=900s" in message
    assert "--vreplication-copy-phase-duration" in message
    assert (
        "Remedy: raise --vreplication-copy-phase-duration on the vttablets of keyspace 'customer'" in message
    )


def test_a_copy_stalled_before_its_first_row_names_the_first_table_the_shard_has_not_copied() -> None:
    """A table without a primary key is copied sorted whole: a shard that never sends its first
    row names no table in any position; vttablet copies tables in sorted order."""
    s = Shards()
    call = [
        s.rows("-80", "a", g(1), 1, more=False),
        s.rows("-80", "b", g(2), 2, more=False),
        [copied("-80")],
        s.rows("80-", "a", h(1), 3),  # a in copy on 80-...
        [s.vgtid("80-", h(2))],  # ... and done (its last key gone); b never sends a row
        *heartbeats(80),
    ]
    message, _ = _stalled(call, ["b", "a"])  # the default: just over vttablet's 1h
    assert "(shard 80-: table 'b')" in message and "copy_stall_timeout=3900s" in message, message


def test_no_copy_query_vitess_lets_run_is_cut_by_the_default_stall_timeout() -> None:
    """vttablet's default copy-phase duration is an hour: a copy query silent for 59 minutes may
    still send its first rows, and the snapshot must wait for them."""
    s = Shards()
    call = [
        s.rows("-80", "t", g(1), 1, more=False),
        [copied("-80")],
        *heartbeats(59),  # a minute each
        s.rows("80-", "t", h(1), 2, more=False),
        [copied("80-")],
    ]
    ticks = iter(range(0, 1_000_000, 60))
    rows = Rows()
    start = Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=[_entry(sh, "", []) for sh in SHARDS]))
    WindowReader(
        Vtgate([call]), rows, keyspace=KS, tables=["t"], start=start, stop=None, clock=lambda: next(ticks)
    ).run()
    assert sorted(rows.ids) == [1, 2]
