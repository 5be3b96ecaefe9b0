"""The snapshot job: copy a sync's tables (all, or some: a re-snapshot) as one window.

The VStream copy phase from an empty position on every shard, checkpointed every
``checkpoint_every_rows`` rows or 256 MiB (staged parts + VGTID with table last-PKs, one
transaction), so a killed snapshot resumes where it was. Vitess v0.23 copies *every* filtered
table absent from the VGTID's table last-PKs when a copy resumes (finished ones included), so a
resume passes ``tables_to_copy`` = the tables not yet copied on every shard.

A sync read by shard groups (``capture_parallelism``) copies its snapshots by the same groups
(``capture/group_snapshot.py``): each group runs this copy over its own shards, checkpointing its
own parts, resume position and progress (``_run_snapshot(group=...)``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from airflow_provider_vitess.capture import source
from airflow_provider_vitess.capture.columns import changed_choice
from airflow_provider_vitess.capture.group_layout import GroupSplit, SplitMismatchError, layout
from airflow_provider_vitess.capture.groups import (
    delete_group_files,
    restrict,
)
from airflow_provider_vitess.capture.outcome import SnapshotNeed, WindowOutcome
from airflow_provider_vitess.capture.progress import ProgressTracker
from airflow_provider_vitess.capture.run import SyncRun
from airflow_provider_vitess.checkpoints import Part, Phase, TableProgress, WindowKind, WindowState
from airflow_provider_vitess.checkpoints.groups import WindowGroup
from airflow_provider_vitess.checkpoints.progress import GroupProgress, by_table
from airflow_provider_vitess.exceptions import CheckpointError, UnknownTableError
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.staging import PartInfo, WindowStager
from airflow_provider_vitess.staging.manifest import COLUMN_CHOICE_CHANGED
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS
from airflow_provider_vitess.vstream.copy_state import CopiedTables
from airflow_provider_vitess.vstream.source_clock import stop_and_time

log = logging.getLogger(__name__)

# Rows between two snapshot checkpoints. Each checkpoint closes the open parts and records them
# with the copy's position in the store (a few commits); at 50,000 rows that was ~10% of a
# copy's wall time once the copy ran near stream speed. A kill recopies at most this many rows
# (plus the copy batch in flight, ~4,000): a second or two of copying.
CHECKPOINT_EVERY_ROWS = 250_000
# ... or this many bytes of rows, whichever comes first: 250,000 rows of 64 KiB would be 16 GB
# to recopy after a kill (and one part file as large). Small rows never reach it.
CHECKPOINT_EVERY_BYTES = 256 << 20


def _store_part(p: PartInfo) -> Part:
    return Part(path=p.path, table=p.table, rows=p.rows, bytes=p.bytes, sha256=p.sha256, detail=p.to_dict())


def _staged_part(p: Part) -> PartInfo:
    return PartInfo.from_dict(p.detail)


class SnapshotRun(SyncRun):
    """The snapshot task's run: whether there is work, and the copy."""

    def snapshot_need(self, requested: Sequence[str] = (), *, only_if_needed: bool = True) -> SnapshotNeed:
        """Does a snapshot task have work? Yes for a new sync, a resumed snapshot, ``requested``
        tables (a re-snapshot) or ``only_if_needed=False``; no for a sync that already streams."""
        committed, seq = self.store.committed(self.spec.sync_id)
        window = self.store.open_window(self.spec.sync_id)
        resuming = window is not None and window.kind is WindowKind.SNAPSHOT
        # Tables that joined the list since the last run are copied on their own first.
        joined = () if committed is None else self._table_list_change(self._config()).to_snapshot
        needed = committed is None or bool(requested) or bool(joined) or resuming or not only_if_needed
        # An unfinished snapshot holding these tables (with today's keys and columns) is resumed;
        # one without them is replaced by a window of its tables and these (see snapshot()).
        tables = tuple(dict.fromkeys((*requested, *joined))) or self.spec.tables
        if committed is None:
            # A first snapshot copies every table, whatever is asked: its commit starts the
            # stream past the copy, so a table left out would never be copied.
            tables = self.spec.tables
        everything = committed is None or not only_if_needed
        fresh = self.spec.tables if everything else tables if (requested or joined) else ()
        return SnapshotNeed(
            needed,
            tables,
            resnapshot=committed is not None,
            committed_seq=seq,
            fresh=tuple(fresh),
            asked=bool(requested) or not only_if_needed,
        )

    def snapshot(
        self,
        *,
        tables: Sequence[str] | None = None,
        need: SnapshotNeed | None = None,
        checkpoint_every_rows: int = CHECKPOINT_EVERY_ROWS,
        copy_stall_seconds: float = COPY_STALL_SECONDS,
    ) -> WindowOutcome:
        """Copy ``tables`` (default: all the sync's tables) and stage them as one window.

        An unmerged snapshot window is resumed (or, staged, handed back) only while it is what
        is asked now: see :meth:`_replace_unmerged` (``need``: what the snapshot task asks).

        A copy whose copying shards send no row for ``copy_stall_seconds`` (vtgate's heartbeats
        only) fails with :class:`~..exceptions.CopyStalledError` (``vstream/copy_stall.py``).

        Once the sync streams, this is a re-snapshot of those tables: committing it leaves the
        sync's position where the other tables are (see ``CheckpointStore.commit``). A killed
        snapshot resumes with the tables it was started with (``tables`` here may be fewer),
        unless ``need`` asks for one it lacks: then it is replaced (:meth:`_replace_unmerged`).
        """
        spec = self.spec
        chosen = self._chosen(tables)
        chosen_keys = self._check_source()
        with self._locked():
            chosen = self._replace_unmerged(chosen_keys, need) or chosen
            found = self._window_to_read(
                WindowKind.SNAPSHOT, chosen_keys, lambda: self._plan_snapshot(chosen), snapshot_of=chosen
            )
            if isinstance(found, WindowOutcome):
                return found
            window, resumed = found
            if resumed:
                if self.store.window_groups(spec.sync_id, window.seq):
                    raise CheckpointError(
                        f"sync {spec.sync_id!r} snapshot window {window.seq} is copied by shard groups "
                        "(it was planned with capture_parallelism), so one process cannot resume it; "
                        "give the DAG its capture_parallelism back until this snapshot is merged"
                    )
                chosen = self._window_tables(window.seq)
            self._check_keyspace(window.start_vgtid, "the snapshot start")
            return self._run_snapshot(
                window.seq, window.start_vgtid, resumed, checkpoint_every_rows, chosen, copy_stall_seconds
            )

    def _chosen(self, tables: Sequence[str] | None) -> tuple[str, ...]:
        """The tables to copy (default: all the sync's), each checked to be one of its tables."""
        chosen = tuple(tables) if tables else self.spec.tables
        unknown = sorted(set(chosen) - set(self.spec.tables))
        if unknown:
            raise UnknownTableError(
                f"sync {self.spec.sync_id!r} cannot snapshot {unknown}: not among its tables "
                f"{list(self.spec.tables)}"
            )
        return chosen

    def _replace_unmerged(
        self, chosen_keys: Mapping[str, KeyChoice], need: SnapshotNeed | None
    ) -> tuple[str, ...] | None:
        """Under the lock, before the resume-or-plan step: an unmerged (PLANNED or STAGED)
        snapshot window that is not what is asked now is discarded (FAILED, its files deleted),
        and the tables the new window must copy are returned: its own and those asked for (None:
        nothing replaced). Not what is asked: a table's key or column choice now differs from the
        one it was read with (its merge would use the old key, or its parts hold the old
        columns); a table asked for is not in it; or a new copy was asked for (``need.asked``)
        and it is STAGED: a staged snapshot whose merge was refused (a key conflict, a schema the
        target cannot take) would otherwise come back unchanged, run after run. Nothing
        committed is lost: the committed position is not moved, and a first snapshot's window
        held nothing committed."""
        window = self.store.open_window(self.spec.sync_id)
        if window is None or window.kind is not WindowKind.SNAPSHOT:
            return None
        if window.state not in (WindowState.PLANNED, WindowState.STAGED):
            return None  # MERGED: its rows are in Delta, only its commit is left
        tables = self._window_tables(window.seq)
        wanted = () if need is None else need.fresh
        missing = [t for t in wanted if t not in tables]
        changed = changed_choice(window, tables, chosen_keys, self._columns, self._config())
        why = None if changed is None else changed[1]
        if why is None and missing:
            why = f"table(s) {missing} asked for and not in it"
        if why is None and need is not None and need.asked and window.state is WindowState.STAGED:
            why = f"a re-snapshot of {list(need.tables)} asked for"
        if why is None:
            return None
        self._windows.replace(window, why)
        return tuple(t for t in self.spec.tables if t in tables or t in wanted)

    def _window_tables(self, seq: int) -> tuple[str, ...]:
        """The tables an unfinished snapshot window was planned with (its progress rows)."""
        recorded = {p.table for p in self.store.progress(self.spec.sync_id, seq)}
        return tuple(t for t in self.spec.tables if t in recorded) or self.spec.tables

    def _plan_snapshot(self, tables: Sequence[str], split: GroupSplit | None = None) -> int:
        """A new snapshot window from an empty position on every shard, with its tables (what a
        resume copies: a kill before this copies every table). With ``split``, the shards are
        laid out in groups as a catch-up's are (``capture/group_layout.py``): each group copies
        its own (fewer than two groups: one process copies them all)."""
        # A copy from a replica holds what it had applied (``vstream/source_clock.py``): its time
        # is the source's then, not the plan's (a primary's: the plan's, ``created_at``).
        stop, copied_as_of, lag = stop_and_time(
            self.hook,
            self.spec.keyspace,
            self._target.tablet_type,
            self._stop_position,
            f"sync {self.spec.sync_id!r}: the snapshot",
        )
        start = Vgtid(tuple(ShardGtid(sg.keyspace, sg.shard, "") for sg in stop.shard_gtids))
        groups: list[list[str]] = []
        if split is not None:
            try:
                groups = layout([sg.shard for sg in start.shard_gtids], split)
            except SplitMismatchError as exc:
                log.warning("sync %r: %s; this snapshot is copied by one process", self.spec.sync_id, exc)
        groups = groups if len(groups) >= 2 else []
        # Recorded with the plan: a run that resumes the window finds the new choice recorded
        # already and could not tell (capture/run.py _record_sync).
        marks = {COLUMN_CHOICE_CHANGED: list(self._choice_changed)} if self._choice_changed else {}
        seq = self.store.plan_window(
            self.spec.sync_id,
            WindowKind.SNAPSHOT,
            start,
            None,
            copied_as_of if lag else None,
            groups=groups or None,
            stats={**marks, **lag},
        )
        for table in tables:
            self.store.update_progress(self.spec.sync_id, seq, table, phase=Phase.COPYING)
        if groups:
            self._record_key_progress(seq, tables)  # once, not by every group
        return seq

    def _run_snapshot(
        self,
        seq: int,
        start: Vgtid,
        resumed: bool,
        every: int,
        tables: tuple[str, ...],
        stall: float,
        group: WindowGroup | None = None,
    ) -> WindowOutcome:
        """The copy of ``tables`` from ``start`` (or the last checkpoint): the window's, or with
        ``group`` that shard group's part only: its shards, its parts, resume position and
        progress rows; the other groups' are left alone."""
        spec = self.spec
        g = None if group is None else group.group
        kept = self.store.parts(spec.sync_id, seq, group=g)
        previous: Mapping[str, TableProgress | GroupProgress]
        if group is None:
            WindowStager.discard_uncommitted(
                spec.staging_location,
                spec.sync_id,
                seq,
                [p.path for p in kept],
                storage_options=spec.storage_options,
            )
            position = self.store.resume_vgtid(spec.sync_id, seq) or start
            previous = {p.table: p for p in self.store.progress(spec.sync_id, seq)}
        else:
            delete_group_files(
                spec.staging_location,
                spec.sync_id,
                seq,
                group.group,
                spec.storage_options,
                [p.path for p in kept],
            )
            start = restrict(start, group.shards)
            # Resumed from its own last checkpoint; a group killed before its first starts over.
            resumed, position = group.resume_vgtid is not None, group.resume_vgtid or start
            previous = by_table(self.store.group_progress(spec.sync_id, seq), group.group) if resumed else {}
        remaining = [t for t in tables if t not in previous or previous[t].phase is not Phase.COPIED]
        tracker = ProgressTracker(tables, emit=self._emit, interval=self._progress_interval)
        for table, p in previous.items():
            if table in tracker.tables:
                tracker.tables[table].rows_copied = p.rows_copied or 0
                tracker.tables[table].rows_known = p.rows_known
        shards = () if group is None else group.shards
        if group is not None:  # the group's rows as this run starts (a fresh start: from zero)
            for table, progress in tracker.tables.items():
                phase = Phase.COPYING if table in remaining else Phase.COPIED
                self.store.update_progress(
                    spec.sync_id, seq, table, rows_copied=progress.rows_copied, phase=phase, group=g
                )
        counter = threading.Thread(target=self._count_rows, args=(seq, tracker, shards, g), daemon=True)
        counter.start()

        record = None
        if group is None:
            stager = self._stager(seq, tables)
        else:
            stager, record = self._group_part(seq, group.group)
        flags = self._target.flags(heartbeat_interval=spec.heartbeat_interval)
        if resumed:
            # See the module docstring: without this, Vitess recopies finished tables.
            flags.tables_to_copy.extend(remaining)
        # A table is COPIED only once the checkpointed position shows it copied on every shard:
        # a rerun leaves it out of tables_to_copy, on all shards at once.
        copied_tables = CopiedTables(remaining, copied=set(tables) - set(remaining))

        def on_checkpoint(resume_at: Vgtid) -> None:
            parts = stager.checkpoint()
            done = copied_tables.at(resume_at)
            # The phases in the position's own transaction: a kill between the two would resume
            # from a position past a table still marked COPYING, and copy it again.
            phases = {
                table: (progress.rows_copied, Phase.COPIED if table in done else Phase.COPYING)
                for table, progress in tracker.tables.items()
            }
            recorded = [_store_part(p) for p in parts]
            self.store.record_parts(spec.sync_id, seq, recorded, resume_at, group=g, copied=phases)

        def copied() -> None:
            tracker.report()
            for table, progress in tracker.tables.items():
                self.store.update_progress(
                    spec.sync_id, seq, table, rows_copied=progress.rows_copied, phase=Phase.COPIED, group=g
                )

        reader = self._reader(
            stager,
            tables,
            position,
            None,
            flags=flags,
            checkpoint_every_rows=every,
            checkpoint_every_bytes=CHECKPOINT_EVERY_BYTES,
            on_checkpoint=on_checkpoint,
            on_rows=tracker.add_copied,
            copy_stall_seconds=stall,
        )
        parts = [_staged_part(p) for p in kept]
        return self._stage(
            seq,
            WindowKind.SNAPSHOT,
            resumed,
            reader,
            stager,
            start,
            None,
            parts,
            copied,
            record=record,
        )

    def _count_rows(
        self, seq: int, tracker: ProgressTracker, shards: Sequence[str] = (), group: int | None = None
    ) -> None:
        """``rows_known`` per table (``shards``: of a group's shards only), concurrently with the
        copy (it may take a while)."""
        for table in tracker.tables:
            try:
                rows = source.count_rows(self.hook, self.spec.keyspace, table, shards)
            except Exception as exc:  # progress is best effort: the copy goes on without a percent
                log.warning("count(*) of %s.%s %s failed: %s", self.spec.keyspace, table, list(shards), exc)
                continue
            tracker.set_known(table, rows)
            self.store.update_progress(self.spec.sync_id, seq, table, rows_known=rows, group=group)
