"""Benchmark: catch-up windows read from the real local Vitess (not a test; prints figures).

    .venv/bin/python bench/bench_window.py [--rows-small 500000 --rows-large 5000000]

It starts (or reuses) the cluster of ``dev/local_vitess.sh`` and talks to it through an Airflow
connection in an environment variable, as ``tests/conftest.py`` does. Then:

1. **Data.** ``commerce.bench_events`` (id BIGINT PK, a INT, b VARCHAR(32), c DECIMAL(10,2),
   d DATETIME(6)) is created afresh. A window of N events is "capture a position, insert N rows,
   capture a position": rows go in as ``INSERT ... SELECT`` of ``--chunk`` rows from a seed table
   (server side, one transaction per chunk). Three windows back to back: throughput, small,
   large.
2. **Throughput** on the throughput window, same start and stop for both sides, after one
   warm-up drain, ``--repeat`` runs of each side alternating: (a) *raw drain*,
   ``VitessHook.open_vstream`` with the window's request, counting row changes until the
   stream's VGTID reaches the stop (gRPC parses the protobuf; no value is decoded);
   (b) *reader+stager*, ``WindowReader`` into a real ``WindowStager`` in a temp dir, manifest
   included, reading the response bytes as the capture runner does
   (``open_vstream_raw``; ``--reader-responses parsed`` gives it gRPC-parsed messages instead).
   The figure is the median over the run pairs of (b)/(a) in events/s. ``--cpu-layout``: the
   pairs run with the cluster on the same cores as this process (``shared``), on cores of its
   own (``split``, as with vtgate on another host: ``bench/cpu_layout.py``), or ``both``,
   alternating (the default). In ``shared`` each pair is followed by two slowed raw drains:
   one sleeping 1 µs a row (as slow as the stager, no CPU) and one spinning the CPU the stager
   took over the raw drain (the stager's CPU, none of its work); they tell a consumer that is
   slow from one that takes CPU away from the co-located server.
3. **Peak RSS** of reader+stager for the small and the large window, each in a fresh
   subprocess (VmHWM of /proc/self/status), with the RSS before the read and pyarrow's peak
   allocation, to tell the read's own memory from the interpreter's and to see what holds it.
4. The tables are dropped at the end (also on failure), so the dev cluster does not keep them.

An "event" is one row change (what ``ReadResult.rows`` counts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import sqlalchemy  # noqa: E402
from cpu_layout import LAYOUTS, cpu_layout  # noqa: E402  (bench/, the script's own directory)

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2  # noqa: E402
from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from airflow_provider_vitess.staging import WindowStager  # noqa: E402
from airflow_provider_vitess.utils.heap import frozen_heap  # noqa: E402
from airflow_provider_vitess.vgtid import Vgtid, position_contains  # noqa: E402
from airflow_provider_vitess.vstream.reader import VStreamReader  # noqa: E402
from airflow_provider_vitess.vstream.window import (  # noqa: E402
    ReadResult,
    WindowReader,
    capture_stop_position,
    table_filter,
)

KEYSPACE = "commerce"
TABLE = "bench_events"
SEED = "bench_seed"
SEED_ROWS = 10_000
CONN_ID = "vitess_bench"
PACE_US = 1.0  # the paced drain's sleep per row: about the stager's CPU per row
RATIO_TARGET = 0.9  # reader+stager events/s over raw drain events/s, at least
RSS_TARGET = 1.2  # peak RSS of the large window over the small one, at most
STREAM_TIMEOUT = 3600.0
ROW_EVENT = binlogdata_pb2.VEventType.ROW
VGTID_EVENT = binlogdata_pb2.VEventType.VGTID


# -- cluster and connection ---------------------------------------------------------------


def connect() -> VitessHook:
    """Start or reuse the local cluster; define the Airflow connection as tests/conftest.py does."""
    out = subprocess.run(
        [str(REPO / "dev" / "local_vitess.sh"), "start"], check=True, capture_output=True, text=True
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    conn = {
        "conn_type": "vitess",
        "host": values["VITESS_HOST"],
        "port": int(values["VITESS_GRPC_PORT"]),
        "login": values["VITESS_USER"],
        "password": Path(values["VITESS_PASSWORD_FILE"]).read_text().strip(),
        "extra": {"mysql_port": int(values["VITESS_MYSQL_PORT"]), "timeout_seconds": 10},
    }
    # Inherited by the RSS subprocesses.
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(conn)
    return VitessHook(CONN_ID)


def open_stream(hook: VitessHook, responses: str = "bytes") -> Callable[[vtgate_pb2.VStreamRequest], Any]:
    """The reader's stream: response bytes, as the capture runner opens it, or, with
    ``--reader-responses parsed``, messages parsed by gRPC (the path before decoding/wire.py)."""
    if responses == "parsed":
        return lambda request: hook.open_vstream(request, timeout=STREAM_TIMEOUT)
    return lambda request: hook.open_vstream_raw(request, timeout=STREAM_TIMEOUT)


def flags(hook: VitessHook) -> vtgate_pb2.VStreamFlags:
    # What a catch-up run of the capture runner asks for (SyncSpec's default heartbeat).
    return hook.vstream_flags(heartbeat_interval=1)


# -- data ---------------------------------------------------------------------------------


def execute(hook: VitessHook, sql: str, params: dict[str, Any] | list[dict[str, Any]] | None = None) -> None:
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text(sql), params)


def create_tables(hook: VitessHook) -> None:
    drop_tables(hook)
    columns = "(id BIGINT NOT NULL PRIMARY KEY, a INT, b VARCHAR(32), c DECIMAL(10,2), d DATETIME(6))"
    # Not CREATE TABLE ... LIKE: vtgate passes the keyspace-qualified name on to the tablet.
    for table in (TABLE, SEED):
        execute(hook, f"CREATE TABLE {KEYSPACE}.{table} {columns}")
    # Seed rows with varied values (the stream's values are the seed's, ids shifted); 2,000 rows
    # a statement keeps each INSERT well under vtgate's and pymysql's statement limits.
    for first in range(0, SEED_ROWS, 2_000):
        execute(
            hook,
            f"INSERT INTO {KEYSPACE}.{SEED} (id, a, b, c, d) VALUES (:id, :a, :b, :c, :d)",
            [
                {
                    "id": i,
                    "a": (i * 7919) % 2_000_003 - 1_000_000,
                    "b": f"event-{(i * 104729) % 10**9:09d}",
                    "c": f"{(i * 31) % 10**7}.{i % 100:02d}",
                    "d": f"2026-{i % 12 + 1:02d}-{i % 28 + 1:02d} "
                    f"{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{(i * 7777) % 10**6:06d}",
                }
                for i in range(first, min(first + 2_000, SEED_ROWS))
            ],
        )


def drop_tables(hook: VitessHook) -> None:
    for table in (TABLE, SEED):
        execute(hook, f"DROP TABLE IF EXISTS {KEYSPACE}.{table}")


def insert_events(hook: VitessHook, first_id: int, count: int, chunk: int) -> None:
    """``count`` new rows from id ``first_id``: one transaction per ``chunk`` rows.

    Each transaction is one or more server-side ``INSERT ... SELECT`` of at most the seed's
    size, so a ``chunk`` above 20,000 rows makes transactions the assembler spills to disk.
    """
    sql = sqlalchemy.text(
        f"INSERT INTO {KEYSPACE}.{TABLE} (id, a, b, c, d) "
        f"SELECT id + :offset, a, b, c, d + INTERVAL :offset SECOND FROM {KEYSPACE}.{SEED} WHERE id < :n"
    )
    done = 0
    while done < count:
        end = min(done + chunk, count)
        with hook.connect_sql() as conn, conn.begin():
            while done < end:
                n = min(end - done, SEED_ROWS)
                conn.execute(sql, {"offset": first_id + done, "n": n})
                done += n


@dataclass(frozen=True)
class Window:
    name: str
    events: int
    start: Vgtid
    stop: Vgtid


def build_windows(hook: VitessHook, sizes: dict[str, int], chunk: int) -> list[Window]:
    opener = open_stream(hook)
    windows = []
    next_id = 1
    start = capture_stop_position(opener, KEYSPACE)
    for name, count in sizes.items():
        began = time.perf_counter()
        insert_events(hook, next_id, count, chunk)
        next_id += count
        stop = capture_stop_position(opener, KEYSPACE)
        print(f"  {name} window: inserted {count:,} rows in {time.perf_counter() - began:.1f} s", flush=True)
        windows.append(Window(name, count, start, stop))
        start = stop
    return windows


# -- the two sides ------------------------------------------------------------------------


def window_request(hook: VitessHook, start: Vgtid) -> vtgate_pb2.VStreamRequest:
    """Exactly the request WindowReader sends (same filter, flags and tablet type)."""
    reader = VStreamReader(open_stream(hook), vgtid=start, filter=table_filter([TABLE]), flags=flags(hook))
    return reader.build_request(start.to_proto())


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def raw_drain(
    hook: VitessHook, window: Window, pause_us_per_row: float = 0.0, burn_us_per_row: float = 0.0
) -> tuple[int, float, float]:
    """Row changes streamed from start until the VGTID reaches stop; nothing decoded.

    ``pause_us_per_row``: sleep that long per row after each response, a consumer as slow as
    the stager that uses no CPU (tells waiting on the client from competing with it for CPU).
    ``burn_us_per_row``: the other way round, spin that long per row, taking the stager's CPU
    without doing its work.
    """
    stops = {(sg.keyspace, sg.shard): sg.gtid for sg in window.stop.shard_gtids}
    reached: set[tuple[str, str]] = set()
    events = 0
    began, cpu = time.perf_counter(), time.process_time()
    call = hook.open_vstream(window_request(hook, window.start), timeout=STREAM_TIMEOUT)
    try:
        for response in call:
            before = events
            for ev in response.events:
                t = ev.type
                if t == ROW_EVENT:
                    events += len(ev.row_event.row_changes)
                elif t == VGTID_EVENT:
                    for sg in ev.vgtid.shard_gtids:
                        key = (sg.keyspace, sg.shard)
                        if key in stops and key not in reached and position_contains(sg.gtid, stops[key]):
                            reached.add(key)
            if pause_us_per_row:
                time.sleep((events - before) * pause_us_per_row / 1e6)
            if burn_us_per_row:
                _spin((events - before) * burn_us_per_row / 1e6)
            if len(reached) == len(stops):
                break
        else:
            raise RuntimeError("the VStream ended before the window's stop")
    finally:
        cancel = getattr(call, "cancel", None)  # a gRPC call; ends the server side too
        if callable(cancel):
            cancel()
    return events, time.perf_counter() - began, time.process_time() - cpu


def read_and_stage(
    hook: VitessHook, window: Window, workdir: str, responses: str = "bytes"
) -> tuple[int, float, float, ReadResult]:
    """WindowReader into a real WindowStager, manifest written: a catch-up window's staging."""
    began, cpu = time.perf_counter(), time.process_time()
    stager = WindowStager(workdir, "bench", 1, key_columns={TABLE: ["id"]})
    reader = WindowReader(
        open_stream(hook, responses),
        stager,
        keyspace=KEYSPACE,
        tables=[TABLE],
        start=window.start,
        stop=window.stop,
        flags=flags(hook),
    )
    with frozen_heap():  # as the capture runner reads
        result = reader.run()
    manifest = stager.finish(window.start, window.stop, result.end_vgtid, stats=result.stats)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    if manifest.rows != window.events or result.rows != window.events:
        raise RuntimeError(f"{window.name} window: staged {manifest.rows:,} rows, expected {window.events:,}")
    return result.rows, elapsed, cpu, result


