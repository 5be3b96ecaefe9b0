"""Benchmark: our snapshot and catch-up window next to Debezium's Vitess connector.

    .venv/bin/python bench/bench_peers.py [--rows 1000000] [--repeat 3] [--heap 512m]
                                          [--chunk 10000] [--phases snapshot,streaming]
                                          [--peer-set KEY=VALUE ...]

``make bench-peers`` runs it with the defaults. It builds ``bench/peers/`` (a small Java harness:
Debezium's embedded engine with ``debezium-connector-vitess``, both from Maven Central, offsets in
Kafka Connect's in-memory store; installs a JDK and Maven from Debian first if they are missing;
Maven's local repository is a cache dir, so a rerun downloads nothing), starts (or reuses) the
cluster of ``dev/local_vitess.sh`` and connects as ``bench/bench_window.py`` does. Then, on
``commerce.bench_events`` (bench_window's 5-column table, ``--rows`` rows):

1. **Snapshot.** Ours: ``CaptureRunner.snapshot()`` of a new sync (``bench_snapshot.snapshot``:
   everything a first sync does, to Parquet). Debezium: ``snapshot.mode=initial``, until the
   table's ``--rows`` copy records have arrived (the copy's records come as ``op=c``).
2. **Streaming.** A burst of ``--rows`` single-row-change UPDATEs (``--chunk`` rows a
   transaction) between two captured positions. Ours: the catch-up window over it
   (``bench_window.read_and_stage``: ``WindowReader`` into a ``WindowStager``, manifest
   written). Debezium: ``snapshot.mode=never`` with ``vitess.shard`` and ``vitess.vgtid`` set to
   the window's start (the connector ignores the VGTID without the shard), until ``--rows``
   ``op=u`` records have arrived.

Each phase: one warm-up raw drain (the first read of the data is slower for whoever comes
first), then ``--repeat`` rounds, each running a raw drain (the same VStream request counted and
dropped, nothing decoded: the most any client of this vtgate reaches in that round), ours,
Debezium with a consumer that serializes every record's value with Kafka Connect's
``JsonConverter`` (schemas included, as a Kafka deployment's default converter does: the least it
pays per record) and Debezium with a consumer that only counts, in that order. Debezium runs with
the connector's defaults (its throughput knobs measured no faster here; ``--peer-set KEY=VALUE``
sets one) in a fresh JVM each time (``-Xmx`` =
``--heap``; the JVM sees the machine's cores, not limited further); its time and CPU are from the
engine's start to the last expected record (JVM start-up excluded, printed apart), its peak RSS
the JVM's VmHWM. Ours is timed in this process (client CPU: all its threads); its peak RSS is
measured in a fresh process (bench_snapshot's and bench_window's RSS children). The summary gives
medians and per-round ratios, median: ours / Debezium in rows/s and Debezium / ours in CPU
seconds per row (issue 42's targets: >= 10x Debezium+JSON in both, in both phases), and the raw
drain / Debezium+JSON in rows/s, the ceiling of the rows/s ratio. The table is dropped at the
end (also on failure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import bench_snapshot as bs  # noqa: E402  (bench/, the script's own directory)
import bench_window as bw  # noqa: E402
import sqlalchemy  # noqa: E402

from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from airflow_provider_vitess.vstream.window import capture_stop_position  # noqa: E402

PEER_DIR = REPO / "bench" / "peers"
PEER_MAIN = "bench.peers.DebeziumPeer"
KEYSPACE = bw.KEYSPACE
SHARD = "0"  # commerce is unsharded
# Issue 42's targets, in both phases, against Debezium+JSON: our rows/s over its rows/s, and its
# CPU seconds per row over ours.
SPEED_TARGET = 10.0
CPU_TARGET = 10.0
DEBIAN_PACKAGES = ("openjdk-17-jdk-headless", "maven")
# "raw drain" is no reader: the same VStream request counted and dropped (nothing decoded), each
# round, the most any client of this vtgate could reach in that round.
SIDES = ("raw drain", "ours", "debezium+json", "debezium count-only")
# The connector runs with its defaults: its documentation's throughput knobs (max.batch.size,
# max.queue.size, poll.interval.ms) measured no faster here (bench/README.md, 2026-12-06: larger
# batches were slower, 33,788 vs 45,044 rows/s streaming). --peer-set tries others.


# -- the Java harness ---------------------------------------------------------------------


def maven_repo() -> Path:
    """Maven's local repository, in the project's cache dir (as dev/vitess/common.sh picks it)."""
    if os.environ.get("VITESS_CACHE_DIR"):
        cache = Path(os.environ["VITESS_CACHE_DIR"])
    elif os.geteuid() == 0:
        cache = Path("/var/cache/airflow-provider-vitess")
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-provider-vitess"
    return cache / "m2"


def ensure_jdk() -> None:
    """A JDK 17 and Maven from Debian, if this machine has none (a bare machine)."""
    if shutil.which("mvn") and shutil.which("java"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    print(f"installing {' and '.join(DEBIAN_PACKAGES)} from Debian", flush=True)
    subprocess.run([*sudo, "apt-get", "update", "-q"], check=True)
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *DEBIAN_PACKAGES],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def build() -> str:
    """``mvn package`` of bench/peers; returns the harness's classpath."""
    ensure_jdk()
    began = time.perf_counter()
    classpath_file = PEER_DIR / "target" / "classpath.txt"
    done = subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            f"-Dmaven.repo.local={maven_repo()}",
            "-f",
            str(PEER_DIR / "pom.xml"),
            "package",
            "dependency:build-classpath",
            f"-Dmdep.outputFile={classpath_file}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"building bench/peers failed (mvn exit {done.returncode}); Maven said:\n"
            f"{done.stdout[-4000:]}{done.stderr[-4000:]}\nRemedy: Maven Central must be reachable "
            f"for the first build; the jars are then cached in {maven_repo()}."
        )
    jar = next((PEER_DIR / "target").glob("debezium-peer-*.jar"))
    print(f"built bench/peers in {time.perf_counter() - began:.1f} s", flush=True)
    return f"{jar}{os.pathsep}{classpath_file.read_text().strip()}"


