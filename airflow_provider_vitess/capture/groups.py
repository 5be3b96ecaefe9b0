"""Shard groups: one catch-up window read by several processes at once, each a group of shards.

A sync with ``capture_parallelism`` (N, or the groups' key ranges) splits its keyspace's shards,
sorted by key range, into contiguous groups (``capture/group_layout.py``). One step under the
sync's lock plans the window as always (start: the committed position; stop: every shard's
position now, taken once) and records the layout with it (:meth:`GroupedCatchUp.plan`). Each
group then reads the window's start restricted to its shards up to the stop restricted to its
shards (always to the stop: the parts of a window are one cut), under a lock of its own
(``checkpoints.groups.group_lock_id``: groups run at once, each group one writer at a time, fenced
as the sync's lock is), stages its part into the window's directory (part files named with the
group, a manifest of its own) and records the part STAGED (:meth:`GroupedCatchUp.read_group`). A
failed or killed group is read again alone, from the window's start, whole; the others' parts stay.

A snapshot of such a sync is copied by the same groups (``capture/group_snapshot.py``).
Once every group is STAGED, :func:`assemble` (under the sync's lock: the merge task, or the next
plan) writes the window's one manifest listing every group's parts and records the window STAGED:
from there on it is a window like any other, merged once, one Delta commit per table. The merge's
per-key order does not depend on which group staged an event (``merge/job/order.key_order``).
See docs/design.md, "Shard groups".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.catch_up import CatchUpRun
from airflow_provider_vitess.capture.group_layout import GroupSplit, SplitMismatchError, layout
from airflow_provider_vitess.capture.outcome import WindowOutcome
from airflow_provider_vitess.capture.resume import WindowBook
from airflow_provider_vitess.checkpoints import CheckpointStore, Window, WindowKind, WindowState
from airflow_provider_vitess.checkpoints.groups import WindowGroup, group_lock_id
from airflow_provider_vitess.exceptions import CheckpointError, staged_before
from airflow_provider_vitess.staging.files import MANIFEST_NAME, open_location, window_dir, write_atomically
from airflow_provider_vitess.staging.group_manifest import combine
from airflow_provider_vitess.staging.manifest import load_manifest
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import ReadBounds

log = logging.getLogger(__name__)


# Per kind of window: how its group tasks' errors name it (unplanned, planned), what a group
# does, its plan task.
_GROUP_TASK = {
    WindowKind.CATCHUP: ("catch-up window", "window", "read", "plan"),
    WindowKind.SNAPSHOT: ("snapshot window", "snapshot window", "copy", "plan_snapshot"),
}


def window_for_group(
    store: CheckpointStore, sync_id: str, kind: WindowKind, group: int
) -> tuple[Window, list[WindowGroup]]:
    """The sync's unfinished window of ``kind`` that mapped task ``group`` reads its part of, and
    the window's groups (none: one process reads it, as group 0). Refused when there is no such
    window, or the window has no group ``group`` (a task of another DAG run)."""
    unplanned, label, does, plan_task = _GROUP_TASK[kind]
    window = store.open_window(sync_id)
    if window is None or window.kind is not kind:
        raise CheckpointError(
            f"sync {sync_id!r} has no unfinished {unplanned} for group {group} to {does}: its "
            f"plan task plans one (run the DAG's {plan_task} task first)"
        )
    groups = store.window_groups(sync_id, window.seq)
    if groups and not 0 <= group < len(groups):
        raise CheckpointError(
            f"sync {sync_id!r} {label} {window.seq} was planned with groups 0-{len(groups) - 1}, not "
            f"{group}: the mapped task's group comes from the plan task of the same DAG run"
        )
    return window, groups


def restrict(position: Vgtid, shards: Sequence[str]) -> Vgtid:
    """``position``'s entries of ``shards`` only (what one group reads from, or up to)."""
    wanted = set(shards)
    entries = [sg for sg in position.shard_gtids if sg.shard in wanted]
    if {sg.shard for sg in entries} != wanted:
        missing = sorted(wanted - {sg.shard for sg in entries})
        raise CheckpointError(f"position {position.to_json()} names no entry for shard(s) {missing}")
    return Vgtid(tuple(entries))


