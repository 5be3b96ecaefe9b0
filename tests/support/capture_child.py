"""Runs one capture (snapshot or catch-up window) in a process of its own, so tests can SIGKILL it.

Usage: python -m tests.support.capture_child snapshot|catchup|group|group_snapshot <spec json>
The spec JSON holds the sync spec, the store URL and the Airflow connection (as env).
Prints one JSON line with the outcome when it finishes. With ``"kill_after_journal": true`` it
SIGKILLs itself at the first row of a new shard staged after a reshard's journal (printing
``KILLED-AFTER-JOURNAL`` first): the journal is staged, the window not STAGED yet. With
``"pause_after_rows": n`` it SIGSTOPs itself once it has copied n rows; with
``"kill_after_checkpoints": n`` it SIGKILLs itself once its n-th checkpoint is recorded.
The same faults go into a process running a DAG run's tasks (``run_dag``, the environment
variable ``VITESS_TEST_FAULTS``) through :func:`install_faults`, with two more: a SIGKILL at a
merge's progress step, and one shard group's catch-up failing.

Tests build the spec as a :class:`ChildSpec` and start the child with :func:`start` or run it to
its end with :func:`run`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_vitess.capture.groups import GroupedCatchUp
from airflow_provider_vitess.capture.progress import ProgressTracker
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import WindowStager
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.copy_state import CopiedTables
from airflow_provider_vitess.vstream.window import ReadBounds, WindowReader
from tests.support.local import REPO


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """One capture child's run: the sync, its checkpoint store, and the Airflow connection it
    reads through (``env``: the connection's environment variable)."""

    sync_id: str
    keyspace: str
    tables: tuple[str, ...]
    staging: str
    store_url: str
    conn_id: str
    env: dict[str, str]
    checkpoint_every_rows: int = 5000
    lock_stale_seconds: float = 120
    max_events: int | None = None
    kill_after_journal: bool = False
    pause_after_rows: int | None = None
    group: int = 0  # kind "group": the shard group it reads (capture/groups.py)
    kill_after_rows: int | None = None  # SIGKILL once this many rows are staged
    kill_before_record: bool = False  # SIGKILL once the part is written, before it is recorded
    kill_after_checkpoints: int | None = None  # SIGKILL once this many checkpoints are recorded
    # ... counting only checkpoints at which every shard has finished the same tables
    kill_where_shards_agree: bool = False
    # SIGKILL right after the first checkpoint whose position shows a table copied on every shard
    kill_once_copied: bool = False

    def command(self, kind: str) -> list[str]:
        """The child's command line: ``kind`` is ``snapshot`` or ``catchup``."""
        spec = json.dumps(dataclasses.asdict(self))
        return [sys.executable, "-m", "tests.support.capture_child", kind, spec]

    @classmethod
    def in_dir(
        cls,
        root: Path,
        sync_id: str,
        keyspace: str,
        tables: tuple[str, ...],
        connection: tuple[str, str],
        **options: Any,
    ) -> ChildSpec:
        """A spec staging under ``root/stage`` with a SQLite store in ``root``. ``connection`` is
        the Airflow connection's (environment variable, URI); its id is the variable's tail."""
        variable, uri = connection
        return cls(
            sync_id=sync_id,
            keyspace=keyspace,
            tables=tables,
            staging=str(root / "stage"),
            store_url=f"sqlite:///{root}/store.db",
            conn_id=variable.removeprefix("AIRFLOW_CONN_").lower(),
            env={variable: uri},
            **options,
        )

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        raw = json.loads(text)
        return cls(**{**raw, "tables": tuple(raw["tables"])})


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start(kind: str, spec: ChildSpec, **popen: Any) -> subprocess.Popen[str]:
    """The child, started (``popen``: where its output goes; text mode)."""
    return subprocess.Popen(spec.command(kind), cwd=REPO, env=_child_env(), text=True, **popen)


def run(kind: str, spec: ChildSpec, timeout: float) -> subprocess.CompletedProcess[str]:
    """The child, run to its end, its output captured."""
    command, env = spec.command(kind), _child_env()
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def _kill_after_journal() -> None:
    pass_journal = WindowReader._pass_journal

    def passing(reader: WindowReader, unit: Any, journal: Any) -> None:
        pass_journal(reader, unit, journal)
        new_shards = {sg.shard for sg in journal.shard_gtids}
        add_rows = reader._stager.add_rows

        def adding(keyspace: str, table: str, shard: str, *rest: Any) -> None:
            add_rows(keyspace, table, shard, *rest)
            if shard in new_shards:
                print(f"KILLED-AFTER-JOURNAL at a row of {keyspace}/{shard}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        reader._stager.add_rows = adding  # type: ignore[method-assign,assignment]

    WindowReader._pass_journal = passing  # type: ignore[method-assign,assignment]


def _pause_after_rows(rows: int) -> None:
    """SIGSTOP this process once this run has copied ``rows`` rows (printing
    ``PAUSED-AFTER-ROWS`` first): a test holds it there mid-copy, holding the sync's lock."""
    add_copied = ProgressTracker.add_copied
    copied = [0]

    def adding(tracker: ProgressTracker, table: str, n: int) -> None:
        add_copied(tracker, table, n)
        copied[0] += n
        if copied[0] - n < rows <= copied[0]:
            print(f"PAUSED-AFTER-ROWS {copied[0]}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    ProgressTracker.add_copied = adding  # type: ignore[method-assign,assignment]


def _kill_after_rows(rows: int) -> None:
    """SIGKILL this process once this run has staged ``rows`` rows (printing ``KILLED-AFTER-ROWS``
    first): a group's read killed mid-window, its part neither written whole nor recorded."""
    add_rows = WindowStager.add_rows
    staged = [0]

    def adding(
        stager: WindowStager, keyspace: str, table: str, shard: str, commit_ts: int, seq: int, changes: Any
    ) -> None:
        add_rows(stager, keyspace, table, shard, commit_ts, seq, changes)
        staged[0] += len(changes)
        if staged[0] >= rows:
            print(f"KILLED-AFTER-ROWS {staged[0]}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    WindowStager.add_rows = adding  # type: ignore[method-assign,assignment]


def _kill_before_record() -> None:
    """SIGKILL this process once its group's manifest is written, before the store records it."""

    def killing(*_: Any, **__: Any) -> bool:
        print("KILLED-BEFORE-RECORD", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return False

    CheckpointStore.mark_group_staged = killing  # type: ignore[method-assign]


def _kill_after_checkpoints(
    checkpoints: int, tables: tuple[str, ...], agreeing: bool, once_copied: bool = False
) -> None:
    """SIGKILL this process right after its ``checkpoints``-th checkpoint (parts and resume
    position) is recorded (printing ``KILLED-AFTER-CHECKPOINTS`` first): a copy killed mid-way,
    with checkpointed parts to keep and rows past them to copy again. ``agreeing``: count only
    checkpoints at which every shard has finished the same tables (each shard's as
    ``CopiedTables`` sees it): Vitess's ``tables_to_copy`` is one list for every shard, so a
    resume from a checkpoint where one shard finished a table another has not copies it again
    on the first (rows staged twice, harmless to the merge but not to an exact count).
    ``once_copied``: the first checkpoint (from the ``checkpoints``-th on) whose position shows a
    table copied on every shard, killed right after its parts and position are recorded."""
    record_parts = CheckpointStore.record_parts
    done = [0]
    per_shard: dict[str, CopiedTables] = {}

    def agree(position: Vgtid) -> bool:
        finished = [
            per_shard.setdefault(sg.shard, CopiedTables(tables)).at(Vgtid((sg,)))
            for sg in position.shard_gtids
        ]
        return all(f == finished[0] for f in finished)

    everywhere = CopiedTables(tables)

    def copied_everywhere(position: Vgtid) -> bool:
        return bool(everywhere.at(position))

    def recording(store: CheckpointStore, *args: Any, **kwargs: Any) -> int:
        recorded = record_parts(store, *args, **kwargs)
        if agree(args[3]) or not agreeing:
            done[0] += 1
        if once_copied and not copied_everywhere(args[3]):
            return recorded
        if done[0] >= checkpoints:
            print(f"KILLED-AFTER-CHECKPOINTS {done[0]}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return recorded

    CheckpointStore.record_parts = recording  # type: ignore[method-assign,assignment]


def _kill_at_merge_phase(phase: str, nth: int) -> None:
    """SIGKILL this process at the ``nth`` progress line of ``phase`` (``writing``: a table's
    write started; ``committed``: its Delta commit done) of a merge run in this process (the
    merge operator's Spark Connect path), printing ``KILLED-AT-MERGE`` first."""
    from airflow_provider_vitess.merge.job import run as merge_run

    merge = merge_run.merge
    seen = [0]

    def merging(*args: Any, progress: Any = None, **kwargs: Any) -> Any:
        def killing(seq: int, table: str, at: str) -> None:
            if progress is not None:
                progress(seq, table, at)
            if at == phase:
                seen[0] += 1
                if seen[0] >= nth:
                    print(f"KILLED-AT-MERGE {phase} {nth} (window {seq}, {table})", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        return merge(*args, progress=killing, **kwargs)

    merge_run.merge = merging


def _fail_group(group: int) -> None:
    """Shard group ``group``'s catch-up (or its copy of a grouped snapshot) fails (an exception,
    the task's failure) once its part is written, before the store records it: the other groups'
    tasks run on and succeed."""
    mark = CheckpointStore.mark_group_staged

    def failing(store: CheckpointStore, sync_id: str, seq: int, g: int, *args: Any, **kwargs: Any) -> Any:
        if g == group:
            raise RuntimeError(f"FAILED-GROUP {group}: injected failure before its part is recorded")
        return mark(store, sync_id, seq, g, *args, **kwargs)

    CheckpointStore.mark_group_staged = failing  # type: ignore[method-assign,assignment]


# The faults :func:`install_faults` takes (a ChildSpec's fields of the same names, and more).
FAULTS = (
    "kill_after_journal", "pause_after_rows", "kill_after_rows", "kill_before_record",
    "kill_after_checkpoints", "kill_once_copied", "kill_at_merge_phase", "fail_group",
)  # fmt: skip


def install_faults(faults: dict[str, Any], tables: tuple[str, ...] = ()) -> None:
    """Installs the faults named in ``faults`` (:data:`FAULTS`) in this process: a capture child
    (its spec), or a process running a DAG run's tasks (``run_dag`` with ``VITESS_TEST_FAULTS``;
    ``kill_at_merge_phase``: ``[phase, nth]``, ``fail_group``: the group)."""
    unknown = set(faults) - set(FAULTS) - {"kill_where_shards_agree"}
    assert not unknown, f"unknown faults {sorted(unknown)}"
    if faults.get("kill_after_journal"):
        _kill_after_journal()
    if faults.get("pause_after_rows"):
        _pause_after_rows(faults["pause_after_rows"])
    if faults.get("kill_after_rows"):
        _kill_after_rows(faults["kill_after_rows"])
    if faults.get("kill_before_record"):
        _kill_before_record()
    if faults.get("kill_after_checkpoints") or faults.get("kill_once_copied"):
        _kill_after_checkpoints(
            faults.get("kill_after_checkpoints") or 1,
            tables,
            bool(faults.get("kill_where_shards_agree")),
            bool(faults.get("kill_once_copied")),
        )
    if faults.get("kill_at_merge_phase"):
        _kill_at_merge_phase(*faults["kill_at_merge_phase"])
    if faults.get("fail_group") is not None:
        _fail_group(faults["fail_group"])


def main() -> None:
    kind, spec = sys.argv[1], ChildSpec.from_json(sys.argv[2])
    os.environ.update(spec.env)
    # To stderr: stdout carries the outcome line (and Airflow's logging config would print there).
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    fields = dataclasses.asdict(spec)
    install_faults(
        {k: v for k, v in fields.items() if k in FAULTS or k == "kill_where_shards_agree"}, spec.tables
    )
    sync = SyncSpec(
        sync_id=spec.sync_id, keyspace=spec.keyspace, tables=spec.tables, staging_location=spec.staging
    )
    runner = CaptureRunner(
        VitessHook(spec.conn_id),
        CheckpointStore(spec.store_url),
        sync,
        holder=f"pid {os.getpid()}",
        lock_stale_after=timedelta(seconds=spec.lock_stale_seconds),
    )
    if kind == "group":
        grouped = GroupedCatchUp(
            VitessHook(spec.conn_id),
            CheckpointStore(spec.store_url),
            sync,
            holder=f"pid {os.getpid()} group {spec.group}",
            lock_stale_after=timedelta(seconds=spec.lock_stale_seconds),
        )
        print(json.dumps(grouped.read_group(spec.group, ReadBounds(max_events=spec.max_events))), flush=True)
        return
    if kind == "group_snapshot":
        from airflow_provider_vitess.capture.group_snapshot import GroupedSnapshot

        copier = GroupedSnapshot(
            VitessHook(spec.conn_id),
            CheckpointStore(spec.store_url),
            sync,
            holder=f"pid {os.getpid()} snapshot group {spec.group}",
            lock_stale_after=timedelta(seconds=spec.lock_stale_seconds),
        )
        result = copier.copy_group(spec.group, checkpoint_every_rows=spec.checkpoint_every_rows)
        print(json.dumps(result), flush=True)
        return
    if kind == "snapshot":
        outcome = runner.snapshot(checkpoint_every_rows=spec.checkpoint_every_rows)
    else:
        outcome = runner.catch_up(ReadBounds(max_events=spec.max_events))
    print(json.dumps({"seq": outcome.seq, "resumed": outcome.resumed}), flush=True)


if __name__ == "__main__":
    main()