# -- peak RSS in a fresh process ----------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kib() -> int:
    hwm = _status_kib("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(spec: dict[str, Any]) -> None:
    """Subprocess side: one reader+stager run; prints its figures as one JSON line."""
    import pyarrow

    hook = VitessHook(CONN_ID)
    hook.get_channel()  # connected before the "before" figure, like the read's own setup
    window = Window(
        spec["name"], spec["events"], Vgtid.from_json(spec["start"]), Vgtid.from_json(spec["stop"])
    )
    rss_before = _status_kib("VmRSS") or 0
    with tempfile.TemporaryDirectory(prefix="bench-window-") as workdir:
        events, seconds, cpu, result = read_and_stage(hook, window, workdir, spec["responses"])
    hook.close()
    print(
        json.dumps(
            {
                "events": events,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "rss_before_kib": rss_before,
                "peak_rss_kib": peak_rss_kib(),
                "arrow_peak_bytes": pyarrow.default_memory_pool().max_memory(),
                "arrow_backend": pyarrow.default_memory_pool().backend_name,
                "merge": result.stats.get("merge", {}),
            }
        )
    )


def measure_in_subprocess(window: Window, responses: str) -> dict[str, Any]:
    spec = {
        "responses": responses,
        "name": window.name,
        "events": window.events,
        "start": window.start.to_json(),
        "stop": window.stop.to_json(),
    }
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], check=True, capture_output=True, text=True
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return figures


