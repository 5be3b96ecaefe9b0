"""A window's VStream scripted with real protobuf messages of keyspace ``customer`` (one table,
``customer``, one INT64 column): one transaction per inserted id, a VStream call that answers
with the script, and a stager that records what the window staged, in order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import ReadResult, WindowReader

E = binlogdata_pb2.VEventType
KS = "customer"
TABLE = f"{KS}.customer"


def gtid(server: int, seq: int) -> str:
    return f"MariaDB/0-{server}-{seq}"


def sgtid(shard: str, pos: str) -> binlogdata_pb2.ShardGtid:
    return binlogdata_pb2.ShardGtid(keyspace=KS, shard=shard, gtid=pos)


def vgtid(*entries: tuple[str, str]) -> Vgtid:
    return Vgtid.from_proto(binlogdata_pb2.VGtid(shard_gtids=[sgtid(s, p) for s, p in entries]))


def ev(shard: str, type_: int, ts: int, **kw: Any) -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=type_, keyspace=KS, shard=shard, timestamp=ts, **kw)  # type: ignore[arg-type]


def field(shard: str, ts: int) -> binlogdata_pb2.VEvent:
    fields = [query_pb2.Field(name="customer_id", type=query_pb2.Type.INT64, charset=63)]
    fe = binlogdata_pb2.FieldEvent(table_name=TABLE, fields=fields, keyspace=KS, shard=shard)
    return ev(shard, E.FIELD, ts, field_event=fe)


def txn(
    shard: str, ts: int, pos: str, row_id: int, *, with_field: bool = False
) -> list[binlogdata_pb2.VEvent]:
    """One transaction inserting ``row_id``; the VGTID names the shard's position after it."""
    value = str(row_id).encode()
    row = binlogdata_pb2.RowChange(after=query_pb2.Row(lengths=[len(value)], values=value))
    re_ = binlogdata_pb2.RowEvent(table_name=TABLE, row_changes=[row], keyspace=KS, shard=shard)
    return [
        ev(shard, E.BEGIN, ts),
        *([field(shard, ts)] if with_field else []),
        ev(shard, E.ROW, ts, row_event=re_),
        ev(shard, E.VGTID, ts, vgtid=binlogdata_pb2.VGtid(shard_gtids=[sgtid(shard, pos)])),
        ev(shard, E.COMMIT, ts),
    ]


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[str, int]] = []  # (shard, customer_id) in staged order

    def set_schema(self, keyspace: str, table: str, fields: Sequence[Any], shard: str = "") -> None:
        pass

    def add_rows(
        self, keyspace: str, table: str, shard: str, commit_ts: int, first_seq: int, changes: Sequence[Any]
    ) -> None:
        for change in changes:
            self.rows.append((shard, int(change.after[0])))

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None:
        pass


class Server:
    """One VStream call answering with the scripted events, one response per event."""

    def __init__(self, events: Sequence[binlogdata_pb2.VEvent]) -> None:
        self.events = list(events)
        self.requests: list[vtgate_pb2.VStreamRequest] = []

    def __call__(self, request: vtgate_pb2.VStreamRequest) -> Iterator[vtgate_pb2.VStreamResponse]:
        self.requests.append(request)
        return iter([vtgate_pb2.VStreamResponse(events=[e]) for e in self.events])


def read(
    start: Vgtid, stop: Vgtid, events: Sequence[binlogdata_pb2.VEvent]
) -> tuple[ReadResult, Recorder, Server]:
    stager, server = Recorder(), Server(events)
    reader = WindowReader(server, stager, keyspace=KS, tables=["customer"], start=start, stop=stop)
    return reader.run(), stager, server


def positions(v: Vgtid) -> dict[str, str]:
    return {sg.shard: sg.gtid for sg in v.shard_gtids}