@dataclass(frozen=True)
class Peer:
    classpath: str
    heap: str
    conn: dict[str, Any]  # the Airflow connection bench_window.connect() defined
    settings: dict[str, str]  # --peer-set's connector properties (none: its defaults)

    def properties(self, snapshot_mode: str, vgtid: str | None) -> dict[str, str]:
        props = {
            "name": "bench-peer",
            "connector.class": "io.debezium.connector.vitess.VitessConnector",
            "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            "offset.flush.interval.ms": "60000",
            "topic.prefix": "bench",
            "database.hostname": str(self.conn["host"]),
            "database.port": str(self.conn["port"]),
            "database.user": str(self.conn["login"]),
            "database.password": str(self.conn["password"]),
            "vitess.keyspace": KEYSPACE,
            "vitess.shard": SHARD,
            "table.include.list": f"{KEYSPACE}.{bw.TABLE}",
            "snapshot.mode": snapshot_mode,
            **self.settings,
        }
        if vgtid is not None:
            props["vitess.vgtid"] = vgtid
        return props

    def run(self, snapshot_mode: str, vgtid: str | None, rows: int, consumer: str) -> dict[str, Any]:
        """One engine run in a fresh JVM until ``rows`` change records; its JSON figures."""
        with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
            config = Path(tmp) / "connector.properties"
            # The password goes in a file only this user reads, never on a command line.
            fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                for key, value in self.properties(snapshot_mode, vgtid).items():
                    f.write(f"{key}={_escape(value)}\n")
            command = [
                "java",
                f"-Xmx{self.heap}",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                self.classpath,
                PEER_MAIN,
                str(config),
                str(rows),
                consumer,
            ]
            began = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
            wall = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(
                f"the Debezium harness failed (exit {done.returncode}, snapshot.mode={snapshot_mode}, "
                f"{consumer}):\n{done.stderr[-6000:]}"
            )
        figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        figures["process_seconds"] = wall
        if figures["records"] != rows:
            raise RuntimeError(f"Debezium counted {figures['records']:,} records, expected {rows:,}")
        return figures


def _escape(value: str) -> str:
    # java.util.Properties: backslash is the escape character; the rest of our values are plain.
    return value.replace("\\", "\\\\")


