"""Benchmark: decode VStream rows and stage them as Parquet (not a test; prints figures).

Rows are real-shaped ``query.Row`` protos of a 5-column table (BIGINT, INT, VARCHAR(64),
DECIMAL(10,2), DATETIME(6)), as vtgate sends them, packed ``--rows-per-event`` to a ROW
``VEvent`` (194: what the local vtgate sends for this table, one MariaDB 8 KiB binlog row event
each). A pool of distinct rows is built once and cycled to reach N, so building the input does
not dominate the run.

    .venv/bin/python bench/bench_stage.py [--rows 2000000] [--rows-per-event 194]
                                          [--profile int_str|decode|stage|per_row|both|read]

Lines:

* ``stage int/str``: ``add_change`` + Parquet for already-decoded 5-column int/str tuples;
* ``decode only``: ``RowDecoder.decode``, the per-row decoder (now the fallback path);
* ``stage only``: ``add_change`` + Parquet of the benchmark table's decoded rows;
* ``per-row d+s``: both, the path a sync took before the columnar staging;
* ``decode+stage``: what a sync does with the same rows now: ``EventDecoder.decode`` of each
  ROW event (FIELD first), ``WindowStager.add_rows``, Parquet parts and manifest (the target
  line: 1,000,000 rows/s on one core);
* ``read+stage``: the same rows as a catch-up window of 10,000-row transactions (BEGIN, ROW
  events, COMMIT, VGTID in responses of ~60 events), through ``WindowReader`` from an in-memory
  stream: the event decoder, transaction assembler, shard merger and stager of a real window;
* ``read+stage raw``: the same, the responses given as bytes, as ``VitessHook.open_vstream_raw``
  hands them to the capture runner (read through ``decoding/wire.py``'s views).

Every staged value of the pool is read back and compared with the per-row decoder's.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import pstats
import random
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2, vtgate_pb2
from airflow_provider_vitess.decoding.events import EventDecoder, FieldEvent, Operation, RowEvent
from airflow_provider_vitess.decoding.values import RowDecoder
from airflow_provider_vitess.staging import WindowStager, load_manifest, read_table
from airflow_provider_vitess.utils.heap import frozen_heap
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import WindowReader

T = query_pb2.Type
E = binlogdata_pb2.VEventType
TARGET = 1_000_000  # rows/s on one core
POOL = 200_000
KEYSPACE, SHARD, TABLE = "ks", "-80", "orders"
GTID = "MySQL56/a2cd2e7c-aa2a-11ee-8000-000000000001"
VGTID = Vgtid.from_json(f'[{{"keyspace":"{KEYSPACE}","shard":"{SHARD}","gtid":"{GTID}:1-9"}}]')
TX_ROWS = 10_000  # rows per source transaction in the read+stage line (bench_window's --chunk)
EVENTS_PER_RESPONSE = 60
FIELDS = [
    query_pb2.Field(name="id", type=T.INT64, column_type="bigint", flags=1 | 2),
    query_pb2.Field(name="qty", type=T.INT32, column_type="int"),
    query_pb2.Field(name="name", type=T.VARCHAR, column_type="varchar(64)", charset=45),
    query_pb2.Field(name="price", type=T.DECIMAL, column_type="decimal(10,2)", decimals=2, column_length=12),
    query_pb2.Field(name="at", type=T.DATETIME, column_type="datetime(6)", decimals=6),
]


# The target's own shape: 5 int/str columns, already decoded.
INT_STR_FIELDS = [
    query_pb2.Field(name="id", type=T.INT64, column_type="bigint", flags=1 | 2),
    query_pb2.Field(name="qty", type=T.INT32, column_type="int"),
    query_pb2.Field(name="name", type=T.VARCHAR, column_type="varchar(64)", charset=45),
    query_pb2.Field(name="ref", type=T.INT64, column_type="bigint"),
    query_pb2.Field(name="city", type=T.VARCHAR, column_type="varchar(32)", charset=45),
]


def make_int_str_rows(n: int) -> list[tuple[int, int, str, int, str]]:
    rnd = random.Random(7)
    cities = [f"city-{i}" for i in range(500)]
    return [
        (
            i,
            rnd.randint(0, 10**6),
            f"customer-{rnd.randint(0, 10**9)}",
            rnd.randint(0, 2**40),
            rnd.choice(cities),
        )
        for i in range(n)
    ]


def make_rows(n: int) -> list[query_pb2.Row]:
    rnd = random.Random(42)
    out = []
    for i in range(n):
        texts = [
            str(i).encode(),
            str(rnd.randint(-(2**31), 2**31 - 1)).encode(),
            f"customer-{rnd.randint(0, 10**9)}@example.com".encode(),
            f"{rnd.randint(-(10**7), 10**7)}.{rnd.randint(0, 99):02d}".encode(),
            f"2024-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d} "
            f"{rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}."
            f"{rnd.randint(0, 999999):06d}".encode(),
        ]
        out.append(query_pb2.Row(lengths=[len(t) for t in texts], values=b"".join(texts)))
    return out


def field_vevent() -> binlogdata_pb2.VEvent:
    fe = binlogdata_pb2.FieldEvent(
        table_name=f"{KEYSPACE}.{TABLE}", fields=FIELDS, keyspace=KEYSPACE, shard=SHARD
    )
    return binlogdata_pb2.VEvent(type=E.FIELD, field_event=fe, keyspace=KEYSPACE, shard=SHARD)


def row_vevents(rows: list[query_pb2.Row], per_event: int) -> list[binlogdata_pb2.VEvent]:
    """Insert ROW events as vtgate sends them (table name keyspace-qualified)."""
    events = []
    for first in range(0, len(rows), per_event):
        re_ = binlogdata_pb2.RowEvent(table_name=f"{KEYSPACE}.{TABLE}", keyspace=KEYSPACE, shard=SHARD)
        for r in rows[first : first + per_event]:
            re_.row_changes.add().after.CopyFrom(r)
        events.append(
            binlogdata_pb2.VEvent(
                type=E.ROW, row_event=re_, keyspace=KEYSPACE, shard=SHARD, timestamp=1700000000
            )
        )
    return events


def timed(label: str, n: int, fn: Callable[[], Any], profile: bool) -> float:
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    fn()
    if prof:
        prof.disable()
    elapsed = time.perf_counter() - start
    rate = n / elapsed
    print(f"{label:<15} {n:>10,} rows  {elapsed:7.2f} s  {rate:>12,.0f} rows/s  {rate / TARGET:5.2f}x target")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    return rate


def stage(
    rows: Iterable[tuple[Any, ...]], workdir: str, window: int, fields: list[query_pb2.Field] = FIELDS
) -> None:
    stager = WindowStager(workdir, "bench", window, key_columns={TABLE: ["id"]})
    stager.set_schema(KEYSPACE, TABLE, fields)
    add = stager.add_change
    ins = Operation.INSERT
    for seq, row in enumerate(rows):
        add(KEYSPACE, TABLE, SHARD, ins, 1700000000, seq, None, row)
    stager.finish(VGTID, VGTID, VGTID)


def decode_and_stage(events: Iterable[binlogdata_pb2.VEvent], workdir: str, window: int) -> None:
    """What a sync does with ROW events: decode each, hand its rows to the stager."""
    stager = WindowStager(workdir, "bench", window, key_columns={TABLE: ["id"]})
    decoder = EventDecoder()
    seq = 1
    for vevent in itertools.chain([field_vevent()], events):
        event = decoder.decode(vevent)
        if isinstance(event, RowEvent):
            stager.add_rows(event.keyspace, event.table, event.shard, event.timestamp, seq, event.changes)
            seq += len(event.changes)
        elif isinstance(event, FieldEvent):
            stager.set_schema(event.keyspace, event.table, event.fields, shard=event.shard)
    stager.finish(VGTID, VGTID, VGTID)


def window_responses(events: Iterable[binlogdata_pb2.VEvent], n: int, per_event: int) -> Iterator[Any]:
    """A catch-up window as vtgate streams it: transactions of TX_ROWS rows, each BEGIN, its
    ROW events, COMMIT and the VGTID after it, batched into responses."""
    source = iter(events)
    pending: list[binlogdata_pb2.VEvent] = [field_vevent()]
    sent, tx = 0, 0
    while sent < n:
        tx += 1
        pending.append(
            binlogdata_pb2.VEvent(type=E.BEGIN, keyspace=KEYSPACE, shard=SHARD, timestamp=1700000000)
        )
        in_tx = 0
        while in_tx < TX_ROWS and sent < n:
            ev = next(source)
            pending.append(ev)
            rows = len(ev.row_event.row_changes)
            in_tx += rows
            sent += rows
            if len(pending) >= EVENTS_PER_RESPONSE:
                yield vtgate_pb2.VStreamResponse(events=pending)
                pending = []
        vgtid = binlogdata_pb2.VGtid(
            shard_gtids=[binlogdata_pb2.ShardGtid(keyspace=KEYSPACE, shard=SHARD, gtid=f"{GTID}:1-{9 + tx}")]
        )
        pending += [
            binlogdata_pb2.VEvent(type=E.COMMIT, keyspace=KEYSPACE, shard=SHARD, timestamp=1700000000),
            binlogdata_pb2.VEvent(type=E.VGTID, vgtid=vgtid, keyspace=KEYSPACE, shard=SHARD),
        ]
    yield vtgate_pb2.VStreamResponse(events=pending)


def read_and_stage(
    responses: Sequence[vtgate_pb2.VStreamResponse | bytes],
    stop: Vgtid,
    workdir: str,
    window: int,
    freeze: bool = True,
) -> int:
    """A window's read and staging; ``freeze``: with the heap frozen around the read, as the
    capture runner reads (``utils.heap.frozen_heap``)."""
    stager = WindowStager(workdir, "bench", window, key_columns={TABLE: ["id"]})
    reader = WindowReader(
        lambda request: iter(responses), stager, keyspace=KEYSPACE, tables=[TABLE], start=VGTID, stop=stop
    )
    with frozen_heap() if freeze else contextlib.nullcontext():
        result = reader.run()
    stager.finish(VGTID, stop, result.end_vgtid)
    return result.rows


def check(workdir: str, window: int, n: int, expected: list[tuple[Any, ...]]) -> int:
    """The staged rows of a window: counted, and the first ``len(expected)`` compared in full."""
    manifest = load_manifest(workdir, "bench", window)
    assert manifest is not None and manifest.rows == n, (manifest and manifest.rows, n)
    table = read_table(manifest, TABLE).sort_by("_seq").slice(0, len(expected))
    staged = list(zip(*(table.column(f.name).to_pylist() for f in FIELDS), strict=True))
    assert staged == expected[: len(staged)], "staged values differ from the per-row decoder's"
    return sum(p.bytes for p in manifest.tables[TABLE].parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rows-per-event", type=int, default=194)
    parser.add_argument(
        "--profile",
        choices=["int_str", "decode", "stage", "per_row", "both", "read", "read_raw"],
        default=None,
    )
    args = parser.parse_args()
    n = args.rows
    pool = make_rows(min(POOL, n))
    decoder = RowDecoder(FIELDS, TABLE)
    decode = decoder.decode
    decoded = [decode(r) for r in pool]
    pool_events = row_vevents(pool, args.rows_per_event)

    def cycle(items: list[Any]) -> Iterable[Any]:
        return itertools.islice(itertools.cycle(items), n)

    def cycle_events() -> Iterator[binlogdata_pb2.VEvent]:
        """Whole events until n rows (the last one cut short)."""
        left = n
        for ev in itertools.cycle(pool_events):
            if left <= 0:
                return
            count = len(ev.row_event.row_changes)
            if count > left:
                ev = row_vevents([rc.after for rc in ev.row_event.row_changes[:left]], left)[0]
            left -= count
            yield ev

    def decode_only() -> None:
        for r in cycle(pool):
            decode(r)

    responses = list(window_responses(cycle_events(), n, args.rows_per_event))
    serialized = [r.SerializeToString() for r in responses]  # as open_vstream_raw gets them
    last = [e.vgtid for r in responses for e in r.events if e.type == E.VGTID][-1]
    stop = Vgtid.from_proto(last)

    with tempfile.TemporaryDirectory() as workdir:
        int_str = make_int_str_rows(min(POOL, n))
        timed(
            "stage int/str",
            n,
            lambda: stage(cycle(int_str), workdir, 3, INT_STR_FIELDS),
            args.profile == "int_str",
        )
        timed("decode only", n, decode_only, args.profile == "decode")
        timed("stage only", n, lambda: stage(cycle(decoded), workdir, 1), args.profile == "stage")
        timed(
            "per-row d+s",
            n,
            lambda: stage(map(decode, cycle(pool)), workdir, 4),
            args.profile == "per_row",
        )
        timed("decode+stage", n, lambda: decode_and_stage(cycle_events(), workdir, 2), args.profile == "both")
        timed("read+stage", n, lambda: read_and_stage(responses, stop, workdir, 5), args.profile == "read")
        timed(
            "read+stage raw",
            n,
            lambda: read_and_stage(serialized, stop, workdir, 6),
            args.profile == "read_raw",
        )
        timed(
            "raw, no freeze",
            n,
            lambda: read_and_stage(serialized, stop, workdir, 7, freeze=False),
            False,
        )
        for window in (1, 4, 5, 6, 7):
            check(workdir, window, n, decoded)
        staged = check(workdir, 2, n, decoded)
        print(f"staged Parquet: {staged / 1e6:.1f} MB for {n:,} rows; pool rows checked against the decoder")


if __name__ == "__main__":
    main()
