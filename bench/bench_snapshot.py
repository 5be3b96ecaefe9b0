"""Benchmark: a snapshot (the VStream copy phase) to Parquet vs a raw drain of the same copy.

    .venv/bin/python bench/bench_snapshot.py [--rows 1000000] [--repeat 5]
                                             [--keyspaces commerce,customer] [--profile]

It starts (or reuses) the cluster of ``dev/local_vitess.sh`` and connects as
``bench/bench_window.py`` does (same helpers: data, RSS child, CPU figures). Then, per keyspace:

1. **Data.** ``bench_events`` (id BIGINT PK, a INT, b VARCHAR(32), c DECIMAL(10,2),
   d DATETIME(6)) with ``--rows`` rows: in ``commerce`` (unsharded) through bench_window's
   server-side ``INSERT ... SELECT``; in ``customer`` (two shards, ``hash(id)``) half of them on
   each shard, each shard filled from a seed table of its own with shard-targeted statements.
2. **Pairs**, sides alternating, ``--repeat`` times after one warm-up drain: (a) *raw drain*,
   ``VitessHook.open_vstream`` with exactly the request a snapshot sends (empty position on
   every shard, the table's filter, the runner's flags), counting row changes until vtgate's
   final COPY_COMPLETED (gRPC parses every response; no value is decoded); (b) *snapshot*,
   ``CaptureRunner.snapshot()`` of a new sync into a temp dir: key choice, stop position,
   ``count(*)`` thread, progress, checkpoints every 50,000 rows into a SQLite checkpoint store,
   Parquet parts, manifest and checksums: what a user's first sync does. The store is created
   and migrated once beforehand (a deployment's is). The figure is the median over the pairs of
   (b)/(a) in rows/s.
3. **Peak RSS** of one snapshot in a fresh process (VmHWM), with the RSS before it.

``--profile`` runs one more snapshot under cProfile (the main thread's CPU time) and prints its
top functions (own time and cumulative). The machine's load (``uptime``) is printed with the
figures: on a shared machine they are noisy. The tables are dropped at the end (also on failure).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
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

from airflow_provider_vitess._proto import binlogdata_pb2  # noqa: E402
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec  # noqa: E402
from airflow_provider_vitess.checkpoints import CheckpointStore  # noqa: E402
from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid  # noqa: E402
from airflow_provider_vitess.vstream.reader import VStreamReader  # noqa: E402
from airflow_provider_vitess.vstream.window import capture_stop_position, table_filter  # noqa: E402

TABLE = bw.TABLE
SEED = bw.SEED
# Snapshot rows/s over raw drain rows/s, at least: issue 42 asks 0.95 on the two-shard keyspace
# (0.8 before it); one target for both keyspaces.
RATIO_TARGET = 0.95
SHARDS = {"commerce": ["0"], "customer": ["-80", "80-"]}
ROW_EVENT = binlogdata_pb2.VEventType.ROW
COPY_COMPLETED = binlogdata_pb2.VEventType.COPY_COMPLETED


# -- data ---------------------------------------------------------------------------------


def _on_shard(hook: VitessHook, keyspace: str, shard: str, statements: list[tuple[str, Any]]) -> None:
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text(f"USE `{keyspace}:{shard}`"))
        try:
            for sql, params in statements:
                conn.execute(sqlalchemy.text(sql), params)
                conn.commit()  # one transaction per statement
        finally:
            conn.execute(sqlalchemy.text(f"USE {keyspace}"))  # pooled: leave no shard target behind


def load_customer(hook: VitessHook, rows: int, chunk: int) -> None:
    """``customer.bench_events``: rows split over the two shards, each copied server-side from
    the shard's own seed table (shard-targeted, so no row goes through vtgate's routing; a
    copy streams whatever each shard holds)."""
    drop_customer(hook)
    columns = "(id BIGINT NOT NULL PRIMARY KEY, a INT, b VARCHAR(32), c DECIMAL(10,2), d DATETIME(6))"
    for table in (TABLE, SEED):
        bw.execute(hook, f"CREATE TABLE customer.{table} {columns}")
        # The vschema outlives a dropped table: a rerun finds the vindex there already.
        with contextlib.suppress(sqlalchemy.exc.DBAPIError):
            bw.execute(hook, f"ALTER VSCHEMA ON customer.{table} ADD VINDEX hash(id) USING hash")
    with hook.connect_sql() as conn:
        seed = conn.execute(sqlalchemy.text(f"SELECT id, a, b, c, d FROM commerce.{SEED}")).all()
    values = [dict(zip(("id", "a", "b", "c", "d"), r, strict=True)) for r in seed]
    shards = SHARDS["customer"]
    per_shard = rows // len(shards)
    copy = (
        f"INSERT INTO {TABLE} (id, a, b, c, d) "
        f"SELECT id + :offset, a, b, c, d + INTERVAL :offset SECOND FROM {SEED} WHERE id < :n"
    )
    for k, shard in enumerate(shards):
        statements: list[tuple[str, Any]] = [
            (f"INSERT INTO {SEED} (id, a, b, c, d) VALUES (:id, :a, :b, :c, :d)", values[i : i + 2_000])
            for i in range(0, len(values), 2_000)
        ]
        first = k * per_shard
        count = per_shard if k < len(shards) - 1 else rows - first
        for done in range(0, count, chunk):
            n = min(chunk, count - done)
            statements += [
                (copy, {"offset": first + done + i, "n": min(bw.SEED_ROWS, n - i)})
                for i in range(0, n, bw.SEED_ROWS)
            ]
        _on_shard(hook, "customer", shard, statements)


def drop_customer(hook: VitessHook) -> None:
    for table in (TABLE, SEED):
        bw.execute(hook, f"DROP TABLE IF EXISTS customer.{table}")


def load(hook: VitessHook, keyspace: str, rows: int, chunk: int) -> None:
    began = time.perf_counter()
    if keyspace == "commerce":
        bw.create_tables(hook)
        bw.insert_events(hook, 1, rows, chunk)
    else:
        bw.create_tables(hook)  # the seed rows, in commerce
        load_customer(hook, rows, chunk)
    print(f"  {keyspace}.{TABLE}: {rows:,} rows loaded in {time.perf_counter() - began:.1f} s", flush=True)


# -- the two sides ------------------------------------------------------------------------


def spec(keyspace: str, root: str, sync_id: str) -> SyncSpec:
    return SyncSpec(
        sync_id=sync_id, keyspace=keyspace, tables=(TABLE,), staging_location=os.path.join(root, "staging")
    )


def snapshot_request(hook: VitessHook, keyspace: str) -> Any:
    """The request a snapshot's first VStream sends (``CaptureRunner.snapshot``): an empty
    position on every shard of the keyspace, the table's filter, the runner's flags."""
    opener = bw.open_stream(hook)
    shards = capture_stop_position(opener, keyspace).shard_gtids
    start = Vgtid(tuple(ShardGtid(sg.keyspace, sg.shard, "") for sg in shards))
    flags = hook.vstream_flags(heartbeat_interval=SyncSpec.heartbeat_interval)
    reader = VStreamReader(opener, vgtid=start, filter=table_filter([TABLE]), flags=flags)
    return reader.build_request(start.to_proto())


def raw_drain(hook: VitessHook, keyspace: str) -> tuple[int, float, float]:
    """Row changes of the copy until vtgate's final COPY_COMPLETED; nothing decoded."""
    rows = 0
    began, cpu = time.perf_counter(), time.process_time()
    call = hook.open_vstream(snapshot_request(hook, keyspace), timeout=bw.STREAM_TIMEOUT)
    try:
        for response in call:
            done = False
            for ev in response.events:
                t = ev.type
                if t == ROW_EVENT:
                    rows += len(ev.row_event.row_changes)
                elif t == COPY_COMPLETED and not ev.keyspace and not ev.shard:
                    done = True
            if done:
                break
        else:
            raise RuntimeError("the VStream ended before the copy completed")
    finally:
        call.cancel()  # type: ignore[attr-defined]  # a gRPC call; ends the server side too
    return rows, time.perf_counter() - began, time.process_time() - cpu


