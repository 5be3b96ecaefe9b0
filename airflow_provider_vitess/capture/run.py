"""One run of a sync's read side, the base of its two jobs (:mod:`.snapshot`, :mod:`.catch_up`).

A run holds the sync's lock, checks the source once, records the sync's tables and keys, finds
the window to read (the one resume-or-plan step: ``SyncRun._window_to_read``) and reads it into
Parquet, leaving it STAGED for the merge. Nothing here advances the committed checkpoint: only a
MERGED window may do that (see :mod:`airflow_provider_vitess.checkpoints`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow_provider_vitess.capture import columns, row_images, source
from airflow_provider_vitess.capture.copy_positions import copy_positions
from airflow_provider_vitess.capture.outcome import WindowOutcome, shard_lag
from airflow_provider_vitess.capture.progress import LiveCopyProgress
from airflow_provider_vitess.capture.resume import WindowBook
from airflow_provider_vitess.capture.spec import SyncSpec
from airflow_provider_vitess.capture.table_list import REMOVED_TABLES, TableListChange, table_list_change
from airflow_provider_vitess.checkpoints import (
    WINDOW_KEYS,
    CheckpointStore,
    SyncLock,
    Window,
    WindowKind,
    WindowState,
)
from airflow_provider_vitess.checkpoints.committed import COPIED_AT
from airflow_provider_vitess.checkpoints.history import sync as sync_info
from airflow_provider_vitess.checkpoints.locking import TASK_STALE_AFTER
from airflow_provider_vitess.exceptions import (
    CheckpointError,
    InvalidVgtidError,
    TableListChangedError,
    VStreamError,
)
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.keys import KeyChoice, reconcile_keys
from airflow_provider_vitess.staging import Manifest, PartInfo, WindowStager
from airflow_provider_vitess.staging.files import group_manifest_name, group_writer_id, window_dir
from airflow_provider_vitess.staging.manifest import COLUMN_CHOICE_CHANGED, COPY_STARTED_AT
from airflow_provider_vitess.utils.heap import frozen_heap
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream import moves
from airflow_provider_vitess.vstream.request import StreamTarget
from airflow_provider_vitess.vstream.spill import spill_directory
from airflow_provider_vitess.vstream.window import ReadResult, WindowReader, capture_stop_position

log = logging.getLogger(__name__)


class SyncRun:
    """One run of one sync's read side against one vtgate and one checkpoint store.

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
        self._checked: dict[str, KeyChoice] | None = None  # the last _check_source's
        self._columns: dict[str, columns.ColumnChoice] = {}  # the last _check_source's too
        self._choice_changed: list[str] = []  # tables re-snapshotted with a new column choice
        self._copied_at: dict[str, Vgtid] = {}  # re-copied tables' copy positions (copy_positions)
        self._writer_id: str | None = None
        self._windows = WindowBook(store, spec.sync_id, spec.staging_location, spec.storage_options, holder)
        # For cancel(): the lock held and the stream open now (one at a time per run).
        self._lock: SyncLock | None = None
        self._stream: Any = None
        self._cancelled = threading.Event()

    @contextmanager
    def _locked(self, scope: str | None = None) -> Iterator[None]:
        """The sync's lock (or ``scope``'s: a shard group's, ``capture/groups.py``), heartbeated;
        every store write under it is fenced by its token, and the files this run stages are
        named with it."""
        with self.store.hold(scope or self.spec.sync_id, self.holder, self._stale_after) as handle:
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

    def _check_source(self, *, reuse: bool = False) -> dict[str, KeyChoice]:
        """Before the lock: no table was moved to another keyspace, the keyspace and tables exist,
        and each table's key as chosen now. ``reuse``: a backlog's later windows (one run) take
        its first window's check rather than ask information_schema again for every table; every
        other run checks afresh (a runner object may serve many runs)."""
        if not reuse or self._checked is None:
            self._checked = self._read_source()
            # Column control checked against the table now and its key (capture/columns.py).
            self._columns = self.spec.column_choices(self.hook, self._checked)
        return self._checked

    def _read_source(self) -> dict[str, KeyChoice]:
        spill_directory(self.spec.memory.spill_dir)  # a wrong setting fails before any read
        self.spec.hasher()  # hash_columns without a salt fail before any read
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

    def _record_sync(
        self, chosen: Mapping[str, KeyChoice], snapshot_of: Sequence[str] = (), resuming: bool = False
    ) -> None:
        """Under the lock: the sync's config, with the key and the column choice each table's
        Delta table is built with. Only a (re-)snapshot of a table records a new key or column
        choice for it; a catch-up whose chosen key or columns differ from the recorded ones is
        refused (``KeyChangedError``, ``ColumnsChangedError``) before it reads, and so is a
        ``resuming`` snapshot whose columns differ from those it started with."""
        config = self._config()
        recorded = {t: KeyChoice.from_dict(c) for t, c in dict(config.get("keys") or {}).items()}
        change = self._table_list_change(config)
        pending = [t for t in change.to_snapshot if t not in snapshot_of]
        if pending:
            raise TableListChangedError(
                f"sync {self.spec.sync_id!r}: table(s) {pending} joined the sync's tables (new, or back "
                "after leaving it) and have no complete Delta table yet; nothing was read. Their "
                "snapshot comes first: run the DAG's snapshot task (it copies them on its own), or "
                # JSON, as the trigger form takes it (a Python list's quotes are not JSON).
                f'trigger it with {{"resnapshot_tables": {json.dumps(pending)}}}'
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
        # A re-snapshot after a changed column choice: its merge replaces the table in every
        # mode (the past holds what the new choice hides; merge/job/steps). Planned, the window
        # records it (_plan_snapshot), so a resumed run, which finds the new choice recorded
        # already, still marks it (_stage).
        copied = [t for t in (() if resuming else snapshot_of) if t in recorded]
        before = self._built_columns(config) if copied else {}
        self._choice_changed = sorted(t for t in copied if _choice_changed(t, before, self._columns))
        column_record = columns.reconcile(
            self.spec.sync_id,
            dict(config.get(columns.WINDOW_COLUMNS) or {}),
            built=set(recorded),
            chosen=self._columns,
            tables=self.spec.tables,
            snapshot_of=() if resuming else snapshot_of,
        )
        self._copied_at = copy_positions(
            config.get(COPIED_AT), self.spec.tables, self.store.committed(self.spec.sync_id)[0]
        )
        self.store.ensure_sync(
            self.spec.sync_id,
            self.spec.keyspace,
            self.spec.tables,
            {
                "staging": self.spec.staging_location,
                "keys": {t: choice.to_dict() for t, choice in self._keys.items()},
                columns.WINDOW_COLUMNS: column_record,
                # The source's name in lineage (the merge task has no Vitess connection).
                "vtgate": self.hook.config.grpc_target,
                REMOVED_TABLES: change.after_snapshot_of(snapshot_of),
                COPIED_AT: {t: v.to_json() for t, v in self._copied_at.items()},
                # Who may read its status: users of these DAGs (plugins/status.py).
                "dags": sorted(set(config.get("dags") or ()) | ({self.dag_id} if self.dag_id else set())),
            },
        )

    def _built_columns(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Each table's column choice as its Delta table holds it: that of the sync's last
        committed window (its stats; a table not listed there had every column), else the sync's
        record. The record alone is not enough: a re-snapshot records its new choice before it
        plans its window, so a run killed in between leaves it recorded for a table still built
        with the old one."""
        recorded = dict(config.get(columns.WINDOW_COLUMNS) or {})
        seq = self.store.committed(self.spec.sync_id)[1]
        if not seq:
            return recorded
        try:
            stats = self.store.window(self.spec.sync_id, seq).stats or {}
        except CheckpointError:  # pruned: the record is what is left
            return recorded
        chosen = dict(stats.get(columns.WINDOW_COLUMNS) or {})
        return {t: {k: v for k, v in c.items() if k != "select"} for t, c in chosen.items()}

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

    def _group_part(self, seq: int, group: int) -> tuple[WindowStager, Callable[[Manifest], None]]:
        """The stager of shard group ``group``'s part of window ``seq`` (part files and manifest
        named with the group and this writer), and what records the staged part: the group
        STAGED with its end and manifest (``capture/groups.py``). Under the group's lock."""
        assert self._writer_id is not None
        writer = group_writer_id(group, self._writer_id)
        stager = self._stager(seq, [], writer_id=writer, manifest_name=group_manifest_name(group, writer))
        spec = self.spec

        def record(manifest: Manifest) -> None:
            path = f"{window_dir(spec.staging_location, spec.sync_id, seq)}/{stager.manifest_name}"
            end, stats = manifest.end_vgtid, dict(manifest.stats)
            self.store.mark_group_staged(spec.sync_id, seq, group, end, path, stats)

        return stager, record

    def _stager(self, seq: int, tables: Sequence[str], **options: Any) -> WindowStager:
        self._record_key_progress(seq, tables)
        return WindowStager(
            self.spec.staging_location,
            self.spec.sync_id,
            seq,
            key_columns=self._staged_key_columns(),
            storage_options=self.spec.storage_options,
            writer_id=options.pop("writer_id", self._writer_id),
            zero_dates=self.spec.zero_dates,
            hashing=self.spec.hasher(),
            **options,
        )

    def _record_key_progress(self, seq: int, tables: Sequence[str]) -> None:
        """Each table's key in the window's progress rows (the status page shows it)."""
        for table in tables:
            choice = self._keys[table]
            self.store.update_progress(
                self.spec.sync_id,
                seq,
                table,
                key_columns=list(choice.source_columns),
                key_source=choice.reason,
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
        # An unfinished window of this kind (being read, or staged and not merged yet) was read
        # with the recorded column choice: a new choice waits until it is done.
        resuming = window is not None and window.kind is kind
        self._record_sync(chosen_keys, snapshot_of=snapshot_of, resuming=resuming)
        if window is None or window.state is WindowState.PLANNED:
            return window
        if extend and window.state is WindowState.STAGED:
            return None  # the next window follows it
        return self._windows.already_staged(window)  # None: lost, discarded, read afresh

    def _window_to_read(
        self,
        kind: WindowKind,
        chosen_keys: Mapping[str, KeyChoice],
        plan: Callable[[], int],
        *,
        snapshot_of: Sequence[str] = (),
        extend: bool = False,
    ) -> WindowOutcome | tuple[Window, bool]:
        """Under the lock, both jobs' one resume-or-plan step: the outcome of a window staged
        already (or whose manifest a run killed before recording it wrote), else the window to
        read and whether it is resumed: the unfinished one, or a new one ``plan`` records (its
        seq)."""
        window = self._resume(kind, chosen_keys, snapshot_of=snapshot_of, extend=extend)
        if isinstance(window, WindowOutcome):
            return window
        if window is None:
            return self.store.window(self.spec.sync_id, plan()), False
        adopted = self._windows.adopt_written_manifest(window.seq, kind)
        return adopted if adopted is not None else (window, True)

    # ----- the read-stage-record path both jobs share ----------------------------------------

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
            columns={t: c.select for t, c in self._columns.items()},
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
        record: Callable[[Manifest], None] | None = None,
    ) -> WindowOutcome:
        """Reads the window into ``stager``, writes its manifest and records it STAGED (or, with
        ``record``, records it so: a shard group's part). A failed read deletes the files it
        staged, except a snapshot's checkpointed parts (it resumes)."""
        try:
            with frozen_heap():
                result = reader.run()
        except BaseException as exc:
            stager.abort(keep_checkpointed=stop is None)
            if isinstance(exc, VStreamError) and self._columns and columns.UNPROJECTABLE in str(exc):
                raise columns.unprojectable(self.spec.sync_id, self._columns, exc) from exc
            raise
        stats = self._stats(result)
        if kind is WindowKind.SNAPSHOT:
            window = self.store.window(self.spec.sync_id, seq)
            if window.created_at is not None:  # the second a re-snapshot's findings are dated at
                stats[COPY_STARTED_AT] = int(window.created_at.timestamp())
            # As planned (a resumed run or a shard group finds the new choice recorded already).
            changed = {*self._choice_changed, *(window.stats.get(COLUMN_CHOICE_CHANGED) or ())}
            if changed:
                stats[COLUMN_CHOICE_CHANGED] = sorted(changed)
        if stop is not None:
            stats["shard_lag_transactions"] = lag = shard_lag(stop, result.end_vgtid, result.retired_shards)
            if any(lag.values()):
                log.info("window %d stopped early (%s); behind stop: %s", seq, result.stopped_early, lag)
        manifest = stager.finish(start, stop, result.end_vgtid, parts=kept, stats=stats)
        if before_staged is not None:
            before_staged()
        if record is not None:
            record(manifest)
        else:
            self.store.mark_staged(self.spec.sync_id, seq, result.end_vgtid, manifest.path, stats)
        return WindowOutcome(seq, kind, manifest, resumed, result)

    def _stats(self, result: ReadResult) -> dict[str, Any]:
        """The window's stats (manifest and store): counts, and the key each table was staged
        with, which is the key its merge uses (``WINDOW_KEYS``)."""
        # Only tables under column control: a window of a sync without any stays as before.
        chosen = {t: c.stats() for t, c in self._columns.items()}
        return {
            WINDOW_KEYS: {t: choice.to_dict() for t, choice in self._keys.items()},
            **({columns.WINDOW_COLUMNS: chosen} if chosen else {}),
            "rows": result.rows,
            "units": result.units,
            "rows_per_table": result.rows_per_table,
            "stopped_early": result.stopped_early,
            "journals": result.journals,
            "retired_shards": result.retired_shards,
            **result.stats,
        }


def _choice_changed(
    table: str, recorded: Mapping[str, Any], chosen: Mapping[str, columns.ColumnChoice]
) -> bool:
    """Whether ``table``'s column choice now differs in effect from the one its table was built with."""
    choice = chosen.get(table)
    now = (choice.given if choice is not None else columns.ALL_COLUMNS).record()
    before = dict(recorded.get(table) or columns.ALL_COLUMNS.record())
    return before != now and not (choice is not None and choice.same_effect(before))
