"""Benchmark: one catch-up window of a 4-shard keyspace read by 1, 2 and 4 shard groups (not a
test; prints figures). Issue 31.

    .venv/bin/python bench/bench_groups.py [--rows 1000000] [--chunk 20000]

1. **Cluster.** The four-shard cluster of ``dev/vitess_topology.sh`` (layout ``shards4``:
   keyspace ``sharded``, shards -40,40-80,80-c0,c0-, one primary each; started or reused as the
   tests do, ``tests/support/topology.py``). ``sharded.bench_groups`` (id BIGINT PK, a INT,
   b VARCHAR(32), c DECIMAL(10,2), d DATETIME(6); hash vindex on id) is created afresh.
2. **Syncs.** For each group count N (1, 2, 4), one sync of the table (its own SQLite checkpoint
   store and staging directory) is snapshotted while the table is empty (its window recorded
   merged and committed without a Delta target: nothing here merges). Then ``--rows`` rows go
   in once (server-side ``INSERT ... SELECT`` of ``--chunk`` rows from a seed table), so every
   sync's next window holds the same changes, spread over the four shards by the hash vindex.
3. **Reads.** Each sync plans its window with ``capture_parallelism=N`` (``GroupedCatchUp.plan``,
   the stop taken once) and each group is read by ``GroupedCatchUp.read_group`` in a fresh
   subprocess, one group at a time (so a group's figures are its own, not its share of two
   cores): its CPU seconds for the read (user+system of all its threads, imports excluded), its
   wall time, its peak RSS (``VmHWM``) and its rows. The table prints per N each group's figures,
   their sum and the largest group's share of the sum (1/N is the ideal), and the CPU seconds
   of vtgate and of the tablets+mysqld during the reads, per million rows.
4. The tables are dropped at the end (also on failure).

Wall time on this 2-core machine cannot show N workers' speed-up (vtgate, the tablets, MariaDB
and the readers share the cores); the per-group CPU split and vtgate's CPU per million rows are
what the model in bench/README.md is built from.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import sqlalchemy  # noqa: E402

from airflow_provider_vitess.capture.groups import GroupedCatchUp  # noqa: E402
from airflow_provider_vitess.capture.runner import CaptureRunner  # noqa: E402
from airflow_provider_vitess.capture.spec import SyncSpec  # noqa: E402
from airflow_provider_vitess.checkpoints import CheckpointStore  # noqa: E402
from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402

KEYSPACE = "sharded"
TABLE = "bench_groups"
SEED = "bench_groups_seed"
SEED_ROWS = 10_000
CONN_ID = "vitess_bench_groups"
GROUP_COUNTS = (1, 2, 4)


def _execute(hook: VitessHook, *statements: str) -> None:
    with hook.connect_sql() as conn:
        for sql in statements:
            conn.execute(sqlalchemy.text(sql))
        conn.commit()


def _create_tables(hook: VitessHook) -> None:
    _drop_tables(hook)
    columns = "id BIGINT NOT NULL PRIMARY KEY, a INT, b VARCHAR(32), c DECIMAL(10,2), d DATETIME(6)"
    for table in (TABLE, SEED):
        _execute(hook, f"CREATE TABLE {KEYSPACE}.{table} ({columns})")
        try:  # the vschema outlives a dropped table
            _execute(hook, f"ALTER VSCHEMA ON {KEYSPACE}.{table} ADD VINDEX hash(id) USING hash")
        except sqlalchemy.exc.DBAPIError as exc:
            if "already" not in str(exc):
                raise
    rows = ", ".join(f"({i}, {i % 97}, 'seed row {i}', {i % 1000}.25, NOW(6))" for i in range(SEED_ROWS))
    _execute(hook, f"INSERT INTO {KEYSPACE}.{SEED} (id, a, b, c, d) VALUES {rows}")


def _drop_tables(hook: VitessHook) -> None:
    _execute(hook, *(f"DROP TABLE IF EXISTS {KEYSPACE}.{t}" for t in (TABLE, SEED)))


def _insert_rows(hook: VitessHook, rows: int, chunk: int) -> None:
    """``rows`` new rows, ``chunk`` per transaction, copied server side from the seed (ids offset
    per pass: every pass lands on all four shards)."""
    done = 0
    while done < rows:
        n = min(chunk, rows - done)
        for offset in range(0, n, SEED_ROWS):
            take = min(SEED_ROWS, n - offset)
            base = done + offset + 1
            _execute(
                hook,
                f"INSERT INTO {KEYSPACE}.{TABLE} (id, a, b, c, d) SELECT id + {base}, a, b, c, d "
                f"FROM {KEYSPACE}.{SEED} WHERE id < {take}",
            )
        done += n


def _spec(root: Path, n: int) -> SyncSpec:
    return SyncSpec(f"bench-groups-{n}", KEYSPACE, (TABLE,), str(root / f"stage-{n}"))


def _store(root: Path, n: int) -> CheckpointStore:
    return CheckpointStore(f"sqlite:///{root}/store-{n}.db")


def _cluster_cpu(state_dir: Path) -> dict[str, float]:
    """CPU seconds so far of the cluster's processes (those whose command line names its state
    directory): vtgate apart from the rest (vttablets, mysqld, topo)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"vtgate": 0.0, "tablets+mysqld": 0.0}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(state_dir) not in cmdline:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        out["vtgate" if "vtgate" in cmdline.split(" ", 1)[0] else "tablets+mysqld"] += seconds
    return out