# -- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    events: int
    seconds: float
    cpu_seconds: float  # this process, all threads (gRPC's included)
    machine_cores: float | None = None  # average busy cores of the whole machine meanwhile

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def line(self, label: str) -> str:
        machine = f", machine {self.machine_cores:.2f} cores busy" if self.machine_cores is not None else ""
        return (
            f"  {label:<24} {self.events:>10,} events {self.seconds:7.2f} s {self.rate:>10,.0f} ev/s  "
            f"client CPU {self.cpu_seconds:6.2f} s ({self.cpu_seconds / self.events * 1e6:.2f} us/event)"
            f"{machine}"
        )


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (not idle, not waiting on I/O) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def measured(side: Callable[..., tuple[Any, ...]], *args: Any) -> tuple[Run, tuple[Any, ...]]:
    busy = busy_seconds()
    out = side(*args)
    events, seconds, cpu = out[:3]
    return Run(events, seconds, cpu, (busy_seconds() - busy) / seconds), out


def mib(kib: int) -> float:
    return kib / 1024


def summary_line(label: str, measured: str, target: str, ratio: str) -> str:
    return f"  {label:<44} {measured:>16} | {target:>9} | {ratio}"


def each_run(ratios: list[float]) -> str:
    return f"  {'':<44} each run: {' '.join(f'{r:.2f}' for r in sorted(ratios))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows-throughput", type=int, default=1_000_000, help="events of the throughput window"
    )
    parser.add_argument("--rows-small", type=int, default=500_000)
    parser.add_argument("--rows-large", type=int, default=5_000_000)
    parser.add_argument("--chunk", type=int, default=10_000, help="rows per source transaction")
    parser.add_argument(
        "--repeat", type=int, default=5, help="alternating throughput runs of each side (median)"
    )
    parser.add_argument(
        "--reader-responses",
        choices=["bytes", "parsed"],
        default="bytes",
        help="what the reader gets from gRPC: response bytes (the runner's path) or parsed messages",
    )
    parser.add_argument(
        "--cpu-layout",
        choices=[*LAYOUTS, "both"],
        default="both",
        help="throughput with the cluster on the same cores as the benchmark (shared), on cores of "
        "its own (split: as on separate hosts), or both, alternating",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    layouts = list(LAYOUTS) if args.cpu_layout == "both" else [args.cpu_layout]

    command = " ".join([".venv/bin/python", "bench/bench_window.py", *sys.argv[1:]])
    hook = connect()
    print(f"cluster up; creating {KEYSPACE}.{TABLE} and the windows ({args.chunk:,} rows a transaction)")
    try:
        create_tables(hook)
        sizes = {"throughput": args.rows_throughput, "small": args.rows_small, "large": args.rows_large}
        throughput, small, large = build_windows(hook, sizes, args.chunk)

        print(f"\nthroughput on a window of {throughput.events:,} events, sides alternating:", flush=True)
        raw_drain(hook, throughput)  # warm-up: the first read of new binlogs is slower on both sides
        runs: dict[str, tuple[list[Run], list[Run]]] = {layout: ([], []) for layout in layouts}
        slowed: dict[str, list[float]] = {"sleep": [], "spin": []}  # slow raw drains / raw drain
        with tempfile.TemporaryDirectory(prefix="bench-window-") as root:
            for i in range(args.repeat):
                # Layouts alternate too, so a slow minute of the machine hits both alike.
                for layout in layouts:
                    raw_runs, staged_runs = runs[layout]
                    with cpu_layout(layout) as where:
                        if i == 0:
                            print(f"  [{layout}] {where}", flush=True)
                        raw, _ = measured(raw_drain, hook, throughput)
                        if raw.events != throughput.events:
                            raise RuntimeError(
                                f"raw drain counted {raw.events:,} events, expected {throughput.events:,}"
                            )
                        workdir = os.path.join(root, f"{layout}-{i}")
                        staged, out = measured(
                            read_and_stage, hook, throughput, workdir, args.reader_responses
                        )
                    shutil.rmtree(workdir)
                    raw_runs.append(raw)
                    staged_runs.append(staged)
                    print(raw.line(f"[{layout}] {i + 1} raw drain"), flush=True)
                    print(
                        staged.line(f"[{layout}] {i + 1} reader+stager"),
                        f"merge {out[3].stats.get('merge')}",
                        flush=True,
                    )
                    if layout == "shared":
                        # Two raw drains as slow as the stager: one sleeping, one spinning the
                        # CPU the stager took over the raw drain in this very pair.
                        burn_us = max(0.0, (staged.cpu_seconds - raw.cpu_seconds) / staged.events * 1e6)
                        paced, _ = measured(raw_drain, hook, throughput, PACE_US)
                        burned, _ = measured(raw_drain, hook, throughput, 0.0, burn_us)
                        print(paced.line(f"  raw drain + {PACE_US:g} us/row sleep"), flush=True)
                        print(burned.line(f"  raw drain + {burn_us:.2f} us/row spin"), flush=True)
                        slowed["sleep"].append(paced.rate / raw.rate)
                        slowed["spin"].append(burned.rate / raw.rate)

        print("\npeak RSS of reader+stager, each window in a fresh process:", flush=True)
        rss: dict[str, dict[str, Any]] = {}
        for window in (small, large):
            figures = rss[window.name] = measure_in_subprocess(window, args.reader_responses)
            run = Run(figures["events"], figures["seconds"], figures["cpu_seconds"])
            print(run.line(window.name))
            print(
                f"  {'':<24} RSS before the read {mib(figures['rss_before_kib']):.0f} MiB, "
                f"peak {mib(figures['peak_rss_kib']):.0f} MiB; pyarrow pool peak "
                f"{figures['arrow_peak_bytes'] / 2**20:.0f} MiB ({figures['arrow_backend']}); "
                f"merge {figures['merge']}",
                flush=True,
            )
    finally:
        drop_tables(hook)
        hook.close()

    small_peak, large_peak = rss["small"]["peak_rss_kib"], rss["large"]["peak_rss_kib"]
    rss_ratio = large_peak / small_peak
    added_small = small_peak - rss["small"]["rss_before_kib"]
    added_large = large_peak - rss["large"]["rss_before_kib"]
    print(f"\nsummary (medians of {args.repeat} alternating runs; ratio = measured / target)")
    print(summary_line("figure", "measured", "target", "ratio"))
    for layout, (raw_runs, staged_runs) in runs.items():
        pair_ratios = [s.rate / r.rate for r, s in zip(raw_runs, staged_runs, strict=True)]
        ratio = statistics.median(pair_ratios)
        print(
            summary_line(
                f"[{layout}] raw drain, {throughput.events:,} events",
                f"{statistics.median(r.rate for r in raw_runs):,.0f} ev/s",
                "-",
                "-",
            )
        )
        print(
            summary_line(
                f"[{layout}] reader+stager, same window",
                f"{statistics.median(s.rate for s in staged_runs):,.0f} ev/s",
                "-",
                "-",
            )
        )
        print(
            summary_line(
                f"[{layout}] reader+stager / raw drain",
                f"{ratio:.2f}",
                f">= {RATIO_TARGET}",
                f"{ratio / RATIO_TARGET:.2f} ({'met' if ratio >= RATIO_TARGET else 'missed'})",
            )
        )
        print(each_run(pair_ratios))
    for how, label in (("sleep", f"sleeping {PACE_US:g} us/row"), ("spin", "spinning stager CPU")):
        if slowed[how]:
            print(
                summary_line(
                    f"[shared] raw drain {label} / raw",
                    f"{statistics.median(slowed[how]):.2f}",
                    "-",
                    "-",
                )
            )
            print(each_run(slowed[how]))
    print(summary_line(f"peak RSS, {small.events:,}-event window", f"{mib(small_peak):,.0f} MiB", "-", "-"))
    print(summary_line(f"peak RSS, {large.events:,}-event window", f"{mib(large_peak):,.0f} MiB", "-", "-"))
    print(
        summary_line(
            "peak RSS large / small",
            f"{rss_ratio:.2f}x",
            f"<= {RSS_TARGET}x",
            f"{rss_ratio / RSS_TARGET:.2f} ({'met' if rss_ratio <= RSS_TARGET else 'missed'})",
        )
    )
    print(
        summary_line(
            "RSS added by the read (peak - before), s / l",
            f"{mib(added_small):,.0f} / {mib(added_large):,.0f} MiB",
            "-",
            f"{added_large / max(added_small, 1):.2f}x",
        )
    )
    print(f"  command: {command}")


if __name__ == "__main__":
    main()
