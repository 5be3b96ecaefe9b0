"""Where a command's CPU goes: runs it and prints the CPU seconds the machine's processes spent
while it ran, summed by kind of process (a merge's spark-submit JVM, the pytest worker's JVM, the
warm DAG runner, vtcombo, ...), next to the machine's busy and idle time. Then each test's merges
through spark-submit: how many and their CPU seconds, the test being the one its pytest-xdist worker
was running when the merge started (the worker's process title names it; ``-n 0`` runs show none).
Last, each kind of JVM's CPU by thread: the JIT compilers (C2, C1), garbage collection and the VM's
own threads, the rest (Spark's work, and threads that ended between two samples).

    .venv/bin/python bench/cpu_by_process.py -- make test
    .venv/bin/python bench/cpu_by_process.py --out cpu.txt -- .venv/bin/pytest -n 2 tests/integration/merge

Every process is sampled twice a second from ``/proc`` (its own user and system time, all its
threads): a process that lives less than half a second is missed, so the kinds add up to a little
less than the busy time. A process is counted from its first sample (one that started before the
command: only what it spent meanwhile). Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

MERGE = "JVM of a merge's spark-submit"
_RUNNING = "[pytest-xdist running] "  # a pytest-xdist worker's process title, then the test's node id


# (a substring of the command line, its kind): the first that matches names the process.
KINDS: tuple[tuple[str, str], ...] = (
    ("pyspark-shell", "JVM of a test process's SparkSession (and its Connect server)"),
    ("SparkConnectServer", "JVM of a Spark Connect server"),
    ("--plan-file", MERGE),  # the merge job's argument (merge_backends.py)
    ("spark_jobs", MERGE),
    ("org.apache.spark.deploy", "JVM of another spark-submit"),
    ("debezium", "Debezium"),
    ("tests.support.run_dag", "warm DAG runner (dag.test())"),
    ("capture_child", "capture child process"),
    ("merge_child", "merge child process"),
    ("xdist", "pytest worker"),
    ("pytest", "pytest"),
    ("airflow worker", "Airflow task (executor's worker)"),
    ("bin/airflow", "Airflow CLI or service"),
    ("pyspark.daemon", "PySpark Python worker"),
    ("pyspark/daemon", "PySpark Python worker"),
)
BINARIES = ("vtcombo", "vtgate", "vttablet", "vtctld", "etcd", "mariadbd", "mysqld", "postgres", "versitygw")


@dataclass
class Process:
    kind: str
    comm: str
    ticks: int
    before: int  # ticks spent before the first sample of a process already running at the start
    merge: tuple[str, str] | None = None  # a merge's (plan file, test that started it)
    # A JVM's threads: thread id -> (its kind, its ticks at its last sample).
    threads: dict[str, tuple[str, int]] = field(default_factory=dict)


# A JVM thread's name prefix (HotSpot's), and its kind: the rest of a JVM's CPU is "other".
THREAD_KINDS: tuple[tuple[str, str], ...] = (
    ("C2 CompilerThre", "C2 JIT"),
    ("C1 CompilerThre", "C1 JIT"),
    ("GC Thread", "GC and VM"),
    ("G1 ", "GC and VM"),
    ("VM Thread", "GC and VM"),
    ("VM Periodic", "GC and VM"),
)


def kind_of(argv: list[str], comm: str) -> str:
    line = " ".join(argv)
    for needle, kind in KINDS:
        if needle in line:
            return kind
    name = Path(argv[0]).name if argv else comm
    for binary in BINARIES:
        if name.startswith(binary):
            return binary
    if name == "java":
        return "JVM, other"
    if name.startswith("python"):
        return "Python, other"
    return name or comm


def _read(pid: str) -> tuple[str, str, int, str] | None:
    """(start time, command name, user + system ticks, parent pid) of a process, or None if it
    is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    close = stat.rindex(")")
    fields = stat[close + 2 :].split()  # from field 3 (state) on
    return fields[19], stat[stat.index("(") + 1 : close], int(fields[11]) + int(fields[12]), fields[1]


