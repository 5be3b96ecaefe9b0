"""Zero and invalid MySQL dates under each zero-date policy, through both staging paths.

The columnar path (serialized ROW events: ``add_rows``, ``decoding/rowwire.py`` and
``staging/columnar.py``) and the decoded-rows path (``add_change``, ``decoding/values.py``) must
stage the same values: NULL by default, 1970-01-01 under ``epoch``, and under ``error`` a
message naming the table, column, the row's key, the value and the remedy. Inserts stand for
the copy phase, updates and deletes (before images) for the binlog phase.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from airflow_provider_vitess.decoding.events import EventDecoder, FieldEvent, RawRows, RowEvent
from airflow_provider_vitess.decoding.rowwire import locate_rows
from airflow_provider_vitess.exceptions import VitessProviderError, ZeroDateError
from airflow_provider_vitess.operators._sync import sync_spec
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.staging.columnar import ColumnPlan
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies, ZeroDatePolicy
from airflow_provider_vitess.vgtid import Vgtid

T = query_pb2.Type
E = binlogdata_pb2.VEventType
KS = "customer"
TABLE = "events"
POS = Vgtid.for_keyspace(KS, "current")
UTC = datetime.timezone.utc
NULL, EPOCH, ERROR = ZeroDatePolicy.NULL, ZeroDatePolicy.EPOCH, ZeroDatePolicy.ERROR

FIELDS = [
    query_pb2.Field(name="id", type=T.INT64, flags=1 | 2, column_type="bigint"),
    query_pb2.Field(name="d", type=T.DATE, column_type="date"),
    query_pb2.Field(name="dt", type=T.DATETIME, column_type="datetime(6)", decimals=6),
    query_pb2.Field(name="ts", type=T.TIMESTAMP, column_type="timestamp"),
    query_pb2.Field(name="p", type=T.DATE, column_type="date"),  # partial-zero dates
]
ZERO_DATE, ZERO_DATETIME6, ZERO_TIMESTAMP = (
    b"0000-00-00",
    b"0000-00-00 00:00:00.000000",
    b"0000-00-00 00:00:00",
)
# id, d, dt, ts, p: row 1 all zero, row 2 a zero-day date among valid values, row 3 NULLs.
ROWS: dict[int, tuple[bytes | None, ...]] = {
    1: (b"1", ZERO_DATE, ZERO_DATETIME6, ZERO_TIMESTAMP, b"2020-00-15"),
    2: (b"2", b"2024-02-29", b"2024-02-29 12:34:56.500000", b"2038-01-19 03:14:07", b"2020-05-00"),
    3: (b"3", None, None, None, None),
}
VALID = {
    "d": datetime.date(2024, 2, 29),
    "dt": datetime.datetime(2024, 2, 29, 12, 34, 56, 500000),
    "ts": datetime.datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC),
}
EPOCH_VALUES = {
    "d": datetime.date(1970, 1, 1),
    "dt": datetime.datetime(1970, 1, 1),
    "ts": datetime.datetime(1970, 1, 1, tzinfo=UTC),
    "p": datetime.date(1970, 1, 1),
}


def pb_row(values: Sequence[bytes | None]) -> query_pb2.Row:
    return query_pb2.Row(
        lengths=[-1 if v is None else len(v) for v in values], values=b"".join(v for v in values if v)
    )


def vevent(shard: str, changes: Sequence[tuple[int | None, int | None]] = ()) -> binlogdata_pb2.VEvent:
    """A FIELD event (no changes) or a ROW event of (before id, after id) pairs."""
    if not changes:
        fe = binlogdata_pb2.FieldEvent(table_name=f"{KS}.{TABLE}", fields=FIELDS, keyspace=KS, shard=shard)
        return binlogdata_pb2.VEvent(type=E.FIELD, field_event=fe, keyspace=KS, shard=shard)
    re_ = binlogdata_pb2.RowEvent(table_name=f"{KS}.{TABLE}", keyspace=KS, shard=shard)
    for before, after in changes:
        rc = re_.row_changes.add()
        if before is not None:
            rc.before.CopyFrom(pb_row(ROWS[before]))
        if after is not None:
            rc.after.CopyFrom(pb_row(ROWS[after]))
    return binlogdata_pb2.VEvent(type=E.ROW, row_event=re_, keyspace=KS, shard=shard, timestamp=1700000000)


COPY = [vevent("-80"), vevent("-80", [(None, 1), (None, 2), (None, 3)])]  # the copy phase: inserts
# The binlog phase: an update whose before image holds zero dates, a delete of such a row.
BINLOG = [vevent("80-"), vevent("80-", [(1, 2), (2, 1)]), vevent("80-", [(1, None)])]


def stage(
    tmp_path: Path,
    events: list[binlogdata_pb2.VEvent],
    *,
    columnar: bool,
    zero_dates: ZeroDatePolicies | None,
) -> list[dict[str, Any]]:
    """The events staged through add_rows (columnar) or add_change (decoded rows)."""
    window = 1 + len(list(tmp_path.iterdir()))
    s = WindowStager(str(tmp_path), "sync", window, key_columns={TABLE: ["id", "p"]}, zero_dates=zero_dates)
    decoder = EventDecoder()
    seq = 1
    for vev in events:
        event = decoder.decode(vev)
        if isinstance(event, FieldEvent):
            s.set_schema(KS, TABLE, FIELDS, shard=vev.shard)
            continue
        assert isinstance(event, RowEvent) and isinstance(event.changes, RawRows)
        if columnar:
            # The columnar path really is taken: the layout of the event is proven.
            assert locate_rows([event.changes.data], [event.changes.n_rows], len(FIELDS)) is not None
            s.add_rows(KS, TABLE, vev.shard, event.timestamp, seq, event.changes)
            seq += len(event.changes)
            continue
        for change in event.changes:
            s.add_change(
                KS, TABLE, vev.shard, change.operation, event.timestamp, seq, change.before, change.after
            )
            seq += 1
    out: list[dict[str, Any]] = read_table(s.finish(POS, POS, POS), TABLE).to_pylist()
    return out


def expected(policy: ZeroDatePolicy, row_id: int | None, prefix: str = "") -> dict[str, Any]:
    """The staged image of a row of ROWS (``prefix`` "_before_": its staged key columns)."""
    if row_id is None or row_id == 3:
        values: dict[str, Any] = dict.fromkeys(("d", "dt", "ts", "p"))
    else:
        zero = EPOCH_VALUES if policy is EPOCH else dict.fromkeys(EPOCH_VALUES)
        values = dict(zero) if row_id == 1 else {**VALID, "p": zero["p"]}
    values["id"] = row_id
    if prefix:
        return {prefix + k: values[k] for k in ("id", "p")}
    return values


def image(out: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    names = ("id", "p") if prefix else ("id", "d", "dt", "ts", "p")
    return {prefix + n: out[prefix + n] for n in names}


PATHS = pytest.mark.parametrize("columnar", [True, False], ids=["columnar", "decoded-rows"])


@PATHS
def test_zero_dates_stage_as_null_by_default(tmp_path: Path, columnar: bool) -> None:
    """No policy given: the default. On the code before the zero-date policy this staging failed
    (StagingError "a zero or invalid MySQL date has no Parquet value")."""
    out = stage(tmp_path, COPY + BINLOG, columnar=columnar, zero_dates=None)
    assert [r["_op"] for r in out] == ["insert"] * 3 + ["update"] * 2 + ["delete"]
    assert [image(r) for r in out[:3]] == [expected(NULL, i) for i in (1, 2, 3)]
    assert image(out[3]) == expected(NULL, 2) and image(out[3], "_before_") == expected(NULL, 1, "_before_")
    assert image(out[4]) == expected(NULL, 1) and image(out[4], "_before_") == expected(NULL, 2, "_before_")
    assert image(out[5]) == expected(NULL, None) and image(out[5], "_before_") == expected(
        NULL, 1, "_before_"
    )


@PATHS
@pytest.mark.parametrize("policy", [NULL, EPOCH])
def test_zero_dates_under_null_and_epoch_in_both_phases(
    tmp_path: Path, columnar: bool, policy: ZeroDatePolicy
) -> None:
    out = stage(tmp_path, COPY + BINLOG, columnar=columnar, zero_dates=ZeroDatePolicies(policy))
    afters = [1, 2, 3, 2, 1, None]
    befores = [None, None, None, 1, 2, 1]
    assert [image(r) for r in out] == [expected(policy, i) for i in afters]
    assert [image(r, "_before_") for r in out] == [expected(policy, i, "_before_") for i in befores]
    if policy is EPOCH:
        assert out[0]["d"] == datetime.date(1970, 1, 1) and out[0]["p"] == datetime.date(1970, 1, 1)
        assert out[0]["dt"] == datetime.datetime(1970, 1, 1)
        assert out[0]["ts"] == datetime.datetime(1970, 1, 1, tzinfo=UTC)
        assert out[1]["p"] == datetime.date(1970, 1, 1) and out[1]["d"] == datetime.date(2024, 2, 29)


@PATHS
@pytest.mark.parametrize(("events", "phase"), [(COPY, "copy"), (BINLOG, "binlog")])
def test_error_policy_names_table_column_key_value_and_remedy(
    tmp_path: Path, columnar: bool, events: list[binlogdata_pb2.VEvent], phase: str
) -> None:
    with pytest.raises(ZeroDateError) as err:
        stage(tmp_path, events, columnar=columnar, zero_dates=ZeroDatePolicies(ERROR))
    msg = str(err.value)
    shard, seq = ("-80", 1) if phase == "copy" else ("80-", 2)
    # The first zero value, column by column: column d of the row whose after image is row 1
    # (the first insert; in the binlog, the second update, after one with another key).
    assert "table 'events' column 'd'" in msg, msg
    assert f"shard '{shard}', seq {seq}, key {{'id': 1, 'p': '2020-00-15'}}" in msg, msg
    assert "DATE value '0000-00-00'" in msg, msg
    assert "zero-date policy of table 'events' is 'error'" in msg, msg
    assert "zero_date_policies={'events': 'null'}" in msg and "rerun the task" in msg, msg
    assert err.value.__cause__ is None and err.value.__context__ is None  # no Arrow traceback behind it


@PATHS
def test_per_table_policy_overrides_the_sync_default(tmp_path: Path, columnar: bool) -> None:
    relaxed = ZeroDatePolicies(ERROR, {TABLE: EPOCH})
    out = stage(tmp_path, COPY, columnar=columnar, zero_dates=relaxed)
    assert image(out[0]) == expected(EPOCH, 1)
    strict = ZeroDatePolicies(NULL, {TABLE: ERROR, "other": NULL})
    with pytest.raises(ZeroDateError, match="column 'd'"):
        stage(tmp_path, COPY, columnar=columnar, zero_dates=strict)


# Every shape of a zero or invalid value, one column at a time (vectorised casts, then the
# per-row fallback): the day past the month's end (ALLOW_INVALID_DATES), hour 24, second 60.
INVALID: list[tuple[query_pb2.Field, bytes]] = [
    (FIELDS[1], b"0000-00-00"),
    (FIELDS[1], b"0000-01-01"),
    (FIELDS[1], b"2020-00-15"),
    (FIELDS[1], b"2020-05-00"),
    (FIELDS[1], b"2023-02-29"),
    (FIELDS[1], b"2024-04-31"),
    (FIELDS[2], b"0000-00-00 00:00:00.000000"),
    (FIELDS[2], b"0000-00-00 00:00:00"),
    (FIELDS[2], b"2020-00-15 10:00:00"),
    (FIELDS[2], b"2024-01-01 24:00:00"),
    (FIELDS[2], b"2024-01-01 23:59:60"),
    (FIELDS[2], b"2024-13-01 00:00:00"),
    (FIELDS[2], b"2024-02-30 00:00:00.000000"),
    (FIELDS[3], b"0000-00-00 00:00:00"),
    (FIELDS[3], b"0000-00-00 00:00:00.000"),
]


@pytest.mark.parametrize(("field", "text"), INVALID, ids=[f"{f.name}-{t.decode()}" for f, t in INVALID])
def test_every_invalid_shape_follows_the_policy(field: query_pb2.Field, text: bytes) -> None:
    values = [b"2001-02-03" if field.type == T.DATE else b"2001-02-03 04:05:06", text, None]
    column = pa.array(values, pa.binary())
    lengths = np.array([-1 if v is None else len(v) for v in values])

    def convert(policy: ZeroDatePolicy) -> list[Any]:
        out: list[Any] = (
            ColumnPlan(field, TABLE, policy).convert(column, lengths, lambda i: f"row {i}").to_pylist()
        )
        return out

    first = convert(NULL)[0]
    assert first is not None and first.year == 2001
    assert convert(NULL)[1:] == [None, None]
    epoch = EPOCH_VALUES["p" if field.type == T.DATE else field.name]
    assert convert(EPOCH) == [first, epoch, None]
    with pytest.raises(
        ZeroDateError, match=rf"row 1: the zero or invalid {T.Name(field.type)} value '{text.decode()}'"
    ):
        convert(ERROR)


def test_a_value_of_another_type_is_not_taken_for_a_zero_date() -> None:
    """The policy only replaces the decoder's zero-date text; Arrow's other refusals stay errors."""
    plan = ColumnPlan(FIELDS[1], TABLE, NULL)
    with pytest.raises(
        VitessProviderError, match=r"row 1: cannot stage value b'x' \(bytes\) as Parquet date32"
    ):
        plan.to_array([None, b"x"], lambda i: f"row {i}")


def test_policies_from_operator_arguments() -> None:
    spec = sync_spec(
        sync_id="s",
        keyspace=KS,
        tables=["events", "orders"],
        staging_location="/tmp/x",
        zero_date_policy="Error",
        zero_date_policies={"orders": "epoch"},
    )
    assert spec.zero_dates == ZeroDatePolicies(ERROR, {"orders": EPOCH})
    assert spec.zero_dates.for_table("events") is ERROR and spec.zero_dates.for_table("orders") is EPOCH
    assert sync_spec(sync_id="s", keyspace=KS, tables=["t"], staging_location="/x").zero_dates.default is NULL
    with pytest.raises(
        VitessProviderError, match=r"zero_date_policy 'zero' is not one of 'null', 'epoch', 'error'"
    ):
        ZeroDatePolicies.parse("zero")
    with pytest.raises(VitessProviderError, match=r"zero_date_policies\['t'\] 'x' is not one of"):
        ZeroDatePolicies.parse(None, {"t": "x"})
    with pytest.raises(VitessProviderError, match=r"names \['ordrs'\], not among the sync's tables"):
        sync_spec(
            sync_id="s",
            keyspace=KS,
            tables=["orders"],
            staging_location="/x",
            zero_date_policies={"ordrs": "null"},
        )


def test_the_dag_factory_carries_the_policy_to_the_capture_runners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))  # the default checkpoint store's file
    dag = vitess_sync_dag(
        "zd",
        keyspace=KS,
        tables=[TABLE, "orders"],
        staging_location=str(tmp_path / "stage"),
        target_location=str(tmp_path / "delta"),
        zero_date_policy="epoch",
        zero_date_policies={TABLE: "error"},
    )
    for task_id in ("snapshot", "catch_up"):
        task = dag.get_task(task_id)
        assert isinstance(task, VitessSnapshotOperator | VitessCatchUpOperator)
        spec = task._runner({}).spec
        assert spec.zero_dates == ZeroDatePolicies(EPOCH, {TABLE: ERROR}), task_id
    default = vitess_sync_dag("zd2", keyspace=KS, tables=[TABLE], staging_location="/s", target_location="/t")
    snapshot = default.get_task("snapshot")
    assert isinstance(snapshot, VitessSnapshotOperator)
    assert snapshot._runner({}).spec.zero_dates == ZeroDatePolicies(NULL, {})
    with pytest.raises(VitessProviderError, match=r"zero_date_policy 'zero' is not one of"):
        vitess_sync_dag(
            "zd3",
            keyspace=KS,
            tables=[TABLE],
            staging_location="/s",
            target_location="/t",
            zero_date_policy="zero",
        )
