"""Where the local cluster and the benchmark process run: on the same cores, or on cores of their own.

On a small machine the local vttestserver (vtcombo and MariaDB, ~1.2-1.3 cores at full speed
on the 2-core development VM) and the benchmark share the cores, so every cycle the client
spends is a cycle the server may have wanted: a client that takes 0.8 µs of CPU per event
slows the server by ~10% whatever it does with it (busy-loop drains:
``bench/results/2026-11-22-bench_window-cpu-layout.md``). In a deployment the Airflow worker
does not run on the vtgate/vttablet hosts.

``split`` pins every thread of the cluster's processes to one half of the cores and every thread
of this process to the other half, for both sides of a measurement alike: the server's speed
then does not depend on the client's CPU, as on separate hosts, and what is left of the gap is
what the client itself costs (waiting, stalls, its own CPU on the read path). Threads created
later inherit the affinity of the thread that creates them, so pinning the threads that exist
is enough. The original affinities are put back on leaving, also on failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

LAYOUTS = ("shared", "split")


def state_dir() -> Path:
    """The running cluster's state directory, chosen as ``dev/local_vitess.sh`` chooses it."""
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "airflow-provider-vitess-cluster"
    return Path(os.environ.get("VITESS_STATE_DIR", default))


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after it.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def cluster_pids() -> list[int]:
    """vttestserver (its pid file) and every process under it: vtcombo, mysqld_safe, mariadbd."""
    pid_file = state_dir() / "vttestserver.pid"
    try:
        root = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"no running local cluster to pin ({pid_file}: {exc})") from exc
    children = _children()
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _pin(pids: list[int], cores: set[int], saved: dict[int, set[int]]) -> None:
    # A second pass catches threads started by a thread that was not pinned yet.
    for _ in range(3):
        changed = False
        for pid in pids:
            for tid in _threads(pid):
                try:
                    current = os.sched_getaffinity(tid)
                    if current != cores:
                        saved.setdefault(tid, current)
                        os.sched_setaffinity(tid, cores)
                        changed = True
                except (ProcessLookupError, PermissionError):
                    continue  # exited meanwhile; or not ours (then it was never pinned either)
        if not changed:
            return


def split_cores() -> tuple[set[int], set[int]] | None:
    """(the cluster's cores, this process's cores), or None with fewer than 2 cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


@contextmanager
def cpu_layout(layout: str) -> Iterator[str]:
    """Runs the body with the cluster and this process laid out as ``layout``; yields a
    description of the layout for the report."""
    if layout == "shared":
        yield "cluster and benchmark share every core"
        return
    if layout != "split":
        raise ValueError(f"unknown CPU layout {layout!r}; one of {LAYOUTS}")
    halves = split_cores()
    if halves is None:
        raise RuntimeError("--cpu-layout split needs at least 2 cores")
    server, client = halves
    machine = os.sched_getaffinity(0)  # before pinning: what this process may use
    saved: dict[int, set[int]] = {}
    try:
        _pin(cluster_pids(), server, saved)
        _pin([os.getpid()], client, saved)
        yield f"cluster on core(s) {sorted(server)}, benchmark on core(s) {sorted(client)}"
    finally:
        # Every thread back to what it had; threads born while pinned get the whole machine.
        for pid in [*cluster_pids(), os.getpid()]:
            for tid in _threads(pid):
                with suppress(ProcessLookupError, PermissionError):  # exited meanwhile
                    os.sched_setaffinity(tid, saved.get(tid, machine))
