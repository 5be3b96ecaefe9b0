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
from airflow_provider_vitess.checkpoints import CheckpointStore, Part, Phase, Window, WindowKind, WindowState
from airflow_provider_vitess.exceptions import CheckpointError, InvalidVgtidError, UnknownTableError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import KeyChoice, KeyOverrides, choose_key, table_shape
from airflow_provider_vitess.staging import Manifest, PartInfo, WindowStager, load_manifest, verify
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid, transactions_missing
from airflow_provider_vitess.vstream.window import ReadBounds, ReadResult, WindowReader, capture_stop_position

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncSpec:
    """What one sync mirrors and where it stages."""

    sync_id: str
    keyspace: str
    tables: tuple[str, ...]
    staging_location: str
    storage_options: Mapping[str, Any] | None = None
    # Explicit staged key per table (skips the key choice); otherwise the key is chosen by the
    # VReplication rules from the table's indexes, with ``key_overrides`` applied.
    key_columns: Mapping[str, Sequence[str]] = field(default_factory=dict)
    key_overrides: Mapping[str, KeyOverrides] = field(default_factory=dict)
    allow_all_columns_key: bool = False
    heartbeat_interval: int = 1
    minimize_skew: bool = False
    stream_timeout: float = 3600.0  # bounds one VStream call (a window's wall time)


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

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds the sync's lock, heartbeating it, so a killed run's lock goes stale quickly
        (a rerun takes it over after ``lock_stale_after``) while a live one keeps it."""
        with self.store.lock(self.spec.sync_id, self.holder, self._stale_after) as handle:
            stop = threading.Event()

            def beat() -> None:
                while not stop.wait(self._stale_after.total_seconds() / 3):
                    try:
                        handle.heartbeat()
                    except Exception as exc:  # taken over: the run's own store writes will fail
                        log.error("lost the lock of sync %r: %s", self.spec.sync_id, exc)
                        return

            beater = threading.Thread(target=beat, name="sync-lock-heartbeat", daemon=True)
            beater.start()
            try:
                yield
            finally:
                stop.set()
                beater.join()

    def _open(self, request: Any) -> Any:
        return self.hook.open_vstream_raw(request, timeout=self.spec.stream_timeout)

    def _prepare(self) -> None:
        source.validate(self.hook, self.spec.keyspace, list(self.spec.tables))
        self._keys = self.key_choices()
        self.store.migrate()
        self.store.ensure_sync(
            self.spec.sync_id,
            self.spec.keyspace,
            self.spec.tables,
            {
                "staging": self.spec.staging_location,
                "keys": {t: choice.to_dict() for t, choice in self._keys.items()},
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
        )

    def _unfinished(self, kind: WindowKind) -> Window | None:
        """The sync's unfinished window, which must be of ``kind``: windows never interleave."""
        window = self.store.open_window(self.spec.sync_id)
        if window is not None and window.kind is not kind:
            raise CheckpointError(
                f"sync {self.spec.sync_id!r} has an unfinished {window.kind.value} window {window.seq} "
                f"({window.state.value}); finish it before a {kind.value}"
            )
        return window

    def _already_staged(self, seq: int, kind: WindowKind) -> WindowOutcome:
        manifest = load_manifest(
            self.spec.staging_location, self.spec.sync_id, seq, storage_options=self.spec.storage_options
        )
        if manifest is None:
            raise CheckpointError(
                f"sync {self.spec.sync_id!r} window {seq} is recorded as staged but its manifest is missing "
                f"from {self.spec.staging_location!r}"
            )
        return WindowOutcome(seq, kind, manifest, resumed=True, result=None)

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
        self, *, tables: Sequence[str] | None = None, checkpoint_every_rows: int = 50_000
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
        self._prepare()
        with self._locked():
            window = self._unfinished(WindowKind.SNAPSHOT)
            if window is not None and window.state is not WindowState.PLANNED:
                return self._already_staged(window.seq, WindowKind.SNAPSHOT)
            resumed = window is not None
            if window is None:
                stop = capture_stop_position(self._open, spec.keyspace)
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
            checkpoint_every_rows=every,
            on_checkpoint=on_checkpoint,
            on_rows=tracker.add_copied,
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

    def catch_up(self, bounds: ReadBounds | None = None) -> WindowOutcome:
        spec = self.spec
        self._prepare()
        with self._locked():
            window = self._unfinished(WindowKind.CATCHUP)
            if window is not None and window.state is not WindowState.PLANNED:
                return self._already_staged(window.seq, WindowKind.CATCHUP)
            resumed = window is not None
            if window is None:
                committed, _ = self.store.committed(spec.sync_id)
                if committed is None:
                    raise CheckpointError(
                        f"sync {spec.sync_id!r} has no committed position: snapshot it first"
                    )
                self._check_keyspace(committed, "the committed position")
                stop = capture_stop_position(self._open, spec.keyspace)
                seq = self.store.plan_window(spec.sync_id, WindowKind.CATCHUP, committed, stop)
                start = committed
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
                bounds=bounds or ReadBounds(),
                flags=self.hook.vstream_flags(
                    heartbeat_interval=spec.heartbeat_interval, minimize_skew=spec.minimize_skew
                ),
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

    @staticmethod
    def _stats(result: ReadResult) -> dict[str, Any]:
        return {
            "rows": result.rows,
            "units": result.units,
            "rows_per_table": result.rows_per_table,
            "stopped_early": result.stopped_early,
            "journals": result.journals,
            "retired_shards": result.retired_shards,
            **result.stats,
        }