def snapshot(hook: VitessHook, keyspace: str, root: str, sync_id: str) -> tuple[int, float, float]:
    """One whole ``CaptureRunner.snapshot()`` of a new sync; the store exists and is migrated."""
    store = CheckpointStore(f"sqlite:///{root}/store.db")
    try:
        runner = CaptureRunner(hook, store, spec(keyspace, root, sync_id), holder="bench")
        began, cpu = time.perf_counter(), time.process_time()
        outcome = runner.snapshot()
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        store.close()
    return outcome.manifest.rows, elapsed, cpu


def new_store(root: str) -> None:
    store = CheckpointStore(f"sqlite:///{root}/store.db")
    store.migrate()
    store.close()


# -- peak RSS in a fresh process ----------------------------------------------------------


def child(job: dict[str, Any]) -> None:
    import pyarrow

    hook = VitessHook(bw.CONN_ID)
    hook.get_channel()
    rss_before = bw._status_kib("VmRSS") or 0
    rows, seconds, cpu = snapshot(hook, job["keyspace"], job["root"], "rss")
    hook.close()
    print(
        json.dumps(
            {
                "rows": rows,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "rss_before_kib": rss_before,
                "peak_rss_kib": bw.peak_rss_kib(),
                "arrow_peak_bytes": pyarrow.default_memory_pool().max_memory(),
            }
        )
    )