def _argv(pid: str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def running_test(pid: str) -> str:
    """The test a pytest-xdist worker among the process's ancestors is running, else ``""``."""
    for _ in range(12):
        read = _read(pid)
        if read is None:
            return ""
        pid = read[3]
        if pid in ("0", "1"):
            return ""
        title = " ".join(_argv(pid) or [])
        if title.startswith(_RUNNING):
            return title[len(_RUNNING) :].split(" ")[0]
    return ""


def _merge_of(argv: list[str], pid: str) -> tuple[str, str] | None:
    if "--plan-file" not in argv[:-1]:
        return None
    return argv[argv.index("--plan-file") + 1], running_test(pid)


def _sample_threads(pid: str, process: Process) -> None:
    """A JVM's threads, each with its kind and CPU so far (a thread that ends keeps its last)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        read = _read(f"{pid}/task/{tid}")
        if read is not None:
            name = read[1]
            kind = next((k for prefix, k in THREAD_KINDS if name.startswith(prefix)), "other")
            process.threads[tid] = (kind, read[2])


def sample(seen: dict[tuple[str, str], Process], first: bool) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        read = _read(pid)
        if read is None:
            continue
        start, comm, ticks, _ = read
        known = seen.get((pid, start))
        # A changed name is an exec (spark-submit's shell becoming its JVM): classified again.
        if known is not None and known.comm == comm:
            known.ticks = ticks
            if comm == "java" and not known.before:
                _sample_threads(pid, known)
            continue
        argv = _argv(pid)
        if argv is None:
            continue
        before = ticks if first else (known.before if known else 0)
        merge = (known.merge if known else None) or _merge_of(argv, pid)
        seen[(pid, start)] = Process(kind_of(argv, comm), comm, ticks, before, merge)


def machine_ticks() -> tuple[int, int]:
    """(busy, idle) ticks of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    return sum(values) - idle, idle


def merges_by_test(seen: dict[tuple[str, str], Process]) -> list[str]:
    """A line per test that merged through spark-submit: its CPU s and number of merges (plan
    files; a merge's shell and JVM are one), most CPU first."""
    seconds: defaultdict[str, float] = defaultdict(float)
    plans: defaultdict[str, set[str]] = defaultdict(set)
    for process in seen.values():
        if process.merge is not None:
            plan, test = process.merge
            test = test or "(no pytest-xdist worker)"
            seconds[test] += (process.ticks - process.before) / TICK
            plans[test].add(plan)
    lines = [f"{'CPU s':>8}  {'merges':>6}  test (spark-submit merges)"]
    for test, cpu in sorted(seconds.items(), key=lambda item: -item[1]):
        lines.append(f"{cpu:8.1f}  {len(plans[test]):6d}  {test}")
    total = sum(len(p) for p in plans.values())
    lines.append(f"{sum(seconds.values()):8.1f}  {total:6d}  in all")
    return lines


def jvm_threads(seen: dict[tuple[str, str], Process]) -> list[str]:
    """A line per kind of JVM started during the command: its CPU s by kind of thread."""
    columns = ("C2 JIT", "C1 JIT", "GC and VM", "other")
    ticks: defaultdict[str, Counter[str]] = defaultdict(Counter)
    jvms: Counter[str] = Counter()
    for process in seen.values():
        if not process.threads:
            continue
        named: Counter[str] = Counter()
        for thread_kind, thread_ticks in process.threads.values():
            if thread_kind != "other":
                named[thread_kind] += thread_ticks
        named["other"] = process.ticks - sum(named.values())  # ended threads' CPU too
        ticks[process.kind].update(named)
        jvms[process.kind] += 1
    header = "  ".join(f"{c:>10}" for c in columns)
    lines = [f"{'CPU s':>8}  {header}  {'JVMs':>4}  kind (by thread)"]
    for kind, by_thread in sorted(ticks.items(), key=lambda item: -sum(item[1].values())):
        total = max(sum(by_thread.values()), 1)
        cells = "  ".join(f"{by_thread[c] / TICK:6.0f} {by_thread[c] / total:3.0%}" for c in columns)
        lines.append(f"{total / TICK:8.1f}  {cells}  {jvms[kind]:4d}  {kind}")
    return lines


def report(seen: dict[tuple[str, str], Process], busy: int, idle: int, wall: float) -> str:
    by_kind: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for process in seen.values():
        by_kind[process.kind] += (process.ticks - process.before) / TICK
        count[process.kind] += 1
    lines = [f"wall {wall:.0f} s; CPU busy {busy / TICK:.0f} s, idle {idle / TICK:.0f} s", ""]
    busy = max(busy, 1)  # a command too short to tick
    lines.append(f"{'CPU s':>8}  {'share':>6}  {'processes':>9}  kind")
    total = sum(by_kind.values())
    for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1]):
        if seconds >= 0.5:
            lines.append(f"{seconds:8.1f}  {seconds / busy * TICK:6.1%}  {count[kind]:9d}  {kind}")
    lines.append(f"{total:8.1f}  {total / busy * TICK:6.1%}  {'':9}  sampled, of the busy time")
    return "\n".join([*lines, "", *merges_by_test(seen), "", *jvm_threads(seen)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    seen: dict[tuple[str, str], Process] = {}
    sample(seen, first=True)
    busy0, idle0 = machine_ticks()
    began = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(0.5)
        sample(seen, first=False)
    busy1, idle1 = machine_ticks()
    table = report(seen, busy1 - busy0, idle1 - idle0, time.monotonic() - began)
    print(f"[cpu_by_process] {' '.join(command)}: exit {child.returncode}\n{table}")
    if args.out:
        args.out.write_text(table + "\n")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
