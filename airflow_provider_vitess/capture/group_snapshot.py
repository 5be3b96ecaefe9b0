"""A snapshot copied by shard groups: each group copies its own shards, at once.

A sync with ``capture_parallelism`` takes its snapshots (the first, a re-snapshot of chosen
tables, tables that joined its list) the way it reads its catch-up windows (``capture/groups.py``):
one step under the sync's lock plans the window with the group layout
(:meth:`GroupedSnapshot.plan_snapshot`: the start is an empty position on every shard, the layout
cut from them by ``capture/group_layout.layout``); then each group, under its own lock, runs the
copy phase from the empty position restricted to its shards (:meth:`GroupedSnapshot.copy_group`,
``SnapshotRun._run_snapshot(group=...)``). A group checkpoints its own parts and its own resume
position (with its tables' last PKs) and its own per-table progress, so a killed group resumes
from its own last checkpoint while the other groups' parts and progress stay as they are. It
stages its part as a catch-up group does (its part files, a manifest of its own) and records it
STAGED; once every group is, ``capture.groups.assemble`` (the merge task, or the next plan) writes
the window's one manifest and the window is merged as any snapshot. See docs/design.md,
"Shard groups".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow_provider_vitess.capture.columns import changed_choice
from airflow_provider_vitess.capture.group_layout import GroupSplit
from airflow_provider_vitess.capture.groups import assemble, window_for_group
from airflow_provider_vitess.capture.outcome import SnapshotNeed, WindowOutcome
from airflow_provider_vitess.capture.snapshot import CHECKPOINT_EVERY_ROWS, SnapshotRun
from airflow_provider_vitess.checkpoints import WindowKind, WindowState
from airflow_provider_vitess.checkpoints.groups import group_lock_id
from airflow_provider_vitess.exceptions import ColumnsChangedError, KeyChangedError
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS

log = logging.getLogger(__name__)


class GroupedSnapshot(SnapshotRun):
    """The plan step and the per-group copy of a snapshot copied by shard groups."""

    def plan_snapshot(
        self, split: GroupSplit, tables: Sequence[str] | None = None, need: SnapshotNeed | None = None
    ) -> list[int]:
        """Under the sync's lock: the unfinished snapshot window, or a new one of ``tables``
        (default: all) planned with its group layout; returns its groups (``[0]``: a window
        copied by one process). A window whose groups are all staged is assembled first; an
        unmerged one that is not what ``need`` asks is replaced (``_replace_unmerged``)."""
        chosen = self._chosen(tables)
        chosen_keys = self._check_source()
        with self._locked():
            assemble(self.store, self.spec.sync_id, self._windows)
            chosen = self._replace_unmerged(chosen_keys, need) or chosen
            found = self._window_to_read(
                WindowKind.SNAPSHOT,
                chosen_keys,
                lambda: self._plan_snapshot(chosen, split),
                snapshot_of=chosen,
            )
            if isinstance(found, WindowOutcome):
                return [0]  # staged already: group 0 reports it
            groups = self.store.window_groups(self.spec.sync_id, found[0].seq)
            return [g.group for g in groups] or [0]

    def copy_group(
        self,
        group: int,
        *,
        checkpoint_every_rows: int = CHECKPOINT_EVERY_ROWS,
        copy_stall_seconds: float = COPY_STALL_SECONDS,
    ) -> dict[str, Any]:
        """Copy ``group``'s part of the sync's unfinished snapshot window (group 0 of a window
        copied by one process copies it whole, as the snapshot task does). Returns what it did."""
        sync_id = self.spec.sync_id
        window, groups = window_for_group(self.store, sync_id, WindowKind.SNAPSHOT, group)
        if not groups:
            if group != 0:
                return {"seq": window.seq, "group": group, "status": "copied by group 0 (one process)"}
            outcome = self.snapshot(
                checkpoint_every_rows=checkpoint_every_rows, copy_stall_seconds=copy_stall_seconds
            )
            return {"seq": outcome.seq, "group": 0, "status": "staged", "rows": outcome.manifest.rows}
        if window.state is not WindowState.PLANNED or groups[group].state is WindowState.STAGED:
            return {"seq": window.seq, "group": group, "status": "already staged"}
        chosen_keys = self._check_source()
        with self._locked(group_lock_id(sync_id, group)):
            part = self.store.window_groups(sync_id, window.seq)[group]
            if part.state is WindowState.STAGED:  # a concurrent try staged it before we took the lock
                return {"seq": window.seq, "group": group, "status": "already staged"}
            tables = self._window_tables(window.seq)
            # Every group copies with the plan's keys and columns: a part staged with another
            # key or column list than its siblings would be merged as theirs.
            changed = changed_choice(window, tables, chosen_keys, self._columns, self._config())
            if changed is not None:
                kind, why = changed
                error = KeyChangedError if kind == "key" else ColumnsChangedError
                raise error(
                    f"sync {sync_id!r} snapshot window {window.seq} was planned with another choice "
                    f"than group {group}'s task has now: {why}. Nothing was copied. Run the DAG "
                    "again (or clear plan_snapshot with its downstream tasks): plan_snapshot "
                    "replaces the unmerged window with one of today's choice"
                )
            self._record_sync(chosen_keys, snapshot_of=tables, resuming=True)
            self._check_keyspace(window.start_vgtid, "the snapshot start")
            outcome = self._run_snapshot(
                window.seq,
                window.start_vgtid,
                True,
                checkpoint_every_rows,
                tables,
                copy_stall_seconds,
                group=part,
            )
        log.info(
            "sync %r snapshot window %d group %d (%s) staged %d rows",
            sync_id,
            window.seq,
            group,
            part.shards,
            outcome.manifest.rows,
        )
        return {
            "seq": window.seq,
            "group": group,
            "shards": list(part.shards),
            "status": "staged",
            "rows": outcome.manifest.rows,
            "rows_per_table": dict(outcome.manifest.stats.get("rows_per_table") or {}),
        }
