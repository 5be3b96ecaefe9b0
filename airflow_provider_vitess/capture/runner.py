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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_vitess.capture import source
from airflow_provider_vitess.capture.progress import ProgressTracker, TableProgress
from airflow_provider_vitess.checkpoints import (
    WINDOW_KEYS,
    CheckpointStore,
    Part,
    Phase,
    Window,
    WindowKind,
    WindowState,
)
from airflow_provider_vitess.exceptions import (
    CheckpointError,
    CorruptStagedDataError,
    InvalidVgtidError,
    UnknownTableError,
)
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import KeyChoice, KeyOverrides, choose_key, reconcile_keys, table_shape
from airflow_provider_vitess.staging import Manifest, PartInfo, WindowStager, load_manifest, verify
from airflow_provider_vitess.staging.retention import delete_window
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid, transactions_missing
from airflow_provider_vitess.vstream.window import ReadBounds, ReadResult, WindowReader, capture_stop_position

log = logging.getLogger(__name__)

# Rows between two snapshot checkpoints. Each checkpoint closes the open parts and records them
# with the copy's position in the store (a few commits); at 50,000 rows that was ~10% of a
# copy's wall time once the copy ran near stream speed. A kill recopies at most this many rows
# (plus the copy batch in flight, ~4,000): a second or two of copying.
CHECKPOINT_EVERY_ROWS = 250_000


@dataclass(frozen=True)
class SyncSpec:
    """What one sync mirrors and where it stages."""

    sync_id: str
    keyspace: str
    tables: tuple[str, ...]
    staging_location: str
    # May hold object-store credentials (from an aws connection): kept out of repr and logs.
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    # Explicit staged key per table (skips the key choice); otherwise the key is chosen by the
    # VReplication rules from the table's indexes, with ``key_overrides`` applied.
    key_columns: Mapping[str, Sequence[str]] = field(default_factory=dict)
    key_overrides: Mapping[str, KeyOverrides] = field(default_factory=dict)
    allow_all_columns_key: bool = False
    heartbeat_interval: int = 1
    minimize_skew: bool = False
    # What zero/invalid DATE/DATETIME/TIMESTAMP values are staged as, in both phases.
    zero_dates: ZeroDatePolicies = field(default_factory=ZeroDatePolicies)


@dataclass(frozen=True)
class WindowOutcome:
    seq: int
    kind: WindowKind
    manifest: Manifest
    resumed: bool
    result: ReadResult | None  # None when the window had already been staged


def _lag(stop: Vgtid, reached: Vgtid, retired: Sequence[str] = ()) -> dict[str, int]:
    """Per shard, transactions of the stop position not yet read: 0 once a window is complete
    (also for a stop shard a reshard's journal retired: it has nothing more to read)."""
    lag = {}
    for sg in stop.shard_gtids:
        name = f"{sg.keyspace}/{sg.shard}"
        got = reached.shard(sg.keyspace, sg.shard)
        if got is None and name in retired:
            lag[name] = 0
            continue
        lag[name] = transactions_missing(got.gtid, sg.gtid) if got is not None and got.gtid else -1
    return lag


def _store_part(p: PartInfo) -> Part:
    return Part(path=p.path, table=p.table, rows=p.rows, bytes=p.bytes, sha256=p.sha256, detail=p.to_dict())


def _staged_part(p: Part) -> PartInfo:
    return PartInfo.from_dict(p.detail)


