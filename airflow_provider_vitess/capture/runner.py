"""Snapshot and catch-up runs of one sync: the read side of the window state machine.

Each run holds the sync's lock, resumes the sync's unfinished window if there is one, and
leaves it STAGED (manifest written) for the merge. Nothing here advances the committed
checkpoint: only a MERGED window may do that (see :mod:`airflow_provider_vitess.checkpoints`).

* Snapshot: the VStream copy phase from an empty position on every shard, checkpointed every
  ``checkpoint_every_rows`` rows (staged parts + VGTID with table last-PKs, one transaction), so a
  killed snapshot resumes where it was. Vitess v0.23 copies *every* filtered table that is absent
  from the VGTID's table last-PKs when a copy resumes (finished tables included), so a resume
  passes ``tables_to_copy`` = the tables not yet copied on every shard.
* Catch-up: from the committed VGTID to the stop position captured when the window was planned
  and stored with it, so a rerun of a killed window reads exactly the same changes again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow_provider_vitess.capture import row_images, source
from airflow_provider_vitess.capture.outcome import SnapshotNeed, WindowOutcome, shard_lag
from airflow_provider_vitess.capture.progress import LiveCopyProgress, ProgressTracker
from airflow_provider_vitess.capture.resume import WindowBook
from airflow_provider_vitess.capture.spec import SyncSpec
from airflow_provider_vitess.capture.table_list import REMOVED_TABLES, TableListChange, table_list_change
from airflow_provider_vitess.checkpoints import (
    WINDOW_KEYS,
    CheckpointStore,
    Part,
    Phase,
    SyncLock,
    Window,
    WindowKind,
    WindowState,
)
from airflow_provider_vitess.checkpoints.history import sync as sync_info
from airflow_provider_vitess.checkpoints.locking import TASK_STALE_AFTER
from airflow_provider_vitess.exceptions import (
    CheckpointError,
    InvalidVgtidError,
    TableListChangedError,
    UnknownTableError,
    VStreamError,
)
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.keys import KeyChoice, reconcile_keys
from airflow_provider_vitess.staging import PartInfo, WindowStager
from airflow_provider_vitess.utils.heap import frozen_heap
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream import moves
from airflow_provider_vitess.vstream.copy_state import CopiedTables
from airflow_provider_vitess.vstream.request import StreamTarget
from airflow_provider_vitess.vstream.spill import spill_directory
from airflow_provider_vitess.vstream.window import ReadBounds, ReadResult, WindowReader, capture_stop_position

__all__ = ["CHECKPOINT_EVERY_ROWS", "CaptureRunner", "SnapshotNeed", "SyncSpec", "WindowOutcome"]

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


class CaptureRunner:
    """Runs the read side of one sync against one vtgate and one checkpoint store.

    :param holder: who holds the sync's lock while running (shown to a concurrent run).
    :param dag_id: the Airflow DAG running it, recorded in the sync's config (``dags``): the
        status page shows a sync only to users who may read one of its DAGs.
    """

    def __init__(
        self,
        hook: VitessClient,
        store: CheckpointStore,
        spec: SyncSpec,
        *,
        holder: str,
        dag_id: str | None = None,
        emit_progress: Callable[[LiveCopyProgress], None] | None = None,
        progress_interval: float = 10.0,
        lock_stale_after: timedelta = TASK_STALE_AFTER,
    ) -> None:
        self.hook, self.store, self.spec, self.holder = hook, store, spec, holder
        self.dag_id = dag_id
        self._stale_after = lock_stale_after
        self._emit = emit_progress or (lambda p: log.info("snapshot progress: %s", p.line()))
        self._progress_interval = progress_interval
        self._keys: dict[str, KeyChoice] = {}
        self._writer_id: str | None = None
        self._windows = WindowBook(store, spec.sync_id, spec.staging_location, spec.storage_options, holder)
        # For cancel(): the lock held and the stream open now (one at a time per run).
        self._lock: SyncLock | None = None
        self._stream: Any = None
        self._cancelled = threading.Event()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The sync's lock, heartbeated; every store write under it is fenced by its token, and
        the files this run stages are named with it."""
        with self.store.hold(self.spec.sync_id, self.holder, self._stale_after) as handle:
            self._writer_id, self._lock = handle.token[:12], handle
            try:
                yield
            finally:
                self._lock = None

    def _open(self, request: Any) -> Any:
        # No deadline: a long backlog streams as long as it needs. A dead link is found by gRPC
        # keepalive and by the reader's heartbeat watchdog, and reopened from the last VGTID.
        if self._cancelled.is_set():
            raise VStreamError(f"sync {self.spec.sync_id!r}: the run was cancelled (task killed)")
        self._stream = self.hook.open_vstream_raw(request)
        return self._stream

    def cancel(self) -> None:
        """Stops a run from another thread (a killed task's ``on_kill``): cancels the open
        stream, so the read fails at once and its stager deletes what it had not recorded, and
        releases the sync's lock, so a rerun need not wait for it to go stale."""
        self._cancelled.set()
        cancel = getattr(self._stream, "cancel", None)
        if callable(cancel):
            cancel()
        lock = self._lock
        if lock is not None and lock.release():
            log.warning("sync %r: run cancelled, lock released (%s)", self.spec.sync_id, self.holder)

    @property
    def _target(self) -> StreamTarget:
        """The tablet type (PRIMARY, REPLICA, RDONLY) and cells of the connection every read uses."""
        return StreamTarget.of(self.hook.config)

    def _stop_position(self) -> Vgtid:
        return capture_stop_position(self._open, self.spec.keyspace, target=self._target)

    def _check_source(self) -> dict[str, KeyChoice]:
        """Before the lock: no table was moved to another keyspace, the keyspace and tables exist,
        and each table's key as chosen now."""
        spill_directory(self.spec.memory.spill_dir)  # a wrong setting fails before any read
        moves.refuse_moved(self.hook, self.spec.sync_id, self.spec.keyspace, self.spec.tables)
        row_images.refuse_inexact_images(
            self.hook, self.spec.sync_id, self.spec.keyspace, self._target.tablet_type
        )
        source.validate(self.hook, self.spec.keyspace, list(self.spec.tables))
        self.store.migrate()
        return self.spec.key_choices(self.hook)

    def _config(self) -> dict[str, Any]:
        try:
            return self.store.sync_config(self.spec.sync_id)
        except CheckpointError:  # a new sync
            return {}

    def _record_sync(self, chosen: Mapping[str, KeyChoice], snapshot_of: Sequence[str] = ()) -> None:
        """Under the lock: the sync's config, with the key each table's Delta table is built
        with. Only a (re-)snapshot of a table records a new key for it; a catch-up whose chosen
        key differs from the recorded one is refused (``KeyChangedError``) before it reads."""
        config = self._config()
        recorded = {t: KeyChoice.from_dict(c) for t, c in dict(config.get("keys") or {}).items()}
        change = self._table_list_change(config)
        pending = [t for t in change.to_snapshot if t not in snapshot_of]
        if pending:
            raise TableListChangedError(
                f"sync {self.spec.sync_id!r}: table(s) {pending} joined the sync's tables (new, or back "
                "after leaving it) and have no complete Delta table yet; nothing was read. Their "
                "snapshot comes first: run the DAG's snapshot task (it copies them on its own), or "
                f'trigger it with {{"resnapshot_tables": {pending}}}'
            )
        for table, seq in change.removed.items():
            if table not in dict(config.get(REMOVED_TABLES) or {}):
                log.warning(
                    "sync %r: table %r left the sync's tables; its Delta table stays as of window %d",
                    self.spec.sync_id,
                    table,
                    seq,
                )
        self._keys = reconcile_keys(self.spec.sync_id, recorded, chosen, snapshot_of)
        self.store.ensure_sync(
            self.spec.sync_id,
            self.spec.keyspace,
            self.spec.tables,
            {
                "staging": self.spec.staging_location,
                "keys": {t: choice.to_dict() for t, choice in self._keys.items()},
                # The source's name in lineage (the merge task has no Vitess connection).
                "vtgate": self.hook.config.grpc_target,
                REMOVED_TABLES: change.after_snapshot_of(snapshot_of),
                # Who may read its status: users of these DAGs (plugins/status.py).
                "dags": sorted(set(config.get("dags") or ()) | ({self.dag_id} if self.dag_id else set())),
            },
        )

    def _table_list_change(self, config: Mapping[str, Any]) -> TableListChange:
        """How the sync's tables changed since its last run (see ``capture/table_list.py``)."""
        info = sync_info(self.store.engine, self.spec.sync_id)
        return table_list_change(
            None if info is None else info.tables,
            config.get(REMOVED_TABLES),
            self.spec.tables,
            self.store.committed(self.spec.sync_id)[1],
        )

    def _staged_key_columns(self) -> dict[str, tuple[str, ...]]:
        """The columns whose before image is staged: the source key, plus the source columns
        feeding a different target key (an update of those must delete the old target row)."""
        return {
            t: tuple(dict.fromkeys(c.source_columns + c.target_from_source)) for t, c in self._keys.items()
        }

    def _stager(self, seq: int, tables: Sequence[str]) -> WindowStager:
        for table in tables:
            choice = self._keys[table]
            self.store.update_progress(
                self.spec.sync_id,
                seq,
                table,
                key_columns=list(choice.source_columns),
                key_source=choice.reason,
            )
        return WindowStager(
            self.spec.staging_location,
            self.spec.sync_id,
            seq,
            key_columns=self._staged_key_columns(),
            storage_options=self.spec.storage_options,
            writer_id=self._writer_id,
            zero_dates=self.spec.zero_dates,
        )

    def _check_keyspace(self, vgtid: Vgtid, what: str) -> None:
        other = sorted(set(vgtid.keyspaces) - {self.spec.keyspace})
        if other:
            raise InvalidVgtidError(
                f"{what} of sync {self.spec.sync_id!r} is a VGTID of keyspace(s) {', '.join(other)}, "
                f"not of {self.spec.keyspace!r}"
            )

    def _resume(
        self,
        kind: WindowKind,
        chosen_keys: Mapping[str, KeyChoice],
        snapshot_of: Sequence[str] = (),
        extend: bool = False,
    ) -> WindowOutcome | Window | None:
        """Under the lock, the window to work on: the outcome of one staged already, the
        unfinished (PLANNED) one to resume, or None to plan a new one (with ``extend``, also
        after a STAGED one). A re-snapshot abandons an unfinished catch-up (see
        ``WindowBook.unfinished``)."""
        resnapshot = kind is WindowKind.SNAPSHOT and self.store.committed(self.spec.sync_id)[0] is not None
        window = self._windows.unfinished(
            kind, discard=resnapshot, reason=f"a re-snapshot of {list(snapshot_of)}"
        )
        self._record_sync(chosen_keys, snapshot_of=snapshot_of)
        if window is None or window.state is WindowState.PLANNED:
            return window
        if extend and window.state is WindowState.STAGED:
            return None  # the next window follows it
        return self._windows.already_staged(window)  # None: lost, discarded, read afresh

    def recheck_staged(self) -> list[int]:
        """Under the lock: every STAGED window before the latest one (a chain no merge took yet;
        the latest is checked when a catch-up finds it) still has its files. The first that does
        not is discarded with the windows after it (``WindowBook.discard_lost``); returns the
        seqs left STAGED before it."""
        with self._locked():
            kept: list[int] = []
            for window in self.store.open_windows(self.spec.sync_id)[:-1]:
                if window.state is WindowState.STAGED:
                    if self._windows.already_staged(window) is None:
                        break
                    kept.append(window.seq)
            return kept

    # ----- snapshot ------------------------------------------------------------------------

    def snapshot_need(self, requested: Sequence[str] = (), *, only_if_needed: bool = True) -> SnapshotNeed:
        """Does a snapshot task have work? Yes for a new sync, a resumed snapshot, ``requested``
        tables (a re-snapshot) or ``only_if_needed=False``; no for a sync that already streams."""
        committed, seq = self.store.committed(self.spec.sync_id)
        window = self.store.open_window(self.spec.sync_id)
        resuming = window is not None and window.kind is WindowKind.SNAPSHOT
        # Tables that joined the list since the last run are copied on their own first.
        joined = () if committed is None else self._table_list_change(self._config()).to_snapshot
        needed = committed is None or bool(requested) or bool(joined) or resuming or not only_if_needed
        # A resumed snapshot keeps its own tables, whatever is asked now (see snapshot()).
        tables = tuple(dict.fromkeys((*requested, *joined))) or self.spec.tables
        return SnapshotNeed(needed, tables, resnapshot=committed is not None, committed_seq=seq)

    def snapshot(
        self, *, tables: Sequence[str] | None = None, checkpoint_every_rows: int = CHECKPOINT_EVERY_ROWS
    ) -> WindowOutcome:
        """Copy ``tables`` (default: all the sync's tables) and stage them as one window.

        Once the sync streams, this is a re-snapshot of those tables: committing it leaves the
        sync's position where the other tables are (see ``CheckpointStore.commit``). A killed
        snapshot resumes with the tables it was started with, whatever ``tables`` says now.
        """
        spec = self.spec
        chosen = tuple(tables) if tables else spec.tables
        unknown = sorted(set(chosen) - set(spec.tables))
        if unknown:
            raise UnknownTableError(
                f"sync {spec.sync_id!r} cannot snapshot {unknown}: not among its tables {list(spec.tables)}"
            )
        chosen_keys = self._check_source()
        with self._locked():
            window = self._resume(WindowKind.SNAPSHOT, chosen_keys, snapshot_of=chosen)
            if isinstance(window, WindowOutcome):
                return window
            if window is None:
                stop = self._stop_position()
                start = Vgtid(tuple(ShardGtid(sg.keyspace, sg.shard, "") for sg in stop.shard_gtids))
                seq = self.store.plan_window(spec.sync_id, WindowKind.SNAPSHOT, start, None)
                for table in chosen:  # the window's tables, for a resume (a kill before this: all)
                    self.store.update_progress(spec.sync_id, seq, table, phase=Phase.COPYING)
            else:
                seq, start = window.seq, window.start_vgtid
                recorded = {p.table for p in self.store.progress(spec.sync_id, seq)}
                chosen = tuple(t for t in spec.tables if t in recorded) or spec.tables
            self._check_keyspace(start, "the snapshot start")
            return self._run_snapshot(seq, start, window is not None, checkpoint_every_rows, chosen)

    def _run_snapshot(
        self, seq: int, start: Vgtid, resumed: bool, every: int, tables: tuple[str, ...]
    ) -> WindowOutcome:
        spec = self.spec
        adopted = self._windows.adopt_written_manifest(seq, WindowKind.SNAPSHOT) if resumed else None
        if adopted is not None:
            return adopted
        kept = self.store.parts(spec.sync_id, seq)
        WindowStager.discard_uncommitted(
            spec.staging_location,
            spec.sync_id,
            seq,
            [p.path for p in kept],
            storage_options=spec.storage_options,
        )
        position = self.store.resume_vgtid(spec.sync_id, seq) or start
        previous = {p.table: p for p in self.store.progress(spec.sync_id, seq)}
        remaining = [t for t in tables if t not in previous or previous[t].phase is not Phase.COPIED]
        tracker = ProgressTracker(tables, emit=self._emit, interval=self._progress_interval)
        for table, p in previous.items():
            if table in tracker.tables:
                tracker.tables[table].rows_copied = p.rows_copied or 0
                tracker.tables[table].rows_known = p.rows_known
        counter = threading.Thread(target=self._count_rows, args=(seq, tracker), daemon=True)
        counter.start()

        stager = self._stager(seq, tables)
        flags = self._target.flags(heartbeat_interval=spec.heartbeat_interval)
        if resumed:
            # See the module docstring: without this, Vitess recopies finished tables.
            flags.tables_to_copy.extend(remaining)
        # A table is COPIED only once the checkpointed position shows it copied on every shard:
        # a rerun leaves it out of tables_to_copy, on all shards at once.
        copied_tables = CopiedTables(remaining, copied=set(tables) - set(remaining))

        def on_checkpoint(resume_at: Vgtid) -> None:
            parts = stager.checkpoint()
            self.store.record_parts(spec.sync_id, seq, [_store_part(p) for p in parts], resume_at)
            copied = copied_tables.at(resume_at)
            for table, progress in tracker.tables.items():
                self.store.update_progress(
                    spec.sync_id,
                    seq,
                    table,
                    rows_copied=progress.rows_copied,
                    phase=Phase.COPIED if table in copied else Phase.COPYING,
                )

        def copied() -> None:
            tracker.report()
            for table, progress in tracker.tables.items():
                self.store.update_progress(
                    spec.sync_id, seq, table, rows_copied=progress.rows_copied, phase=Phase.COPIED
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
        )
        parts = [_staged_part(p) for p in kept]
        return self._stage(seq, WindowKind.SNAPSHOT, resumed, reader, stager, start, None, parts, copied)

    def _count_rows(self, seq: int, tracker: ProgressTracker) -> None:
        """``rows_known`` per table, concurrently with the copy (it may take a while)."""
        for table in tracker.tables:
            try:
                rows = source.count_rows(self.hook, self.spec.keyspace, table)
            except Exception as exc:  # progress is best effort: the copy goes on without a percent
                log.warning("count(*) of %s.%s failed: %s", self.spec.keyspace, table, exc)
                continue
            tracker.set_known(table, rows)
            self.store.update_progress(self.spec.sync_id, seq, table, rows_known=rows)

    # ----- catch-up ------------------------------------------------------------------------

    def catch_up(
        self, bounds: ReadBounds | None = None, *, extend: bool = False, stop: Vgtid | None = None
    ) -> WindowOutcome:
        """Stage one catch-up window (or resume the unfinished one, or return it if staged).

        ``extend``: when the sync's latest window is a STAGED catch-up, plan the next window
        from its end instead of returning it, up to ``stop`` (default: the keyspace's position
        now); how one run reads a long backlog as several windows (:mod:`.backlog`).
        """
        spec = self.spec
        chosen_keys = self._check_source()
        with self._locked():
            window = self._resume(WindowKind.CATCHUP, chosen_keys, extend=extend)
            if isinstance(window, WindowOutcome):
                return window
            if window is None:
                # The committed position, or the end of the STAGED windows before this one.
                start = self.store.next_catchup_start(spec.sync_id)
                if start is None:
                    raise CheckpointError(
                        f"sync {spec.sync_id!r} has no committed position: snapshot it first"
                    )
                self._check_keyspace(start, "the committed position")
                if stop is None:
                    stop = self._stop_position()
                seq = self.store.plan_window(spec.sync_id, WindowKind.CATCHUP, start, stop)
            else:
                seq, start = window.seq, window.start_vgtid
                if window.stop_vgtid is None:
                    raise CheckpointError(f"sync {spec.sync_id!r} catch-up window {seq} has no stop position")
                stop = window.stop_vgtid
                adopted = self._windows.adopt_written_manifest(seq, WindowKind.CATCHUP)
                if adopted is not None:
                    return adopted
            # A catch-up window is short: a rerun reads it again from its start, whole.
            WindowStager.discard_uncommitted(
                spec.staging_location, spec.sync_id, seq, [], storage_options=spec.storage_options
            )
            stager = self._stager(seq, spec.tables)
            flags = self._target.flags(
                heartbeat_interval=spec.heartbeat_interval, minimize_skew=spec.minimize_skew
            )
            reader = self._reader(
                stager, spec.tables, start, stop, flags=flags, bounds=bounds or ReadBounds()
            )
            return self._stage(seq, WindowKind.CATCHUP, window is not None, reader, stager, start, stop)

    # ----- the read-stage-record path both share -------------------------------------------

    def _reader(
        self, stager: WindowStager, tables: Sequence[str], start: Vgtid, stop: Vgtid | None, **options: Any
    ) -> WindowReader:
        return WindowReader(
            self._open,
            stager,
            keyspace=self.spec.keyspace,
            tables=tables,
            start=start,
            stop=stop,
            tablet_type=self._target.tablet_type,
            reset_connection=self.hook.reset_channel,
            memory=self.spec.memory,
            **options,
        )

    def _stage(
        self,
        seq: int,
        kind: WindowKind,
        resumed: bool,
        reader: WindowReader,
        stager: WindowStager,
        start: Vgtid,
        stop: Vgtid | None,
        kept: Sequence[PartInfo] = (),
        before_staged: Callable[[], None] | None = None,
    ) -> WindowOutcome:
        """Reads the window into ``stager``, writes its manifest and records it STAGED. A failed
        read deletes the files it staged, except a snapshot's checkpointed parts (it resumes)."""
        try:
            with frozen_heap():
                result = reader.run()
        except BaseException:
            stager.abort(keep_checkpointed=stop is None)
            raise
        stats = self._stats(result)
        if stop is not None:
            stats["shard_lag_transactions"] = lag = shard_lag(stop, result.end_vgtid, result.retired_shards)
            if any(lag.values()):
                log.info("window %d stopped early (%s); behind stop: %s", seq, result.stopped_early, lag)
        manifest = stager.finish(start, stop, result.end_vgtid, parts=kept, stats=stats)
        if before_staged is not None:
            before_staged()
        self.store.mark_staged(self.spec.sync_id, seq, result.end_vgtid, manifest.path, stats)
        return WindowOutcome(seq, kind, manifest, resumed, result)

    def _stats(self, result: ReadResult) -> dict[str, Any]:
        """The window's stats (manifest and store): counts, and the key each table was staged
        with, which is the key its merge uses (``WINDOW_KEYS``)."""
        return {
            WINDOW_KEYS: {t: choice.to_dict() for t, choice in self._keys.items()},
            "rows": result.rows,
            "units": result.units,
            "rows_per_table": result.rows_per_table,
            "stopped_early": result.stopped_early,
            "journals": result.journals,
            "retired_shards": result.retired_shards,
            **result.stats,
        }