def measure_rss(keyspace: str, root: str) -> dict[str, Any]:
    job = json.dumps({"keyspace": keyspace, "root": root})
    out = subprocess.run(
        [sys.executable, __file__, "--child", job], check=True, capture_output=True, text=True
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return figures


def profile(hook: VitessHook, keyspace: str, root: str, top: int = 25) -> None:
    # The main thread's CPU time, not the wall clock: on a shared machine a C call that waits
    # for a core would otherwise look expensive. (gRPC's receive threads are not profiled.)
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    rows, seconds, cpu = snapshot(hook, keyspace, root, "profile")
    profiler.disable()
    print(f"\nprofile of one {keyspace} snapshot ({rows:,} rows, {seconds:.2f} s, CPU {cpu:.2f} s):")
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        lines = text.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"  by {order}:")
        print("\n".join("  " + line for line in lines[start:] if line.strip()))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table, per keyspace")
    parser.add_argument("--repeat", type=int, default=5, help="alternating pairs per keyspace (median)")
    parser.add_argument("--chunk", type=int, default=10_000, help="rows per loading transaction")
    parser.add_argument("--keyspaces", default="commerce,customer", help="commerce, customer or both")
    parser.add_argument("--profile", action="store_true", help="also profile one snapshot per keyspace")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    keyspaces = [k.strip() for k in args.keyspaces.split(",") if k.strip()]
    unknown = sorted(set(keyspaces) - set(SHARDS))
    if unknown:
        parser.error(f"unknown keyspaces {unknown}: choose among {sorted(SHARDS)}")

    hook = bw.connect()
    print(f"cluster up; {uptime()}")
    summary: list[str] = []
    try:
        for keyspace in keyspaces:
            load(hook, keyspace, args.rows, args.chunk)
            raw_drain(hook, keyspace)  # warm-up: the first read of the table is slower on both sides
            raws: list[bw.Run] = []
            snaps: list[bw.Run] = []
            with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as root:
                new_store(root)
                for i in range(args.repeat):
                    raw, _ = bw.measured(raw_drain, hook, keyspace)
                    snap, _ = bw.measured(snapshot, hook, keyspace, root, f"bench-{i}")
                    for run, what in ((raw, "raw drain"), (snap, "snapshot")):
                        if run.events != args.rows:
                            raise RuntimeError(f"{what} counted {run.events:,} rows, expected {args.rows:,}")
                    raws.append(raw)
                    snaps.append(snap)
                    print(raw.line(f"[{keyspace}] {i + 1} raw drain"), flush=True)
                    print(snap.line(f"[{keyspace}] {i + 1} snapshot"), f"| {uptime()}", flush=True)
                rss = measure_rss(keyspace, root)
                if args.profile:
                    profile(hook, keyspace, root)
            print(
                f"  [{keyspace}] peak RSS of a snapshot in a fresh process: "
                f"{bw.mib(rss['peak_rss_kib']):.0f} MiB (before it {bw.mib(rss['rss_before_kib']):.0f} MiB; "
                f"pyarrow pool peak {rss['arrow_peak_bytes'] / 2**20:.0f} MiB), "
                f"{rss['rows']:,} rows in {rss['seconds']:.2f} s",
                flush=True,
            )
            ratios = [s.rate / r.rate for r, s in zip(raws, snaps, strict=True)]
            ratio = statistics.median(ratios)
            summary += [
                bw.summary_line(
                    f"[{keyspace}] raw drain, {args.rows:,} rows",
                    f"{statistics.median(r.rate for r in raws):,.0f} rows/s",
                    "-",
                    "-",
                ),
                bw.summary_line(
                    f"[{keyspace}] snapshot to Parquet",
                    f"{statistics.median(s.rate for s in snaps):,.0f} rows/s",
                    "-",
                    "-",
                ),
                bw.summary_line(
                    f"[{keyspace}] snapshot / raw drain",
                    f"{ratio:.2f}",
                    f">= {RATIO_TARGET}",
                    f"{ratio / RATIO_TARGET:.2f} ({'met' if ratio >= RATIO_TARGET else 'missed'})",
                ),
                bw.each_run(ratios),
                bw.summary_line(
                    f"[{keyspace}] peak RSS of a snapshot", f"{bw.mib(rss['peak_rss_kib']):.0f} MiB", "-", "-"
                ),
            ]
    finally:
        bw.drop_tables(hook)
        drop_customer(hook)
        hook.close()
    print(f"\nsummary (medians of {args.repeat} alternating pairs; ratio = measured / target)")
    print(bw.summary_line("figure", "measured", "target", "ratio"))
    print("\n".join(summary))
    print(f"  load: {uptime()}")
    print(f"  command: {' '.join(['.venv/bin/python', 'bench/bench_snapshot.py', *sys.argv[1:]])}")


if __name__ == "__main__":
    main()
