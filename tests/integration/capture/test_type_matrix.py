"""Every MySQL column type family decodes from VStream to exactly what a vtgate SELECT returns.

One table with a column per type family, rows at the types' minimums and maximums, a row of
awkward values (negative fractional TIME, 0x00 bytes, JSON ``null``...) and a row of NULLs.
The oracle is vtgate's MySQL protocol read with the plain pymysql DBAPI cursor (default
conversions, no SQLAlchemy result processing): the stream's rows must be equal to it and of
the same Python type, column by column, in the copy phase and in the streaming (binlog) phase.
A few values are also checked against literals, so both sides cannot be wrong the same way.

The same events are then staged as Parquet through ``WindowStager.add_rows`` (the columnar
path: vectorised casts, per-row decoder only where a cast is not exact), and every staged value
must equal the stream's row, so the staged values equal ``SELECT *`` too.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import (
    CopyCompletedEvent,
    Event,
    FieldEvent,
    RawRows,
    RowEvent,
    VgtidEvent,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import RetryPolicy, VStreamReader
from tests.support.type_matrix import COLUMNS, DEC_MAX, DEC_MIN, EMOJI, MAX_ROW, ROWS, TIME_MAX

pytestmark = pytest.mark.integration

TABLE = "type_matrix"
FILTER = binlogdata_pb2.Filter(rules=[binlogdata_pb2.Rule(match=TABLE, filter=f"select * from {TABLE}")])
STREAM_ID_OFFSET = 100
Rows = dict[int, tuple[Any, ...]]


def create_table(hook: VitessHook) -> None:
    columns = ",\n".join(f"  `{name}` {type_}" for name, type_ in COLUMNS.items())
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{TABLE}"))
        conn.execute(
            sqlalchemy.text(
                f"CREATE TABLE commerce.{TABLE} (\n  id INT NOT NULL PRIMARY KEY,\n{columns}\n)"
                " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            )
        )
        conn.commit()


def insert_rows(hook: VitessHook, rows: list[dict[str, Any]], id_offset: int = 0) -> None:
    names = ["id", *COLUMNS]
    sql = sqlalchemy.text(
        f"INSERT INTO commerce.{TABLE} ({', '.join(f'`{n}`' for n in names)}) "
        f"VALUES ({', '.join(f':{n}' for n in names)})"
    )
    with hook.connect_sql() as conn:
        conn.execute(sql, [{**row, "id": row["id"] + id_offset} for row in rows])
        conn.commit()


def select_rows(hook: VitessHook) -> tuple[tuple[str, ...], Rows]:
    """(column names, rows by id) as the raw pymysql cursor returns them through vtgate.

    The server and so the session run in UTC, as the stream does; were it otherwise, TIMESTAMP
    columns would differ and the literal 1970-01-01 00:00:01 check would fail.
    """
    raw = hook.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(f"SELECT * FROM commerce.{TABLE} ORDER BY id")
        names = tuple(d[0] for d in cursor.description)
        return names, {row[0]: tuple(row) for row in cursor.fetchall()}
    finally:
        raw.close()


def reader(hook: VitessHook, gtid: str) -> Generator[Event, None, None]:
    return VStreamReader(
        lambda request: hook.open_vstream_raw(request, timeout=60),  # bounds every phase
        vgtid=Vgtid.for_keyspace("commerce", gtid),
        filter=FILTER,
        flags=hook.vstream_flags(heartbeat_interval=1),
        retry=RetryPolicy(max_attempts=0),
    ).events()


TableEvents = list[FieldEvent | RowEvent]


def read_rows(
    events: Generator[Event, None, None], done: Callable[[Event, Rows], bool]
) -> tuple[tuple[str, ...], Rows, TableEvents]:
    """Every row's after image by id, until ``done(event, rows)``; then the stream is closed.

    Also returns the table's FIELD and ROW events, to stage them.
    """
    names: tuple[str, ...] = ()
    rows: Rows = {}
    kept: TableEvents = []
    for event in events:
        if isinstance(event, FieldEvent | RowEvent) and event.table == TABLE:
            kept.append(event)
        if isinstance(event, RowEvent) and event.table == TABLE:
            names = event.column_names
            for change in event.changes:
                assert change.after is not None, "only inserts were made"
                rows[cast(int, change.after[0])] = change.after
        if done(event, rows):
            break
    events.close()
    return names, rows, kept


def copy_phase(hook: VitessHook) -> tuple[tuple[str, ...], Rows, TableEvents]:
    return read_rows(
        reader(hook, ""), lambda event, _: isinstance(event, CopyCompletedEvent) and event.is_stream_complete
    )


def streaming_phase(hook: VitessHook) -> tuple[tuple[str, ...], Rows, TableEvents]:
    events = reader(hook, "current")
    # The stream is open and positioned once its first VGTID arrives: only then write.
    next(event for event in events if isinstance(event, VgtidEvent))
    insert_rows(hook, ROWS, STREAM_ID_OFFSET)
    wanted = {row["id"] + STREAM_ID_OFFSET for row in ROWS}
    return read_rows(events, lambda event, rows: isinstance(event, VgtidEvent) and wanted <= rows.keys())


def assert_same(
    phase: str,
    names: tuple[str, ...],
    streamed: Rows,
    selected: Rows,
) -> None:
    for row_id, expected in selected.items():
        got = streamed[row_id]
        assert len(got) == len(expected), f"{phase} id={row_id}: column count"
        for name, a, b in zip(names, got, expected, strict=True):
            where = f"{phase} id={row_id} column {name!r}"
            assert a == b, f"{where}: streamed {a!r} != selected {b!r}"
            assert type(a) is type(b), f"{where}: streamed {type(a)} is not selected {type(b)}"


def assert_staged(phase: str, workdir: Path, events: TableEvents, names: tuple[str, ...], rows: Rows) -> None:
    """The events staged through the columnar path hold exactly the stream's rows."""
    stager = WindowStager(str(workdir), "matrix", 1, key_columns={TABLE: ["id"]})
    seq = 1
    for event in events:
        if isinstance(event, FieldEvent):
            stager.set_schema(event.keyspace, event.table, event.fields, shard=event.shard)
            continue
        assert isinstance(event.changes, RawRows), "the reader keeps rows serialized"
        stager.add_rows(event.keyspace, event.table, event.shard, event.timestamp, seq, event.changes)
        seq += len(event.changes)
    vgtid = Vgtid.for_keyspace("commerce", "current")
    staged = read_table(stager.finish(vgtid, vgtid, vgtid), TABLE).to_pylist()
    assert len(staged) == len(rows), f"{phase} staged: row count"
    for out in staged:
        expected = rows[out["id"]]
        for name, want in zip(names, expected, strict=True):
            got = out[name]
            if isinstance(got, datetime.datetime) and got.tzinfo is not None:
                got = got.replace(tzinfo=None)  # TIMESTAMP: staged UTC, streamed naive UTC
            where = f"{phase} staged id={out['id']} column {name!r}"
            assert got == want, f"{where}: staged {got!r} != streamed {want!r}"
            assert type(got) is type(want), f"{where}: staged {type(got)} is not streamed {type(want)}"