class GroupedCatchUp(CatchUpRun):
    """The plan step and the per-group read of a sync read by shard groups."""

    def plan(self, split: GroupSplit) -> list[int]:
        """Under the sync's lock: the unfinished catch-up window, or a new one planned with its
        group layout; returns its groups (``[0]``: a window read by one process). A window whose
        groups are all staged is assembled first."""
        chosen = self._check_source()
        with self._locked():
            assemble(self.store, self.spec.sync_id, self._windows)
            found = self._window_to_read(WindowKind.CATCHUP, chosen, lambda: self._plan_grouped(split))
            seq = found.seq if isinstance(found, WindowOutcome) else found[0].seq
            groups = self.store.window_groups(self.spec.sync_id, seq)
            if groups and isinstance(found, tuple):
                self._record_key_progress(seq, self.spec.tables)  # once, not by every group
            return [g.group for g in groups] or [0]

    def _plan_grouped(self, split: GroupSplit) -> int:
        start = self.store.next_catchup_start(self.spec.sync_id)
        if start is None:
            raise CheckpointError(f"sync {self.spec.sync_id!r} has no committed position: snapshot it first")
        self._check_keyspace(start, "the committed position")
        stop, taken_at, stats = self._take_stop()
        shards = [sg.shard for sg in start.shard_gtids]
        try:
            groups = layout(shards, split)
        except SplitMismatchError as exc:
            # Shards that no longer fit the user's ranges (after a reshard): one process reads
            # the window, exact but not spread, until the ranges are changed.
            log.warning("sync %r: %s; this window is read by one process", self.spec.sync_id, exc)
            groups = []
        if len(groups) < 2 or sorted(sg.shard for sg in stop.shard_gtids) != sorted(shards):
            # One shard, or a reshard under way (the stop names other shards): one process reads
            # it, journals and all (the single-process path).
            groups = []
        return self.store.plan_window(
            self.spec.sync_id, WindowKind.CATCHUP, start, stop, taken_at, groups=groups or None, stats=stats
        )

    def read_group(self, group: int, bounds: ReadBounds | None = None) -> dict[str, Any]:
        """Stage ``group``'s part of the sync's unfinished grouped window (group 0 of a window
        read by one process reads it as a catch-up does, within ``bounds``). Returns what it did.

        A group's part is read to the window's stop whatever ``bounds`` say: the parts of one
        window are merged as one cut of every shard, and a part cut short (``max_events``,
        ``max_seconds``) would leave its shards' changes to later windows while the other groups'
        shards are read to the stop: the merge, which ranks a key's events window first, would
        then apply a key moved from a cut group to another out of order (docs/design.md, "Shard
        groups"). The window is bounded by its stop (taken once, by the plan step); a group's
        memory by the spill of long transactions, in bytes."""
        sync_id = self.spec.sync_id
        window, groups = window_for_group(self.store, sync_id, WindowKind.CATCHUP, group)
        if not groups:
            if group != 0:
                return {"seq": window.seq, "group": group, "status": "read by group 0 (one process)"}
            outcome = self.catch_up(bounds)
            return {"seq": outcome.seq, "group": 0, "status": "staged", "rows": outcome.manifest.rows}
        if window.state is not WindowState.PLANNED or groups[group].state is WindowState.STAGED:
            return {"seq": window.seq, "group": group, "status": "already staged"}
        if bounds is not None and (bounds.max_events is not None or bounds.max_seconds is not None):
            log.info(
                "sync %r window %d group %d: read to the window's stop (max_events=%s, max_seconds=%s "
                "bound a window read by one process; the parts of a grouped window are one cut)",
                sync_id,
                window.seq,
                group,
                bounds.max_events,
                bounds.max_seconds,
            )
        chosen = self._check_source()
        with self._locked(group_lock_id(sync_id, group)):
            return self._read_group(window, self.store.window_groups(sync_id, window.seq)[group], chosen)

    def _read_group(self, window: Window, part: WindowGroup, chosen: Mapping[str, Any]) -> dict[str, Any]:
        spec, seq, g = self.spec, window.seq, part.group
        if part.state is WindowState.STAGED:  # a concurrent try staged it before we took the lock
            return {"seq": seq, "group": g, "status": "already staged"}
        self._record_sync(chosen)  # keys and columns as planned (a change is refused)
        if window.stop_vgtid is None:
            raise CheckpointError(f"sync {spec.sync_id!r} catch-up window {seq} has no stop position")
        start, stop = restrict(window.start_vgtid, part.shards), restrict(window.stop_vgtid, part.shards)
        # A group's read is short: a rerun reads it again from the window's start, whole.
        delete_group_files(spec.staging_location, spec.sync_id, seq, g, spec.storage_options)
        stager, record = self._group_part(seq, g)
        reader = self._catch_up_reader(stager, start, stop, None)  # to the stop: one cut (read_group)
        outcome = self._stage(seq, WindowKind.CATCHUP, False, reader, stager, start, stop, record=record)
        log.info(
            "sync %r window %d group %d (%s) staged %d rows",
            spec.sync_id,
            seq,
            g,
            part.shards,
            outcome.manifest.rows,
        )
        return {
            "seq": seq,
            "group": g,
            "shards": list(part.shards),
            "status": "staged",
            "rows": outcome.manifest.rows,
        }


