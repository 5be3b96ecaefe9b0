"""Benchmark: decode VStream rows and stage them as Parquet (not a test; prints figures).

Rows are real-shaped ``query.Row`` protos of a 5-column table (BIGINT, INT, VARCHAR(64),
DECIMAL(10,2), DATETIME(6)), as vtgate sends them. A pool of distinct rows is built once and
cycled to reach N, so building the input does not dominate the run.

    .venv/bin/python bench/bench_stage.py [--rows 2000000] [--profile int_str|stage|decode|both]

"stage int/str" stages already-decoded 5-column int/str tuples (the 1M rows/s target's shape);
"stage only" the benchmark table's decoded rows (DECIMAL and DATETIME cost Arrow ~150-200 ns a
value to convert); "decode only" is ``RowDecoder.decode``; "decode+stage" both, as in a sync.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.events import Operation
from airflow_provider_vitess.vstream.values import RowDecoder

T = query_pb2.Type
TARGET = 1_000_000  # rows/s on one core
POOL = 200_000
VGTID = Vgtid.from_json(
    '[{"keyspace":"ks","shard":"-80","gtid":"MySQL56/a2cd2e7c-aa2a-11ee-8000-000000000001:1-9"}]'
)
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
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return rate


def stage(
    rows: Iterable[tuple[Any, ...]], workdir: str, window: int, fields: list[query_pb2.Field] = FIELDS
) -> None:
    stager = WindowStager(workdir, "bench", window, key_columns={"orders": ["id"]})
    stager.set_schema("ks", "orders", fields)
    add = stager.add_change
    ins = Operation.INSERT
    for seq, row in enumerate(rows):
        add("ks", "orders", "-80", ins, 1700000000, seq, None, row)
    stager.finish(VGTID, VGTID, VGTID)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--profile", choices=["int_str", "decode", "stage", "both"], default=None)
    args = parser.parse_args()
    n = args.rows
    pool = make_rows(min(POOL, n))
    decoder = RowDecoder(FIELDS, "orders")
    decode = decoder.decode
    decoded = [decode(r) for r in pool]

    def cycle(items: list[Any]) -> Iterable[Any]:
        return itertools.islice(itertools.cycle(items), n)

    def decode_only() -> None:
        for r in cycle(pool):
            decode(r)

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
            "decode+stage",
            n,
            lambda: stage(map(decode, cycle(pool)), workdir, 2),
            args.profile == "both",
        )
        from airflow_provider_vitess.staging import load_manifest

        manifest = load_manifest(workdir, "bench", 2)
        assert manifest is not None and manifest.rows == n
        sample = read_table(manifest, "orders").slice(0, 1).to_pylist()[0]
        assert tuple(sample[f.name] for f in FIELDS) == decoded[0]
        staged = sum(p.bytes for p in manifest.tables["orders"].parts)
        print(f"staged Parquet: {staged / 1e6:.1f} MB for {n:,} rows")


if __name__ == "__main__":
    main()
