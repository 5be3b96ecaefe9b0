"""Catch-up windows and snapshots read from the real vtgate replay to exactly the source."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import ReadBounds, ReadResult, WindowReader, capture_stop_position
from tests.support.replay import ListStager, Replay, replay

pytestmark = pytest.mark.integration

INSERT_ORDER = sqlalchemy.text(
    "INSERT INTO customer.corder (order_id, customer_id, sku, price) VALUES (:o, :c, :s, :p)"
)


def _rows(hook: VitessHook, sql: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET workload = 'olap'")  # OLTP results stop at 10,000 rows
        cur.execute(sql)
        return {(r[0],): tuple(r) for r in cur.fetchall()}
    finally:
        raw.close()


def _open(hook: VitessHook):  # type: ignore[no-untyped-def]
    return lambda request: hook.open_vstream_raw(request, timeout=120)


def _workload(hook: VitessHook, seed: int, ids: list[int], rounds: int) -> None:
    """Random inserts, updates, deletes and sharding-key moves on customer.corder."""
    rng = random.Random(seed)
    live: set[int] = set()
    for _ in range(rounds):
        time.sleep(0.01)  # spread the workload over several windows
        with hook.connect_sql() as conn, conn.begin():
            for _ in range(rng.randint(1, 5)):
                oid = rng.choice(ids)
                if oid not in live:
                    conn.execute(
                        INSERT_ORDER,
                        {"o": oid, "c": rng.randint(1, 50), "s": b"s%d" % oid, "p": rng.randint(0, 999)},
                    )
                    live.add(oid)
                elif rng.random() < 0.3:
                    conn.execute(
                        sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid}
                    )
                    live.discard(oid)
                elif rng.random() < 0.5:
                    # A new sharding key moves the row, usually to the other shard. vtgate refuses
                    # to UPDATE a primary vindex column, so a move is DELETE + INSERT in one
                    # (multi-shard) transaction: the two events carry the same commit second.
                    conn.execute(
                        sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid}
                    )
                    conn.execute(
                        INSERT_ORDER,
                        {"o": oid, "c": rng.randint(51, 500), "s": b"moved", "p": rng.randint(0, 999)},
                    )
                else:
                    conn.execute(
                        sqlalchemy.text("UPDATE customer.corder SET price = price + 1 WHERE order_id = :o"),
                        {"o": oid},
                    )


def _read_window(hook: VitessHook, start: Vgtid) -> tuple[ListStager, ReadResult]:
    """Reads customer.corder from ``start`` to the keyspace's position now."""
    stop = capture_stop_position(_open(hook), "customer")
    stager = ListStager()
    result = WindowReader(
        _open(hook),
        stager,
        keyspace="customer",
        tables=["corder"],
        start=start,
        stop=stop,
        flags=hook.vstream_flags(heartbeat_interval=1),
    ).run()
    assert result.end_vgtid.has_reached(stop)
    return stager, result


def test_catch_up_windows_replay_to_the_source_with_moves_between_shards(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    ids = list(range(30001, 30061))
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id BETWEEN 30001 AND 30060"))
    start = capture_stop_position(_open(hook), "customer")
    before = {k: v for k, v in _rows(hook, "SELECT * FROM customer.corder").items() if k[0] in ids}
    assert before == {}

    failures: list[BaseException] = []

    def write() -> None:
        try:
            _workload(hook, 11, ids, 300)
        except BaseException as exc:  # surfaced below: a broken workload must fail the test
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    state = Replay(key_index=[0])
    position = start
    windows = 0
    writing = True
    while writing:
        writing = writer.is_alive()  # one more window after the writer ends catches its tail
        time.sleep(0.3)
        stager, result = _read_window(hook, position)
        seqs = [c.seq for c in stager.changes]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        state.apply(c for c in stager.changes if c.table == "corder")
        position = result.end_vgtid
        windows += 1
    writer.join()
    assert not failures, failures

    source = {k: v for k, v in _rows(hook, "SELECT * FROM customer.corder").items() if k[0] in ids}
    mine = {k: v for k, v in state.rows().items() if k[0] in ids}
    assert mine == source
    assert len(mine) > 10 and windows >= 2


def test_max_events_stops_at_a_unit_boundary_and_the_rest_follows(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    ids = list(range(31001, 31101))
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id BETWEEN 31001 AND 31100"))
    start = capture_stop_position(_open(hook), "customer")
    for batch in range(10):
        with hook.connect_sql() as conn, conn.begin():
            for oid in ids[batch * 10 : batch * 10 + 10]:
                conn.execute(
                    INSERT_ORDER,
                    {"o": oid, "c": 1, "s": b"x", "p": 1},
                )
    stop = capture_stop_position(_open(hook), "customer")
    first, second = ListStager(), ListStager()
    r1 = WindowReader(
        _open(hook),
        first,
        keyspace="customer",
        tables=["corder"],
        start=start,
        stop=stop,
        bounds=ReadBounds(max_events=35),
    ).run()
    assert r1.stopped_early == "max_events=35"
    assert r1.rows == 40  # whole 10-row transactions only: the one that crossed 35 is kept
    r2 = WindowReader(
        _open(hook),
        second,
        keyspace="customer",
        tables=["corder"],
        start=r1.end_vgtid,
        stop=stop,
    ).run()
    assert r2.stopped_early is None and r2.end_vgtid.has_reached(stop)
    got = [c.after[0] for c in first.changes + second.changes if c.after and c.after[0] in ids]
    assert sorted(got) == ids  # nothing lost, nothing twice across the early stop


def test_snapshot_copies_tables_of_both_shards_exactly(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    stop = capture_stop_position(_open(hook), "customer")
    start = Vgtid.from_json(
        "["
        + ",".join(
            f'{{"keyspace": "customer", "shard": "{sg.shard}", "gtid": ""}}' for sg in stop.shard_gtids
        )
        + "]"
    )
    stager = ListStager()
    result = WindowReader(
        _open(hook),
        stager,
        keyspace="customer",
        tables=["customer", "corder"],
        start=start,
        stop=None,
        checkpoint_every_rows=1,
    ).run()
    for table in ("customer", "corder"):
        staged = replay([c for c in stager.changes if c.table == table], key_index=[0])
        assert staged == _rows(hook, f"SELECT * FROM customer.{table}"), table
    assert {sg.shard for sg in result.end_vgtid.shard_gtids} == {"-80", "80-"}
    assert all(sg.gtid.startswith("MariaDB/") for sg in result.end_vgtid.shard_gtids)