class CaptureRunner:
    """Runs the read side of one sync against one vtgate and one checkpoint store.

    :param holder: who holds the sync's lock while running (shown to a concurrent run).
    """

    def __init__(
        self,
        hook: VitessHook,
        store: CheckpointStore,
        spec: SyncSpec,
        *,
        holder: str,
        emit_progress: Callable[[TableProgress], None] | None = None,
        progress_interval: float = 10.0,
        lock_stale_after: timedelta = timedelta(minutes=2),
    ) -> None:
        self.hook, self.store, self.spec, self.holder = hook, store, spec, holder
        self._stale_after = lock_stale_after
        self._emit = emit_progress or (lambda p: log.info("snapshot progress: %s", p.line()))
        self._progress_interval = progress_interval
        self._keys: dict[str, KeyChoice] = {}
        self._writer_id: str | None = None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The sync's lock, heartbeated; every store write under it is fenced by its token, and
        the files this run stages are named with it."""
        with self.store.hold(self.spec.sync_id, self.holder, self._stale_after) as handle:
            self._writer_id = handle.token[:12]
            yield

    def _open(self, request: Any) -> Any:
        # No deadline: a long backlog streams as long as it needs. A dead link is found by gRPC
        # keepalive and by the reader's heartbeat watchdog, and reopened from the last VGTID.
        return self.hook.open_vstream_raw(request)

    @property
    def _tablet_type(self) -> str:
        """The tablet type of the connection (PRIMARY, REPLICA, RDONLY) every read uses."""
        return self.hook.config.tablet_type

    def _check_source(self) -> dict[str, KeyChoice]:
        """Before the lock: the keyspace and tables exist, and each table's key as chosen now."""
        source.validate(self.hook, self.spec.keyspace, list(self.spec.tables))
        self.store.migrate()
        return self.key_choices()

    def _record_sync(self, chosen: Mapping[str, KeyChoice], snapshot_of: Sequence[str] = ()) -> None:
        """Under the lock: the sync's config, with the key each table's Delta table is built
        with. Only a (re-)snapshot of a table records a new key for it; a catch-up whose chosen
        key differs from the recorded one is refused (``KeyChangedError``) before it reads."""
        try:
            config = self.store.sync_config(self.spec.sync_id)
        except CheckpointError:  # a new sync
            config = {}
        recorded = {t: KeyChoice.from_dict(c) for t, c in dict(config.get("keys") or {}).items()}
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
            },
        )

    def key_choices(self) -> dict[str, KeyChoice]:
        """Each table's key: given in ``key_columns``, else chosen from its indexes (and overrides)."""
        choices = {}
        for table in self.spec.tables:
            given = self.spec.key_columns.get(table)
            if given:
                cols = tuple(given)
                choices[table] = KeyChoice(table, cols, cols, None, "given as key_columns", cols)
            else:
                choices[table] = choose_key(
                    table_shape(self.hook, self.spec.keyspace, table),
                    self.spec.key_overrides.get(table),
                    allow_all_columns_key=self.spec.allow_all_columns_key,
                )
        return choices

    def _staged_key_columns(self) -> dict[str, tuple[str, ...]]:
        """The columns whose before image is staged: the source key, plus the source columns
        feeding a different target key (an update of those must delete the old target row)."""
        return {
            t: tuple(dict.fromkeys(c.source_columns + c.target_from_source)) for t, c in self._keys.items()
        }

    def _record_keys(self, seq: int, tables: Sequence[str]) -> None:
        for table in tables:
            choice = self._keys[table]
            self.store.update_progress(
                self.spec.sync_id,
                seq,
                table,
                key_columns=list(choice.source_columns),
                key_source=choice.reason,
            )

    def _stager(self, seq: int, tables: Sequence[str]) -> WindowStager:
        self._record_keys(seq, tables)
        return WindowStager(
            self.spec.staging_location,
            self.spec.sync_id,
            seq,
            key_columns=self._staged_key_columns(),
            storage_options=self.spec.storage_options,
            writer_id=self._writer_id,
            zero_dates=self.spec.zero_dates,
        )

    def _unfinished(self, kind: WindowKind, *, discard: bool = False, reason: str = "") -> Window | None:
        """The sync's unfinished window, which must be of ``kind``: windows never interleave.

        With ``discard``, an unfinished window of the other kind that is not merged yet is
        abandoned (FAILED) instead: a re-snapshot is the way out of a window that cannot be
        staged or merged (a value no policy accepts, a schema change Delta cannot take). Nothing
        is lost: the checkpoint has not moved, so the next catch-up reads those changes again.
        """
        window = self.store.open_window(self.spec.sync_id)
        if window is None or window.kind is kind:
            return window
        if discard and window.state in (WindowState.PLANNED, WindowState.STAGED):
            message = f"discarded by {reason} ({self.holder})"
            self.store.discard_unmerged(self.spec.sync_id, message)  # with STAGED ones before it
            log.warning(
                "sync %r: unfinished %s window %d (%s) %s; the next catch-up reads its changes again "
                "from the committed position",
                self.spec.sync_id,
                window.kind.value,
                window.seq,
                window.state.value,
                message,
            )
            return None
        remedy = (
            "its merge task commits it (clear that task if it failed)"
            if window.state is WindowState.MERGED
            else f"its {'snapshot' if window.kind is WindowKind.SNAPSHOT else 'catch_up'} task resumes it"
        )
        raise CheckpointError(
            f"sync {self.spec.sync_id!r} has an unfinished {window.kind.value} window {window.seq} "
            f"({window.state.value}); finish it before a {kind.value}: {remedy}"
        )

    def _already_staged(self, window: Window) -> WindowOutcome | None:
        """The outcome of a window staged by an earlier run, or None when its staged files are
        lost or corrupt and the window was discarded (see :meth:`_discard_lost`)."""
        seq, kind = window.seq, window.kind
        try:
            manifest = load_manifest(
                self.spec.staging_location, self.spec.sync_id, seq, storage_options=self.spec.storage_options
            )
            problem = "its manifest is missing" if manifest is None else None
            if manifest is not None and window.state is WindowState.STAGED:
                verify(manifest)
        except CorruptStagedDataError as exc:
            manifest, problem = None, str(exc)
        if manifest is not None:
            return WindowOutcome(seq, kind, manifest, resumed=True, result=None)
        if window.state is not WindowState.STAGED:
            # MERGED: its changes are in the target already; only its commit is left to do.
            raise CheckpointError(
                f"sync {self.spec.sync_id!r} window {seq} is {window.state.value} but {problem} in "
                f"{self.spec.staging_location!r}; run the merge task to commit it"
            )
        self._discard_lost(window, problem or "unreadable")
        return None

    def recheck_staged(self) -> list[int]:
        """Under the lock: every STAGED window before the latest one (a chain no merge took yet;
        the latest is checked when a catch-up finds it) still has its files. The first that does
        not is discarded with the windows after it (see :meth:`_discard_lost`); returns the seqs
        left STAGED before it."""
        with self._locked():
            kept: list[int] = []
            for window in self.store.open_windows(self.spec.sync_id)[:-1]:
                if window.state is WindowState.STAGED:
                    if self._already_staged(window) is None:
                        break
                    kept.append(window.seq)
            return kept

    def _discard_lost(self, window: Window, problem: str) -> None:
        """An uncommitted window whose staged files are lost or corrupt is re-readable: its changes
        are still in vtgate from its start VGTID on. Abandon it (FAILED) and delete what is left
        of it; the caller plans a new window from the committed position, as a run would have."""
        spec = self.spec
        log.warning(
            "sync %r window %d (%s) was staged but %s; discarding it and reading its changes again from %s",
            spec.sync_id,
            window.seq,
            window.kind.value,
            problem,
            window.start_vgtid.to_json(),
        )
        delete_window(spec.staging_location, spec.sync_id, window.seq, storage_options=spec.storage_options)
        # With the STAGED windows after it, which start where it ends.
        self.store.discard_unmerged(spec.sync_id, f"staged files lost or corrupt: {problem}", window.seq)

    def _adopt_written_manifest(self, seq: int, kind: WindowKind) -> WindowOutcome | None:
        """A run killed between writing the manifest and recording STAGED left a complete window:
        the manifest is written last, so its existence means every part is there. Record it."""
        manifest = load_manifest(
            self.spec.staging_location, self.spec.sync_id, seq, storage_options=self.spec.storage_options
        )
        if manifest is None:
            return None
        verify(manifest)
        self.store.mark_staged(
            self.spec.sync_id, seq, manifest.end_vgtid, manifest.path, dict(manifest.stats)
        )
        log.info(
            "sync %r window %d was staged by a run that stopped before recording it", self.spec.sync_id, seq
        )
        return WindowOutcome(seq, kind, manifest, resumed=True, result=None)

    def _check_keyspace(self, vgtid: Vgtid, what: str) -> None:
        other = sorted(set(vgtid.keyspaces) - {self.spec.keyspace})
        if other:
            raise InvalidVgtidError(
                f"{what} of sync {self.spec.sync_id!r} is a VGTID of keyspace(s) {', '.join(other)}, "
                f"not of {self.spec.keyspace!r}"
            )

    # ----- snapshot ------------------------------------------------------------------------

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
            committed, _ = self.store.committed(spec.sync_id)
            resnapshot = committed is not None
            window = self._unfinished(
                WindowKind.SNAPSHOT, discard=resnapshot, reason=f"a re-snapshot of {list(chosen)}"
            )
            self._record_sync(chosen_keys, snapshot_of=chosen)
            if window is not None and window.state is not WindowState.PLANNED:
                staged = self._already_staged(window)
                if staged is not None:
                    return staged
                window = None  # discarded: copy afresh
            resumed = window is not None
            if window is None:
                stop = capture_stop_position(self._open, spec.keyspace, tablet_type=self._tablet_type)
                start = Vgtid(tuple(ShardGtid(sg.keyspace, sg.shard, "") for sg in stop.shard_gtids))
                seq = self.store.plan_window(spec.sync_id, WindowKind.SNAPSHOT, start, None)
                for table in chosen:  # the window's tables, for a resume (a kill before this: all)
                    self.store.update_progress(spec.sync_id, seq, table, phase=Phase.COPYING)
            else:
                seq, start = window.seq, window.start_vgtid
                recorded = {p.table for p in self.store.progress(spec.sync_id, seq)}
                chosen = tuple(t for t in spec.tables if t in recorded) or spec.tables
            self._check_keyspace(start, "the snapshot start")
            return self._run_snapshot(seq, start, resumed, checkpoint_every_rows, chosen)

    def _run_snapshot(
        self, seq: int, start: Vgtid, resumed: bool, every: int, tables: tuple[str, ...]
    ) -> WindowOutcome:
        spec = self.spec
        adopted = self._adopt_written_manifest(seq, WindowKind.SNAPSHOT) if resumed else None
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
        flags = self.hook.vstream_flags(heartbeat_interval=spec.heartbeat_interval)
        if resumed:
            # See the module docstring: without this, Vitess recopies finished tables.
            flags.tables_to_copy.extend(remaining)
        copied_seen: dict[str, bool] = {}

        def on_checkpoint(resume_at: Vgtid) -> None:
            parts = stager.checkpoint()
            self.store.record_parts(spec.sync_id, seq, [_store_part(p) for p in parts], resume_at)
            in_progress = {pk.table_name for sg in resume_at.shard_gtids for pk in sg.table_last_pks}
            for table, progress in tracker.tables.items():
                if table in in_progress:
                    copied_seen[table] = True
                done = copied_seen.get(table) and table not in in_progress
                self.store.update_progress(
                    spec.sync_id,
                    seq,
                    table,
                    rows_copied=progress.rows_copied,
                    phase=Phase.COPIED if done else Phase.COPYING,
                )

        reader = WindowReader(
            self._open,
            stager,
            keyspace=spec.keyspace,
            tables=tables,
            start=position,
            stop=None,
            flags=flags,
            tablet_type=self._tablet_type,
            checkpoint_every_rows=every,
            on_checkpoint=on_checkpoint,
            on_rows=tracker.add_copied,
            reset_connection=self.hook.reset_channel,
        )
        try:
            result = reader.run()
        except BaseException:
            stager.abort(keep_checkpointed=True)
            raise
        tracker.report()
        stats = self._stats(result)
        manifest = stager.finish(
            start, None, result.end_vgtid, parts=[_staged_part(p) for p in kept], stats=stats
        )
        for table, progress in tracker.tables.items():
            self.store.update_progress(
                spec.sync_id, seq, table, rows_copied=progress.rows_copied, phase=Phase.COPIED
            )
        self.store.mark_staged(spec.sync_id, seq, result.end_vgtid, manifest.path, stats)
        return WindowOutcome(seq, WindowKind.SNAPSHOT, manifest, resumed, result)

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
            window = self._unfinished(WindowKind.CATCHUP)
            self._record_sync(chosen_keys)
            if extend and window is not None and window.state is WindowState.STAGED:
                window = None  # the next window follows it
            if window is not None and window.state is not WindowState.PLANNED:
                staged = self._already_staged(window)
                if staged is not None:
                    return staged
                window = None  # discarded: read again from the committed position
            resumed = window is not None
            if window is None:
                # The committed position, or the end of the STAGED windows before this one.
                start = self.store.next_catchup_start(spec.sync_id)
                if start is None:
                    raise CheckpointError(
                        f"sync {spec.sync_id!r} has no committed position: snapshot it first"
                    )
                self._check_keyspace(start, "the committed position")
                if stop is None:
                    stop = capture_stop_position(self._open, spec.keyspace, tablet_type=self._tablet_type)
                seq = self.store.plan_window(spec.sync_id, WindowKind.CATCHUP, start, stop)
            else:
                seq, start = window.seq, window.start_vgtid
                if window.stop_vgtid is None:
                    raise CheckpointError(f"sync {spec.sync_id!r} catch-up window {seq} has no stop position")
                stop = window.stop_vgtid
            adopted = self._adopt_written_manifest(seq, WindowKind.CATCHUP) if resumed else None
            if adopted is not None:
                return adopted
            # A catch-up window is short: a rerun reads it again from its start, whole.
            WindowStager.discard_uncommitted(
                spec.staging_location, spec.sync_id, seq, [], storage_options=spec.storage_options
            )
            stager = self._stager(seq, spec.tables)
            reader = WindowReader(
                self._open,
                stager,
                keyspace=spec.keyspace,
                tables=spec.tables,
                start=start,
                stop=stop,
                tablet_type=self._tablet_type,
                bounds=bounds or ReadBounds(),
                flags=self.hook.vstream_flags(
                    heartbeat_interval=spec.heartbeat_interval, minimize_skew=spec.minimize_skew
                ),
                reset_connection=self.hook.reset_channel,
            )
            try:
                result = reader.run()
            except BaseException:
                stager.abort()
                raise
            stats = {
                **self._stats(result),
                "shard_lag_transactions": _lag(stop, result.end_vgtid, result.retired_shards),
            }
            if any(stats["shard_lag_transactions"].values()):
                log.info(
                    "window %d stopped early (%s); behind stop: %s",
                    seq,
                    result.stopped_early,
                    stats["shard_lag_transactions"],
                )
            manifest = stager.finish(start, stop, result.end_vgtid, stats=stats)
            self.store.mark_staged(spec.sync_id, seq, result.end_vgtid, manifest.path, stats)
            return WindowOutcome(seq, WindowKind.CATCHUP, manifest, resumed, result)

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