def delete_group_files(
    location: str,
    sync_id: str,
    seq: int,
    group: int,
    options: Mapping[str, Any] | None,
    keep: Sequence[str] = (),
) -> list[str]:
    """A group's files of the window no recorded manifest lists: its part files (named with the
    group, ``staging.files.group_writer_id``) and its manifest, but those in ``keep`` (a snapshot
    group's checkpointed parts, paths relative to the window's directory as parts record them).
    Other groups' files are left alone."""
    fs, root = open_location(location, options)
    wdir = window_dir(root, sync_id, seq)
    if fs.exists(f"{wdir}/{MANIFEST_NAME}"):
        raise CheckpointError(staged_before(sync_id, seq))
    if not fs.exists(wdir):
        return []
    marker, manifests, deleted = f"-g{group:03d}-", f"_group-{group:03d}-", []
    kept = set(keep)
    for path in sorted(fs.find(wdir)):
        name = path.rsplit("/", 1)[-1]
        if path.split(f"{wdir.rstrip('/')}/", 1)[-1] in kept:
            continue
        if marker in name or name.startswith(manifests):
            fs.rm(path)
            deleted.append(name)
    return deleted


def assemble(store: CheckpointStore, sync_id: str, book: WindowBook) -> int | None:
    """Under the sync's lock: the unfinished grouped window whose groups are all STAGED gets its
    one manifest (every group's parts; written last, atomically) and is recorded STAGED. Returns
    its seq, or None when there is no such window. A group whose manifest is lost discards the
    window (its changes are read again from its start by the next window)."""
    window = store.open_window(sync_id)
    if window is None or window.state is not WindowState.PLANNED:
        return None
    groups = store.window_groups(sync_id, window.seq)
    if not groups or any(g.state is not WindowState.STAGED for g in groups):
        return None
    manifest = load_manifest(book.location, sync_id, window.seq, storage_options=book.options)
    if manifest is None:
        parts = []
        for g in groups:
            recorded = (g.manifest_path or "").rsplit("/", 1)[-1]
            part = (
                load_manifest(book.location, sync_id, window.seq, storage_options=book.options, name=recorded)
                if recorded
                else None
            )
            if part is None:
                book.discard_lost(window, f"group {g.group}'s manifest is missing")
                return None
            parts.append(part)
        manifest = combine(window.start_vgtid, window.stop_vgtid, parts)
        fs, root = open_location(book.location, book.options)
        write_atomically(
            fs, f"{window_dir(root, sync_id, window.seq)}/{MANIFEST_NAME}", manifest.to_json().encode()
        )
    store.mark_staged(sync_id, window.seq, manifest.end_vgtid, manifest.path, dict(manifest.stats))
    log.info("sync %r window %d: every group's part is staged; the window is STAGED", sync_id, window.seq)
    return window.seq
