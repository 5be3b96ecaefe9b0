"""Zero and invalid dates written through vtgate never wedge a sync.

Rows with ``0000-00-00``, ``0000-00-00 00:00:00`` (DATETIME and TIMESTAMP), partial-zero dates
(``2020-00-15``, ``2020-05-00``) and an impossible day (``2020-02-30``) are written through
vtgate's MySQL port by a session with a permissive ``sql_mode`` (vtgate passes it on: checked),
once before the snapshot (the copy phase) and once while the sync streams (the binlog phase).
Each phase runs through the real capture runner twice: under the ``error`` policy it fails
naming table, column, the row's key and the remedy; a rerun under the default policy resumes
the same unfinished window and stages those values as NULL. Every other value equals
``SELECT *`` through vtgate, in the staged Parquet and in the Delta table merged from it.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.exceptions import ZeroDateError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.staging import Manifest, read_table
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies, ZeroDatePolicy
from tests.support.delta_check import spark_session

pytestmark = pytest.mark.integration

TABLE = "zero_dates"
COLUMNS = ("d", "dt", "ts", "p")
EPOCH = datetime.datetime(1970, 1, 1)
PERMISSIVE = "ALLOW_INVALID_DATES"  # no NO_ZERO_DATE / NO_ZERO_IN_DATE / STRICT_*: anything goes
# id -> (d DATE, dt DATETIME(6), ts TIMESTAMP, p DATE)
COPY_ROWS: dict[int, tuple[str | None, ...]] = {
    1: ("0000-00-00", "0000-00-00 00:00:00", "0000-00-00 00:00:00", "2020-00-15"),
    2: ("2024-02-29", "2024-02-29 12:34:56.5", "2024-02-29 12:34:56", "2020-05-00"),
    3: ("2020-02-30", "2021-01-01 00:00:00", None, "1999-12-31"),
    4: ("2001-02-03", "2001-02-03 04:05:06.000007", "2001-02-03 04:05:06", "2001-02-03"),
}
STREAM_ROWS: dict[int, tuple[str | None, ...]] = {
    101: ("0000-00-00", "0000-00-00 00:00:00.000000", "0000-00-00 00:00:00", "2020-05-00"),
    102: ("2025-06-07", "0000-00-00 00:00:00", None, "2020-00-15"),
}


def execute(raw: Any, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    cursor = raw.cursor()
    cursor.execute(sql, args)
    rows: list[tuple[Any, ...]] = list(cursor.fetchall())
    return rows


@pytest.fixture
def permissive(vitess_conn_id: str) -> Iterator[tuple[VitessHook, Any]]:
    """The hook, and a raw pymysql connection through vtgate whose session allows zero dates."""
    hook = VitessHook(vitess_conn_id)
    raw = hook.engine.raw_connection()
    try:
        execute(raw, "SET SESSION sql_mode = %s", (PERMISSIVE,))
        # vtgate keeps the session's sql_mode and applies it on the tablet: not dropped.
        assert execute(raw, "SELECT @@session.sql_mode") == [(PERMISSIVE,)]
        yield hook, raw
    finally:
        raw.invalidate()  # the session's sql_mode must not go back to the pool
        hook.close()


def write(raw: Any, rows: dict[int, tuple[str | None, ...]]) -> None:
    cursor = raw.cursor()
    cursor.executemany(
        f"INSERT INTO commerce.{TABLE} (id, d, dt, ts, p) VALUES (%s, %s, %s, %s, %s)",
        [(i, *values) for i, values in rows.items()],
    )
    raw.commit()


def selected(raw: Any) -> dict[int, dict[str, Any]]:
    """``SELECT *`` through vtgate (pymysql returns zero and invalid dates as their text)."""
    rows = execute(raw, f"SELECT id, d, dt, ts, p FROM commerce.{TABLE} ORDER BY id")
    raw.commit()  # end the read's transaction: the next SELECT sees later writes
    return {r[0]: dict(zip(COLUMNS, r[1:], strict=True)) for r in rows}


def staged(manifest: Manifest) -> dict[int, dict[str, Any]]:
    """The staged after images by id (TIMESTAMP back to naive UTC, as the session reads it)."""
    out = {}
    for r in read_table(manifest, TABLE).to_pylist():
        if r["_op"] == "delete":
            continue
        values = {c: r[c] for c in COLUMNS}
        if values["ts"] is not None:
            values["ts"] = values["ts"].replace(tzinfo=None)
        out[r["id"]] = values
    return out


def assert_null_for_zero_dates(
    phase: str, got: dict[int, dict[str, Any]], source: dict[int, dict[str, Any]]
) -> None:
    """Every staged value equals the source's, except the zero/invalid ones, which are NULL."""
    zeros = 0
    for row_id, values in source.items():
        for column, value in values.items():
            where = f"{phase} id={row_id} column {column!r}"
            if isinstance(value, str):
                zeros += 1
                assert got[row_id][column] is None, f"{where}: {value!r} staged as {got[row_id][column]!r}"
            else:
                assert got[row_id][column] == value, f"{where}: staged {got[row_id][column]!r} != {value!r}"
    assert zeros >= 5, f"{phase}: the source holds {zeros} zero/invalid values"


