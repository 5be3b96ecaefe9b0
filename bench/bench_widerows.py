"""Benchmark: peak memory of catch-up windows of wide rows vs narrow rows (prints figures).

    .venv/bin/python bench/bench_widerows.py [--narrow-rows 1000000] [--wide-rows 32768]
                                             [--wide-bytes 65536] [--huge-bytes 16777216]
                                             [--chunk 10000] [--unbounded]

It starts (or reuses) the cluster of ``dev/local_vitess.sh`` and connects as
``bench/bench_window.py`` does (same helpers). ``commerce.bench_wide`` (id BIGINT PK, body
LONGBLOB) is created afresh and three catch-up windows are written back to back, each
"capture a position, insert, capture a position", rows generated server-side
(``INSERT ... SELECT`` from a seed table of 64 random blobs, so the bytes do not compress):

* **narrow**: ``--narrow-rows`` rows with a 42-byte body (~50 bytes a row as vtgate sends it);
* **wide**: ``--wide-rows`` rows with a ``--wide-bytes`` body (random, 64 KiB by default);
* **huge**: one row with a ``--huge-bytes`` body (16 MiB: the dev cluster's vtgate takes gRPC
  messages up to 64 MiB, see dev/local_vitess.sh; MariaDB's max_allowed_packet is 256M).

Rows go in ``--chunk`` rows a transaction (10,000: a wide transaction is 640 MB, far past the
read's transaction limit, so it spills as it arrives). Each window is then read by
``WindowReader`` into a real ``WindowStager`` (temp dir, manifest written), as the capture
runner does, in a **fresh process** whose peak RSS (VmHWM) is the figure, with its RSS before
the read and pyarrow's peak allocation. Targets (issue 12): the wide window's and the huge
row's peak RSS within 1.5x of the narrow window's, and under 1 GiB.

``--unbounded`` reads with the byte limits off (row caps only): the behaviour before the read
was bounded in bytes, for comparison. The table is dropped at the end (also on failure).

Scale: 1M rows of 64 KiB would be 64 GB of binlog (and as much InnoDB and Parquet); the
default wide window is 2 GiB, 32x the read's 64 MiB buffer limit and 2x the RSS target, which
is what shows the bound: a read that held the window, or one transaction of it, would exceed
both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import bench_window as bw  # noqa: E402  (bench/, the script's own directory)
import sqlalchemy  # noqa: E402

from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from airflow_provider_vitess.staging import WindowStager  # noqa: E402
from airflow_provider_vitess.vgtid import Vgtid  # noqa: E402
from airflow_provider_vitess.vstream.spill import MemoryLimits  # noqa: E402
from airflow_provider_vitess.vstream.window import WindowReader, capture_stop_position  # noqa: E402

KEYSPACE = bw.KEYSPACE
TABLE = "bench_wide"
SEED = "bench_wide_seed"
SEED_BLOBS = 64
SEED_BYTES = 64 << 10  # each seed blob: random, so staged bodies do not compress
RATIO_TARGET = 1.5  # peak RSS over the narrow window's, at most
RSS_TARGET_MIB = 1024
UNBOUNDED = MemoryLimits(max_buffered_bytes=1 << 62, transaction_bytes=1 << 62)  # row caps only


def create_tables(hook: VitessHook, blob_bytes: int) -> None:
    drop_tables(hook)
    for table in (TABLE, SEED):
        bw.execute(hook, f"CREATE TABLE {KEYSPACE}.{table} (id BIGINT NOT NULL PRIMARY KEY, body LONGBLOB)")
    for i in range(SEED_BLOBS):  # one random blob a statement: small statements through vtgate
        bw.execute(
            hook,
            f"INSERT INTO {KEYSPACE}.{SEED} (id, body) VALUES (:id, :body)",
            {"id": i, "body": os.urandom(blob_bytes)},
        )


def drop_tables(hook: VitessHook) -> None:
    for table in (TABLE, SEED):
        bw.execute(hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{table}")


def insert_rows(hook: VitessHook, first_id: int, count: int, body_bytes: int, chunk: int) -> None:
    """``count`` rows from ``first_id``, bodies of ``body_bytes`` cut from (or repeating) the seed
    blobs; one transaction per ``chunk`` rows, a statement at most 4,096 rows (the seed joined
    with itself)."""
    sql = sqlalchemy.text(
        f"INSERT INTO {KEYSPACE}.{TABLE} (id, body) "
        f"SELECT a.id * {SEED_BLOBS} + b.id + :offset, LEFT(REPEAT(a.body, :times), :size) "
        f"FROM {KEYSPACE}.{SEED} a JOIN {KEYSPACE}.{SEED} b WHERE a.id * {SEED_BLOBS} + b.id < :n"
    )
    times = -(-body_bytes // SEED_BYTES)
    done = 0
    while done < count:
        end = min(done + chunk, count)
        with hook.connect_sql() as conn, conn.begin():
            while done < end:
                n = min(end - done, SEED_BLOBS * SEED_BLOBS)
                conn.execute(sql, {"offset": first_id + done, "times": times, "size": body_bytes, "n": n})
                done += n


def read_window(spec: dict[str, Any]) -> dict[str, Any]:
    """Child side: one window through WindowReader + WindowStager; its figures."""
    import pyarrow

    hook = VitessHook(bw.CONN_ID)
    hook.get_channel()  # connected before the "before" figure, like the read's own setup
    start, stop = Vgtid.from_json(spec["start"]), Vgtid.from_json(spec["stop"])
    rss_before = bw._status_kib("VmRSS") or 0
    memory = UNBOUNDED if spec["unbounded"] else MemoryLimits()
    began, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="bench-widerows-") as workdir:
        stager = WindowStager(workdir, "bench", 1, key_columns={TABLE: ["id"]})
        reader = WindowReader(
            bw.open_stream(hook),
            stager,
            keyspace=KEYSPACE,
            tables=[TABLE],
            start=start,
            stop=stop,
            flags=bw.flags(hook),
            memory=memory,
        )
        result = reader.run()
        manifest = stager.finish(start, stop, result.end_vgtid, stats=result.stats)
        staged_bytes = sum(p.bytes for t in manifest.tables.values() for p in t.parts)
    hook.close()
    if result.rows != spec["rows"] or manifest.rows != spec["rows"]:
        raise RuntimeError(f"{spec['name']}: staged {manifest.rows:,} rows, expected {spec['rows']:,}")
    return {
        "rows": result.rows,
        "seconds": time.perf_counter() - began,
        "cpu_seconds": time.process_time() - cpu,
        "rss_before_kib": rss_before,
        "peak_rss_kib": bw.peak_rss_kib(),
        "arrow_peak_bytes": pyarrow.default_memory_pool().max_memory(),
        "staged_bytes": staged_bytes,
        "merge": result.stats.get("merge", {}),
        "spilled_transactions": result.stats.get("spilled_transactions", 0),
    }


def measure(name: str, rows: int, start: Vgtid, stop: Vgtid, unbounded: bool) -> dict[str, Any]:
    spec = {
        "name": name,
        "rows": rows,
        "start": start.to_json(),
        "stop": stop.to_json(),
        "unbounded": unbounded,
    }
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], check=True, capture_output=True, text=True
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--narrow-rows", type=int, default=1_000_000)
    parser.add_argument("--narrow-bytes", type=int, default=42, help="body bytes of a narrow row")
    parser.add_argument("--wide-rows", type=int, default=32_768)
    parser.add_argument("--wide-bytes", type=int, default=64 << 10, help="body bytes of a wide row")
    parser.add_argument("--huge-bytes", type=int, default=16 << 20, help="body bytes of the single huge row")
    parser.add_argument("--chunk", type=int, default=10_000, help="rows per source transaction")
    parser.add_argument("--unbounded", action="store_true", help="byte limits off: the row caps only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(read_window(json.loads(args.child))))
        return

    command = " ".join([".venv/bin/python", "bench/bench_widerows.py", *sys.argv[1:]])
    hook = bw.connect()
    opener = bw.open_stream(hook)
    windows: list[tuple[str, int, int, Vgtid, Vgtid]] = []
    figures: dict[str, dict[str, Any]] = {}
    try:
        create_tables(hook, SEED_BYTES)
        next_id = 1
        start = capture_stop_position(opener, KEYSPACE)
        for name, rows, size in (
            ("narrow", args.narrow_rows, args.narrow_bytes),
            ("wide", args.wide_rows, args.wide_bytes),
            ("huge", 1, args.huge_bytes),
        ):
            began = time.perf_counter()
            insert_rows(hook, next_id, rows, size, args.chunk)
            next_id += rows
            stop = capture_stop_position(opener, KEYSPACE)
            print(
                f"  {name} window: {rows:,} rows of {size:,} bytes ({rows * size / 2**20:,.0f} MiB) "
                f"inserted in {time.perf_counter() - began:.1f} s",
                flush=True,
            )
            windows.append((name, rows, size, start, stop))
            start = stop
        how = "byte limits OFF (--unbounded)" if args.unbounded else "bounded"
        print(f"\npeak RSS of reader+stager, each window in a fresh process, {how}:")
        for name, rows, size, start, stop in windows:
            f = figures[name] = measure(name, rows, start, stop, args.unbounded)
            print(
                f"  {name:<7} {f['rows']:>9,} rows x {size:>10,} B in {f['seconds']:6.1f} s "
                f"(client CPU {f['cpu_seconds']:.1f} s): RSS before {f['rss_before_kib'] / 1024:,.0f} MiB, "
                f"peak {f['peak_rss_kib'] / 1024:,.0f} MiB; pyarrow peak "
                f"{f['arrow_peak_bytes'] / 2**20:,.0f} MiB; staged {f['staged_bytes'] / 2**20:,.0f} MiB; "
                f"spilled: {f['spilled_transactions']} transactions, "
                f"{f['merge'].get('spilled_units', 0)} units",
                flush=True,
            )
    finally:
        drop_tables(hook)
        hook.close()

    narrow = figures["narrow"]["peak_rss_kib"]
    print(f"\nsummary (load: {os.getloadavg()[0]:.1f}; ratio = measured / target)")
    print(bw.summary_line("figure", "measured", "target", "ratio"))
    print(
        bw.summary_line(
            f"peak RSS, narrow ({args.narrow_rows:,} rows)", f"{narrow / 1024:,.0f} MiB", "-", "-"
        )
    )
    for name, label in (
        ("wide", f"wide ({args.wide_rows:,} x {args.wide_bytes:,} B)"),
        ("huge", f"huge (1 x {args.huge_bytes:,} B)"),
    ):
        peak = figures[name]["peak_rss_kib"]
        ratio = peak / narrow
        print(
            bw.summary_line(
                f"peak RSS {label} / narrow",
                f"{ratio:.2f}x",
                f"<= {RATIO_TARGET}x",
                f"{ratio / RATIO_TARGET:.2f} ({'met' if ratio <= RATIO_TARGET else 'missed'})",
            )
        )
        mib = peak / 1024
        print(
            bw.summary_line(
                f"peak RSS {label}",
                f"{mib:,.0f} MiB",
                f"< {RSS_TARGET_MIB:,} MiB",
                f"{mib / RSS_TARGET_MIB:.2f} ({'met' if mib < RSS_TARGET_MIB else 'missed'})",
            )
        )
    print(f"  command: {command}")


if __name__ == "__main__":
    main()
