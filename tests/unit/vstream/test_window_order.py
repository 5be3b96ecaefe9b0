"""A window stages one cross-shard order however vtgate interleaves the shards and whenever its
heartbeats come (docs/design.md, "Event order"): a re-read from the same start stages the same
rows. Real VStream protobuf messages, scripted."""

from __future__ import annotations

from airflow_provider_vitess._proto import binlogdata_pb2
from tests.support.scripted_window import E, gtid, read, txn, vgtid

START = vgtid(("-80", gtid(2, 1)), ("80-", gtid(3, 1)))
STOP = vgtid(("-80", gtid(2, 3)), ("80-", gtid(3, 4)))
# (shard, binlog second, position after, inserted id): each shard's transactions, in its order.
LOW = [("-80", 100, gtid(2, 2), 1), ("-80", 102, gtid(2, 3), 4)]
HIGH = [("80-", 100, gtid(3, 2), 2), ("80-", 101, gtid(3, 3), 3), ("80-", 103, gtid(3, 4), 5)]
ORDER = [("-80", 1), ("80-", 2), ("80-", 3), ("-80", 4), ("80-", 5)]  # second, then shard


def events(*script: tuple[str, int, str, int] | int) -> list[binlogdata_pb2.VEvent]:
    """The transactions, a shard's fields before its first row; an int is a vtgate heartbeat
    stamped with that second."""
    first: set[str] = set()
    out: list[binlogdata_pb2.VEvent] = []
    for item in script:
        if isinstance(item, int):
            out.append(binlogdata_pb2.VEvent(type=E.HEARTBEAT, timestamp=item))
            continue
        shard, ts, pos, row_id = item
        out += txn(shard, ts, pos, row_id, with_field=shard not in first)
        first.add(shard)
    return out


def test_a_heartbeat_before_a_transaction_stamped_earlier_leaves_the_order_as_a_re_read_has_it() -> None:
    """The live read: vtgate sends a heartbeat (its clock, 60 s on) while both shards are quiet,
    then transactions stamped with earlier seconds: a transaction's binlog events carry its
    statements' start, and a long one commits well after. A re-read from the same start gets
    the same transactions, without the heartbeat and in another interleaving."""
    live = events(LOW[0], HIGH[0], 160, HIGH[1], LOW[1], HIGH[2])
    _, staged, _ = read(START, STOP, live)
    _, again, _ = read(START, STOP, events(*HIGH, *LOW))
    assert staged.rows == ORDER
    assert again.rows == ORDER