# -- data: the update burst ---------------------------------------------------------------


def update_burst(hook: VitessHook, rows: int, chunk: int) -> bw.Window:
    """``rows`` single-row changes between two captured positions: UPDATEs of ids 1..rows,
    ``chunk`` rows a transaction (the table holds ids 1..rows)."""
    opener = bw.open_stream(hook)
    start = capture_stop_position(opener, KEYSPACE)
    began = time.perf_counter()
    sql = sqlalchemy.text(
        f"UPDATE {KEYSPACE}.{bw.TABLE} SET a = a + 1, d = d + INTERVAL 1 SECOND WHERE id BETWEEN :lo AND :hi"
    )
    for lo in range(1, rows + 1, chunk):
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(sql, {"lo": lo, "hi": min(lo + chunk - 1, rows)})
    stop = capture_stop_position(opener, KEYSPACE)
    print(f"  update burst: {rows:,} rows updated in {time.perf_counter() - began:.1f} s", flush=True)
    return bw.Window("update burst", rows, start, stop)


# -- rounds -------------------------------------------------------------------------------


def peer_run(figures: dict[str, Any]) -> bw.Run:
    return bw.Run(figures["records"], figures["seconds"], figures["cpu_seconds"])


def peer_line(label: str, figures: dict[str, Any]) -> str:
    return (
        f"{peer_run(figures).line(label)}, peak RSS {bw.mib(figures['peak_rss_kib']):.0f} MiB, "
        f"first record after {figures['first_record_seconds']:.1f} s, "
        f"JVM process {figures['process_seconds']:.1f} s, ops {figures['ops']}"
        + (
            f", JSON {figures['json_bytes'] / figures['records']:.0f} B/record"
            if figures["json_bytes"]
            else ""
        )
    )


@dataclass
class Phase:
    name: str
    runs: dict[str, list[bw.Run]]
    peaks_kib: dict[str, list[int]]


def run_phase(
    name: str,
    repeat: int,
    drain: Any,
    ours: Any,
    peer: Peer,
    snapshot_mode: str,
    vgtid: str | None,
    rows: int,
) -> Phase:
    phase = Phase(name, {side: [] for side in SIDES}, {side: [] for side in SIDES})
    for i in range(repeat):
        for side, call in (("raw drain", drain), ("ours", ours)):
            run, _ = bw.measured(call, i)
            if run.events != rows:
                raise RuntimeError(f"{side} ({name}) counted {run.events:,} rows, expected {rows:,}")
            phase.runs[side].append(run)
            print(run.line(f"[{name}] {i + 1} {side}"), f"| {bs.uptime()}", flush=True)
        for side, consumer in (("debezium+json", "json"), ("debezium count-only", "count")):
            figures = peer.run(snapshot_mode, vgtid, rows, consumer)
            phase.runs[side].append(peer_run(figures))
            phase.peaks_kib[side].append(figures["peak_rss_kib"])
            print(peer_line(f"[{name}] {i + 1} {side}", figures), flush=True)
    return phase


def _ratio_line(label: str, ratios: list[float], target: float | None, note: str = "-") -> list[str]:
    ratio = statistics.median(ratios)
    verdict = note if target is None else f"{ratio / target:.2f} ({'met' if ratio >= target else 'missed'})"
    shown = "-" if target is None else f">= {target:g}x"
    return [bw.summary_line(label, f"{ratio:.2f}x", shown, verdict), bw.each_run(ratios)]