def test_zero_dates_never_wedge_snapshot_or_catch_up(
    permissive: tuple[VitessHook, Any], tmp_path: Path
) -> None:
    hook, raw = permissive
    execute(raw, f"DROP TABLE IF EXISTS commerce.{TABLE}")
    execute(
        raw,
        f"CREATE TABLE commerce.{TABLE} (id INT NOT NULL PRIMARY KEY, d DATE, dt DATETIME(6), "
        "ts TIMESTAMP NULL, p DATE) ENGINE=InnoDB",
    )
    write(raw, COPY_ROWS)
    source = selected(raw)
    assert source[1]["d"] == "0000-00-00" and source[1]["p"] == "2020-00-15", "the zero dates were stored"
    assert source[3]["d"] == "2020-02-30" and source[2]["p"] == "2020-05-00"

    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = f"zd-{uuid.uuid4().hex[:8]}"
    spec = SyncSpec(sync, "commerce", (TABLE,), str(tmp_path / "stage"), heartbeat_interval=1)
    strict_spec = dataclasses.replace(spec, zero_dates=ZeroDatePolicies(ZeroDatePolicy.ERROR))
    strict = CaptureRunner(hook, store, strict_spec, holder="t")
    default = CaptureRunner(hook, store, spec, holder="t")

    # The copy phase.
    with pytest.raises(ZeroDateError) as err:
        strict.snapshot()
    msg = str(err.value)
    assert f"table '{TABLE}' column 'd'" in msg and "key {'id': 1}" in msg, msg
    assert "'0000-00-00'" in msg and "zero_date_policies={'zero_dates': 'null'}" in msg, msg
    window = store.open_window(sync)
    assert window is not None and window.state is WindowState.PLANNED
    snapshot = default.snapshot()  # the same window, resumed under the default policy
    assert snapshot.seq == window.seq
    assert_null_for_zero_dates("copy phase", staged(snapshot.manifest), source)
    store.mark_merged(sync, snapshot.seq)
    store.commit(sync, snapshot.seq)

    # The binlog phase: inserts, an update to a zero date, a delete of a row holding them.
    write(raw, STREAM_ROWS)
    execute(raw, f"UPDATE commerce.{TABLE} SET ts = '0000-00-00 00:00:00', d = '2020-02-30' WHERE id = 4")
    execute(raw, f"DELETE FROM commerce.{TABLE} WHERE id = 1")
    raw.commit()
    source = selected(raw)
    assert source[4]["ts"] == "0000-00-00 00:00:00" and 1 not in source
    with pytest.raises(ZeroDateError) as err:
        strict.catch_up()
    msg = str(err.value)
    assert f"table '{TABLE}' column 'd'" in msg and "key {'id': 101}" in msg and "rerun the task" in msg, msg
    window = store.open_window(sync)
    assert window is not None and window.state is WindowState.PLANNED and window.seq == snapshot.seq + 1
    caught = default.catch_up()
    assert caught.seq == window.seq and caught.resumed
    got = staged(caught.manifest)
    assert sorted(got) == [4, 101, 102]
    assert_null_for_zero_dates("binlog phase", got, {i: source[i] for i in got})
    deletes = [r for r in read_table(caught.manifest, TABLE).to_pylist() if r["_op"] == "delete"]
    assert [r["_before_id"] for r in deletes] == [1]
    assert datetime.date(2001, 2, 3) == got[4]["p"]

    # Merged into Delta: NULL where the source holds a zero/invalid date, the source's value
    # everywhere else (the oracle: SELECT * through vtgate).
    delta = str(tmp_path / "delta" / TABLE)
    plan = MergePlan(
        sync,
        (
            WindowToMerge(snapshot.seq, snapshot.manifest.path, (TABLE,)),
            WindowToMerge(caught.seq, caught.manifest.path),
        ),
        {TABLE: TableTarget(TABLE, delta, ("id",), ("id",))},
    )
    spark = spark_session()
    merge(spark, plan)
    df = spark.read.format("delta").load(delta)
    # TIMESTAMP as UTC microseconds: collect() would render it in the driver's time zone.
    rows = df.select("id", "d", "dt", F.unix_micros("ts").alias("ts"), "p").collect()
    in_delta = {r["id"]: {c: r[c] for c in COLUMNS} for r in rows}
    for values in in_delta.values():
        if values["ts"] is not None:
            values["ts"] = EPOCH + datetime.timedelta(microseconds=values["ts"])
    assert sorted(in_delta) == sorted(source)
    assert_null_for_zero_dates("delta", in_delta, source)