def _read_in_child(root: Path, n: int, group: int, env: dict[str, str]) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", json.dumps({"root": str(root), "n": n, "group": group})]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"group {group} of {n} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def child(arg: str) -> None:
    """One group's read, measured in this process: CPU and wall of ``read_group`` alone."""
    given = json.loads(arg)
    root, n, group = Path(given["root"]), int(given["n"]), int(given["group"])
    grouped = GroupedCatchUp(VitessHook(CONN_ID), _store(root, n), _spec(root, n), holder=f"group {group}")
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    done = grouped.read_group(group)
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_SELF)
    hwm = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({**done, "cpu": cpu, "wall": wall, "peak_rss": hwm}))


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def run(rows: int, chunk: int) -> None:
    from tests.support.local import connection_uri_env
    from tests.support.topology import four_shard_cluster_running

    with four_shard_cluster_running() as cluster, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        name, value = connection_uri_env(CONN_ID, cluster.vitess)
        os.environ[name] = value
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        hook = VitessHook(CONN_ID)
        _create_tables(hook)
        try:
            for n in GROUP_COUNTS:
                store = _store(root, n)
                store.migrate()
                seq = CaptureRunner(hook, store, _spec(root, n), holder="snapshot").snapshot().seq
                # The empty table's snapshot is taken for merged: the bench reads, it merges nothing.
                store.mark_merged(_spec(root, n).sync_id, seq)
                store.commit(_spec(root, n).sync_id, seq)
            started = time.monotonic()
            _insert_rows(hook, rows, chunk)
            print(f"{rows:,} rows inserted in {time.monotonic() - started:.0f}s over {cluster.shards}")
            results: dict[int, tuple[list[dict[str, Any]], dict[str, float]]] = {}
            for n in GROUP_COUNTS:
                groups = GroupedCatchUp(hook, _store(root, n), _spec(root, n), holder="plan").plan(n)
                cpu_before = _cluster_cpu(cluster.state_dir)
                parts = [_read_in_child(root, n, g, env) for g in groups]
                cpu_after = _cluster_cpu(cluster.state_dir)
                results[n] = (parts, {k: cpu_after[k] - cpu_before[k] for k in cpu_after})
            _report(rows, results)
        finally:
            _drop_tables(hook)
            hook.close()


def _report(rows: int, results: dict[int, tuple[list[dict[str, Any]], dict[str, float]]]) -> None:
    print()
    print("| groups | group | shards | rows | CPU s | CPU s / M rows | wall s | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for n, (parts, _) in results.items():
        for p in parts:
            per_m = p["cpu"] / max(p["rows"], 1) * 1e6
            shards = ",".join(p.get("shards", ["all"]))
            print(
                f"| {n} | {p['group']} | {shards} | {p['rows']:,} | {p['cpu']:.2f} | {per_m:.2f} | "
                f"{p['wall']:.1f} | {_mib(p['peak_rss'])} |"
            )
    print()
    print(
        "| groups | rows read | CPU s, sum | largest group's share (ideal 1/N) | slowest group wall s | "
        "vtgate CPU s / M rows | tablets+mysqld CPU s / M rows |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, (parts, cluster_cpu) in results.items():
        total_rows = sum(p["rows"] for p in parts)
        total_cpu = sum(p["cpu"] for p in parts)
        share = max(p["cpu"] for p in parts) / total_cpu if total_cpu else 0.0
        per_m = 1e6 / max(total_rows, 1)
        print(
            f"| {n} | {total_rows:,} | {total_cpu:.2f} | {share:.2f} (1/{n} = {1 / n:.2f}) | "
            f"{max(p['wall'] for p in parts):.1f} | {cluster_cpu['vtgate'] * per_m:.2f} | "
            f"{cluster_cpu['tablets+mysqld'] * per_m:.2f} |"
        )
        if total_rows != rows:
            print(f"  !! {n} groups read {total_rows:,} rows, not {rows:,}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=20_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
    else:
        run(args.rows, args.chunk)


if __name__ == "__main__":
    main()
