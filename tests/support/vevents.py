"""VStream responses built by hand (VEvents of one keyspace), for the reader's and the decoder's
unit tests."""

from __future__ import annotations

from typing import Any

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2

E = binlogdata_pb2.VEventType
T = query_pb2.Type
KS = "customer"


def vgtid(gtid: str, shard: str = "0") -> binlogdata_pb2.VGtid:
    return binlogdata_pb2.VGtid(shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=shard, gtid=gtid)])


def ev_vgtid(gtid: str, shard: str = "0") -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=E.VGTID, vgtid=vgtid(gtid, shard), keyspace=KS, shard=shard)


def ev_field(table: str = "customer.customer", shard: str = "0") -> binlogdata_pb2.VEvent:
    fields = [
        query_pb2.Field(name="id", type=T.INT64, charset=63),
        query_pb2.Field(name="email", type=T.VARCHAR, charset=45),
        query_pb2.Field(name="doc", type=T.JSON, charset=63),
    ]
    fe = binlogdata_pb2.FieldEvent(table_name=table, fields=fields, keyspace=KS, shard=shard)
    return binlogdata_pb2.VEvent(type=E.FIELD, field_event=fe, keyspace=KS, shard=shard, timestamp=1700000000)


def qrow(*values: bytes | None) -> query_pb2.Row:
    return query_pb2.Row(
        lengths=[-1 if v is None else len(v) for v in values], values=b"".join(v for v in values if v)
    )


def ev_row(
    *changes: tuple[query_pb2.Row | None, query_pb2.Row | None],
    table: str = "customer.customer",
    shard: str = "0",
) -> binlogdata_pb2.VEvent:
    rcs = []
    for before, after in changes:
        rc = binlogdata_pb2.RowChange()
        if before is not None:
            rc.before.CopyFrom(before)
        if after is not None:
            rc.after.CopyFrom(after)
        rcs.append(rc)
    re_ = binlogdata_pb2.RowEvent(table_name=table, row_changes=rcs, keyspace=KS, shard=shard)
    return binlogdata_pb2.VEvent(
        type=E.ROW,
        row_event=re_,
        keyspace=KS,
        shard=shard,
        timestamp=1700000001,
        current_time=1700000002 * 10**9,
    )


def ev(type_: int, **kw: Any) -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=type_, **kw)  # type: ignore[arg-type]


def resp(*events: binlogdata_pb2.VEvent) -> vtgate_pb2.VStreamResponse:
    return vtgate_pb2.VStreamResponse(events=events)
