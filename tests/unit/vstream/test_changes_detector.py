"""The pure decisions of the changes sensor: which events are changes, start verdicts, lag."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.decoding.events import Event, EventDecoder
from airflow_provider_vitess.exceptions import InvalidVgtidError
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.changes import (
    COPY_UNFINISHED,
    DDL,
    FIELD,
    JOURNAL,
    LAG,
    NO_CHECKPOINT,
    ROW,
    SCAN_UNFINISHED,
    Change,
    ChangeDetector,
    lag_by_shard,
    lag_verdict,
    parse_start_vgtid,
    start_verdict,
    unscanned_verdict,
)

E = binlogdata_pb2.VEventType
KS = "customer"


def vevent(
    type_: binlogdata_pb2.VEventType, shard: str = "-80", ts: int = 1_700_000_000, **fields: Any
) -> binlogdata_pb2.VEvent:
    return binlogdata_pb2.VEvent(type=type_, keyspace=KS, shard=shard, timestamp=ts, **fields)


def field(table: str, shard: str = "-80", keyspace: str = KS) -> binlogdata_pb2.VEvent:
    return vevent(
        E.FIELD,
        shard,
        field_event=binlogdata_pb2.FieldEvent(
            table_name=f"{keyspace}.{table}",
            keyspace=keyspace,
            shard=shard,
            fields=[query_pb2.Field(name="id", type=query_pb2.Type.INT64)],
        ),
    )


def row(table: str, shard: str = "-80", n: int = 1, keyspace: str = KS, ts: int = 1_700_000_000) -> Any:
    change = binlogdata_pb2.RowChange(after=query_pb2.Row(lengths=[1], values=b"7"))
    return vevent(
        E.ROW,
        shard,
        ts,
        row_event=binlogdata_pb2.RowEvent(
            table_name=f"{keyspace}.{table}", keyspace=keyspace, shard=shard, row_changes=[change] * n
        ),
    )


def vgtid_event(*gtids: tuple[str, str]) -> binlogdata_pb2.VEvent:
    vg = binlogdata_pb2.VGtid(
        shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KS, shard=s, gtid=g) for s, g in gtids]
    )
    return vevent(E.VGTID, vgtid=vg)


def decode(*raw: binlogdata_pb2.VEvent) -> list[Event]:
    decoder = EventDecoder()
    return [decoder.decode(ev) for ev in raw]


def transaction(*middle: binlogdata_pb2.VEvent, gtid: str = "MariaDB/0-1-10") -> list[binlogdata_pb2.VEvent]:
    return [vevent(E.BEGIN), *middle, vgtid_event(("-80", gtid), ("80-", "MariaDB/0-1-9")), vevent(E.COMMIT)]


def vgtid(*entries: tuple[str, str], keyspace: str = KS) -> Vgtid:
    return Vgtid.from_json(
        "["
        + ",".join(
            f'{{"keyspace":"{keyspace}","shard":"{s}","gtid":"{g}","table_p_ks":[]}}' for s, g in entries
        )
        + "]"
    )


# ----- the detector ---------------------------------------------------------------------------


def test_a_row_of_a_watched_table_is_the_change_and_wins_over_its_field_event() -> None:
    detector = ChangeDetector(KS, ["orders", "customers"])
    change = detector.scan(
        decode(*transaction(field("orders", "80-"), row("orders", "80-", n=3, ts=1_700_000_123)))
    )
    assert change == Change(ROW, keyspace=KS, shard="80-", table="orders", commit_ts=1_700_000_123, rows=3)
    assert change.summary() == {
        "reason": "row",
        "keyspace": KS,
        "shard": "80-",
        "table": "orders",
        "rows": 3,
        "commit_ts": 1_700_000_123,
        "commit_time": "2023-11-14T22:15:23+00:00",
    }


def test_empty_transactions_heartbeats_and_other_tables_are_not_changes() -> None:
    detector = ChangeDetector(KS, ["orders"])
    quiet = [
        *transaction(),  # another table's transaction, filtered out by vtgate: only its position
        vevent(E.HEARTBEAT, ""),
        vevent(E.OTHER),
        *transaction(field("orders_old"), row("orders_old")),  # a name that only starts alike
        *transaction(field("orders", keyspace="commerce"), row("orders", keyspace="commerce")),
    ]
    assert detector.scan(decode(*quiet)) is None
    assert detector.position is not None and detector.position.shard_gtids[0].gtid == "MariaDB/0-1-10"
    resumed = detector.resume_from(vgtid(("-80", "MariaDB/0-1-1"))).shard(KS, "-80")
    assert resumed is not None and resumed.gtid == "MariaDB/0-1-10"


def test_resume_from_is_the_start_until_a_vgtid_was_seen() -> None:
    start = vgtid(("-80", "MariaDB/0-1-1"))
    assert ChangeDetector(KS, ["t"]).resume_from(start) is start


def test_a_field_event_alone_is_a_schema_change() -> None:
    detector = ChangeDetector(KS, ["orders"])
    events = decode(vevent(E.BEGIN), field("orders"), vgtid_event(("-80", "MariaDB/0-1-3")), vevent(E.COMMIT))
    change = detector.scan(events)
    assert change is not None and (change.reason, change.table, change.shard) == (FIELD, "orders", "-80")
    # Pushed one by one, a pending FIELD is settled by the next event, or flushed.
    detector = ChangeDetector(KS, ["orders"])
    assert detector.push(events[1]) is None
    assert detector.flush() == change
    assert detector.flush() is None


def test_a_field_event_at_the_end_of_a_response_is_kept_for_the_next_event_when_pushed() -> None:
    detector = ChangeDetector(KS, ["orders", "items"])
    first, second = decode(field("orders"), field("items"))
    assert detector.push(first) is None
    assert detector.push(second) is None  # another watched table's columns: rows may still follow
    rows = decode(field("orders"), row("orders"))[1]
    change = detector.push(rows)
    assert change is not None and change.reason == ROW


def test_ddl_naming_a_watched_table_is_a_change_and_others_are_not() -> None:
    detector = ChangeDetector(KS, ["orders"])
    (ddl,) = decode(vevent(E.DDL, statement="ALTER TABLE `orders` ADD COLUMN note  TEXT"))
    change = detector.scan([ddl])
    assert change is not None and (change.reason, change.table) == (DDL, "orders")
    assert change.statement == "ALTER TABLE `orders` ADD COLUMN note TEXT"
    assert detector.scan(decode(vevent(E.DDL, statement="ALTER TABLE orders_archive ADD x INT"))) is None
    assert (
        detector.scan(decode(vevent(E.DDL, statement="CREATE TABLE vt_customer.Orders (id INT)"))) is not None
    )
    long_ddl = "ALTER TABLE orders COMMENT '" + "x" * 500 + "'"
    change = detector.scan(decode(vevent(E.DDL, statement=long_ddl)))
    assert change is not None and len(change.statement) == 200 and change.statement.endswith("...")


def test_a_journal_of_the_keyspace_is_a_change() -> None:
    detector = ChangeDetector(KS, ["orders"])
    change = detector.scan(decode(vevent(E.JOURNAL, journal=binlogdata_pb2.Journal(id=1))))
    assert change is not None and change.reason == JOURNAL


def test_internal_tables_are_ignored() -> None:
    detector = ChangeDetector(KS, ["orders"])
    raw = field("orders")
    raw.field_event.is_internal_table = True
    assert detector.scan(decode(raw)) is None


def test_the_detector_needs_tables() -> None:
    with pytest.raises(ValueError, match="at least one table"):
        ChangeDetector(KS, [])


def test_summary_round_trips() -> None:
    for change in (
        Change(ROW, KS, "-80", "t", 1_700_000_000, 2),
        Change(DDL, KS, "80-", "t", 5, statement="ALTER TABLE t"),
        Change(LAG, KS, lag={"customer/-80": 12}),
        Change(NO_CHECKPOINT),
    ):
        assert Change.from_summary(change.summary()) == change


# ----- the start and the lag ------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "  ", "None", "null", "NULL"])
def test_no_start_text_means_no_checkpoint(text: str | None) -> None:
    assert parse_start_vgtid(text) is None
    assert start_verdict(parse_start_vgtid(text), KS) == Change(NO_CHECKPOINT, keyspace=KS)


def test_a_resolved_start_is_watched_and_a_copying_one_runs_at_once() -> None:
    resolved = vgtid(("-80", "MariaDB/0-1-5"), ("80-", "MariaDB/0-1-6"))
    assert parse_start_vgtid(resolved.to_json()) == resolved
    assert start_verdict(resolved, KS) is None
    assert start_verdict(vgtid(("-80", ""), ("80-", "MariaDB/0-1-6")), KS) == Change(
        COPY_UNFINISHED, keyspace=KS
    )


def test_a_start_of_another_keyspace_or_current_is_refused() -> None:
    with pytest.raises(InvalidVgtidError, match="not 'customer'"):
        start_verdict(vgtid(("0", "MariaDB/0-1-5"), keyspace="commerce"), KS)
    with pytest.raises(InvalidVgtidError, match="'current'"):
        start_verdict(vgtid(("-80", "current")), KS)
    with pytest.raises(InvalidVgtidError):
        parse_start_vgtid("{not json")


def test_lag_counts_transactions_per_shard_including_new_shards() -> None:
    committed = vgtid(("-80", "MariaDB/0-1-100"), ("80-", "MariaDB/0-1-100"))
    now = vgtid(("-80", "MariaDB/0-1-100"), ("80-", "MariaDB/0-1-130"), ("c0-", "MariaDB/0-1-7"))
    assert lag_by_shard(committed, now) == {"customer/-80": 0, "customer/80-": 30, "customer/c0-": 7}
    assert lag_verdict(committed, now, None) is None
    assert lag_verdict(committed, now, 30) is None
    change = lag_verdict(committed, now, 29)
    assert change is not None and change.reason == LAG and change.lag == lag_by_shard(committed, now)
    assert change.summary()["lag"]["customer/80-"] == 30


def test_no_change_only_for_a_read_up_to_the_position_the_wait_started_at() -> None:
    watch_stop = vgtid(("-80", "MariaDB/0-1-100"), ("80-", "MariaDB/0-1-100"))
    assert unscanned_verdict(KS, watch_stop, watch_stop) is None
    assert (
        unscanned_verdict(KS, vgtid(("-80", "MariaDB/0-1-120"), ("80-", "MariaDB/0-1-101")), watch_stop)
        is None
    )
    # The timeout cut the read: the run goes on, told what was left unread.
    behind = vgtid(("-80", "MariaDB/0-1-100"), ("80-", "MariaDB/0-1-60"))
    change = unscanned_verdict(KS, behind, watch_stop)
    assert change is not None and change.reason == SCAN_UNFINISHED
    assert change.summary() == {
        "reason": "scan_unfinished",
        "keyspace": KS,
        "lag": {"customer/-80": 0, "customer/80-": 40},
    }
    # The start position was never known (vtgate slow to answer): never "no change".
    unknown = unscanned_verdict(KS, behind, None)
    assert unknown is not None and unknown.reason == SCAN_UNFINISHED and unknown.lag is None
    assert unscanned_verdict(KS, None, watch_stop) is not None


def test_lag_with_mysql56_gtid_sets() -> None:
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    committed = vgtid(("-80", f"MySQL56/{uuid}:1-100"))
    now = vgtid(("-80", f"MySQL56/{uuid}:1-105"))
    assert lag_by_shard(committed, now) == {"customer/-80": 5}