def assert_literals(phase: str, names: tuple[str, ...], rows: Rows, base: int) -> None:
    """Known values, so a mistake made the same way on both sides still fails."""
    lo, hi, odd, null = (dict(zip(names, rows[base + i], strict=True)) for i in range(1, 5))
    where = f"{phase} literal"
    assert hi["u64"] == 18446744073709551615, where
    assert lo["i64"] == -9223372036854775808, where
    assert hi["dec"] == DEC_MAX and lo["dec"] == DEC_MIN, where
    assert odd["t"] == -datetime.timedelta(seconds=1.5), where
    assert lo["t"] == -TIME_MAX and hi["t"] == TIME_MAX, where
    assert hi["dt"] == datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), where
    assert hi["ts"].microsecond == 999999 and lo["ts"] == datetime.datetime(1970, 1, 1, 0, 0, 1), where
    assert b"\x00" in hi["bl"] and hi["bl"] == bytes(range(256)), where
    assert hi["bn"] == b"\x00\xffA\x00\x00\x00\x00\x00" and odd["bn"] == b"\x00" * 8, where
    assert hi["vb"] == b"a\x00b\x00\x00", where
    assert EMOJI in hi["ch"] and EMOJI * 3 in hi["tx"] and hi["vc"] == MAX_ROW["vc"], where
    assert odd["ch"] == "ab" and odd["tx"] == "nul\x00inside", where
    assert hi["js"] == MAX_ROW["js"] and odd["js"] == "null", where
    assert hi["cb"] == f"é{EMOJI}z" and odd["cb"] == "a" and hi["vcb"] == MAX_ROW["vcb"], where
    assert hi["st"] == "x,z" and hi["en"] == "c" and hi["y"] == 2155, where
    assert hi["b1"] == b"\x01" and lo["b1"] == b"\x00", where
    assert hi["b64"] == b"\xff" * 8 and odd["b64"] == b"\x80" + b"\x00" * 6 + b"\x01", where
    assert hi["f64"] == 1.7976931348623157e308 and odd["f64"] == 0.1, where
    assert odd["f32"] == 123457000.0 and hi["f32"] == 3.40282e38, where
    assert all(null[c] is None for c in COLUMNS), where


def test_type_matrix_copy_and_stream_match_select(vitess_conn_id: str, tmp_path: Path) -> None:
    hook = VitessHook(vitess_conn_id)
    try:
        create_table(hook)
        insert_rows(hook, ROWS)
        names, copied, copy_events = copy_phase(hook)
        select_names, selected = select_rows(hook)
        assert names == select_names == ("id", *COLUMNS)
        assert copied.keys() == selected.keys() == {row["id"] for row in ROWS}
        assert_same("copy phase", names, copied, selected)
        assert_literals("copy phase", names, copied, 0)
        assert_staged("copy phase", tmp_path / "copy", copy_events, names, copied)

        names, streamed, stream_events = streaming_phase(hook)
        _, selected = select_rows(hook)
        assert names == select_names
        stream_ids = {row["id"] + STREAM_ID_OFFSET for row in ROWS}
        assert streamed.keys() == stream_ids
        assert_same("streaming phase", names, streamed, {i: selected[i] for i in stream_ids})
        assert_literals("streaming phase", names, streamed, STREAM_ID_OFFSET)
        assert_staged("streaming phase", tmp_path / "stream", stream_events, names, streamed)
    finally:
        hook.close()