def summary(phase: Phase, rows: int) -> list[str]:
    ours, drain = phase.runs["ours"], phase.runs["raw drain"]
    lines = []
    for side in SIDES:
        runs = phase.runs[side]
        rate = statistics.median(r.rate for r in runs)
        cpu = statistics.median(r.cpu_seconds / r.events * 1e6 for r in runs)
        peaks = phase.peaks_kib[side]
        peak = f", peak RSS {bw.mib(int(statistics.median(peaks))):.0f} MiB" if peaks else ""
        lines.append(
            bw.summary_line(
                f"[{phase.name}] {side}, {rows:,} rows",
                f"{rate:,.0f} rows/s",
                "-",
                f"CPU {cpu:.1f} us/row{peak}",
            )
        )
    lines += _ratio_line(
        f"[{phase.name}] ours / raw drain, rows/s",
        [o.rate / d.rate for o, d in zip(ours, drain, strict=True)],
        None,
    )
    for side in SIDES[2:]:
        peer = phase.runs[side]
        json_side = side == "debezium+json"
        lines += _ratio_line(
            f"[{phase.name}] ours / {side}, rows/s",
            [o.rate / d.rate for o, d in zip(ours, peer, strict=True)],
            SPEED_TARGET if json_side else None,
        )
        lines += _ratio_line(
            f"[{phase.name}] {side} / ours, CPU per row",
            [
                (d.cpu_seconds / d.events) / (o.cpu_seconds / o.events)
                for o, d in zip(ours, peer, strict=True)
            ],
            CPU_TARGET if json_side else None,
        )
        if json_side:
            # No reader of this vtgate passes the raw drain: its rate over the peer's bounds the
            # rows/s ratio any client could show in the same round.
            lines += _ratio_line(
                f"[{phase.name}] raw drain / {side}, rows/s",
                [r.rate / d.rate for r, d in zip(drain, peer, strict=True)],
                None,
                note=f"the ceiling of ours / {side}",
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table and the update burst")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per phase (median)")
    parser.add_argument("--chunk", type=int, default=10_000, help="rows per loading/updating transaction")
    parser.add_argument("--heap", default="512m", help="the JVM's -Xmx")
    parser.add_argument("--phases", default="snapshot,streaming", help="snapshot, streaming or both")
    parser.add_argument(
        "--peer-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a connector property instead of its default (repeatable), e.g. max.batch.size=4096",
    )
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - {"snapshot", "streaming"}:
        parser.error("--phases: snapshot, streaming or both, comma-separated")

    command = " ".join([".venv/bin/python", "bench/bench_peers.py", *sys.argv[1:]])
    classpath = build()
    hook = bw.connect()
    conn = json.loads(os.environ[f"AIRFLOW_CONN_{bw.CONN_ID.upper()}"])
    settings: dict[str, str] = {}
    for item in args.peer_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--peer-set takes KEY=VALUE, not {item!r}")
        settings[key.strip()] = value.strip()
    peer = Peer(classpath, args.heap, conn, settings)
    print(f"cluster up; Debezium's settings: {settings or 'its defaults'}; {bs.uptime()}", flush=True)
    results: list[Phase] = []
    rss: dict[str, dict[str, Any]] = {}
    try:
        bs.load(hook, KEYSPACE, args.rows, args.chunk)
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as root:
            if "snapshot" in phases:
                bs.new_store(root)
                bs.raw_drain(hook, KEYSPACE)  # warm-up
                results.append(
                    run_phase(
                        "snapshot",
                        args.repeat,
                        lambda _: bs.raw_drain(hook, KEYSPACE),
                        lambda i: bs.snapshot(hook, KEYSPACE, root, f"bench-{i}"),
                        peer,
                        "initial",
                        None,
                        args.rows,
                    )
                )
                rss["snapshot"] = bs.measure_rss(KEYSPACE, root)
            if "streaming" in phases:
                window = update_burst(hook, args.rows, args.chunk)
                bw.raw_drain(hook, window)  # warm-up
                results.append(
                    run_phase(
                        "streaming",
                        args.repeat,
                        lambda _: bw.raw_drain(hook, window),
                        lambda i: bw.read_and_stage(hook, window, os.path.join(root, f"window-{i}"))[:3],
                        peer,
                        "never",
                        window.start.to_json(),
                        args.rows,
                    )
                )
                rss["streaming"] = bw.measure_in_subprocess(window, "bytes")
    finally:
        bw.drop_tables(hook)
        hook.close()

    print(
        f"\nsummary (medians of {args.repeat} rounds; Debezium's JVM -Xmx{args.heap}, "
        f"settings {settings or 'the defaults'}; {bs.uptime()})"
    )
    print(bw.summary_line("figure", "measured", "target", "ratio"))
    for phase in results:
        phase.peaks_kib["ours"] = [rss[phase.name]["peak_rss_kib"]]
        for line in summary(phase, args.rows):
            print(line)
    print(f"  command: {command}")


if __name__ == "__main__":
    main()
