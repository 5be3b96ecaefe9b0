"""The apply side of the window state machine: merge the sync's staged windows, then commit.

``MergeRunner.run`` holds the sync's lock (the same one capture holds: one writer at a time,
every store write fenced by its token), and drives the windows the store says are open, in order:

* none: nothing was staged since the last commit; nothing to do.
* MERGED (a merge whose commit was interrupted): commit only.
* STAGED: the leading chain of STAGED windows (a backlog one run staged as several windows, see
  ``capture/backlog.py``; usually one window) is merged by one Spark job: build the
  :class:`MergePlan` (each table's key as recorded when the windows were staged, and what the
  sync last wrote to each Delta table, for the integrity check), hand it to ``submit``, then for
  each window in order record MERGED with the tables the job wrote, and COMMITTED.
* PLANNED: its capture task has not finished staging it; the capture task resumes it (this is
  not the merge's work, so the merge does nothing and says which task owns the window).

MERGED -> COMMITTED moves the checkpoint. No Airflow import: the operator passes the Spark
submission as a function.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_vitess.capture import groups
from airflow_provider_vitess.capture.resume import WindowBook
from airflow_provider_vitess.checkpoints import (
    WINDOW_KEYS,
    CheckpointStore,
    Window,
    WindowKind,
    WindowState,
    freshness,
    history,
)
from airflow_provider_vitess.checkpoints.history import recent_windows
from airflow_provider_vitess.checkpoints.locking import TASK_STALE_AFTER
from airflow_provider_vitess.checkpoints.store import MERGE_REPORT
from airflow_provider_vitess.checkpoints.versions import TableCommit
from airflow_provider_vitess.exceptions import (
    CheckpointError,
    CorruptStagedDataError,
    StagedWindowLostError,
    UnknownSyncError,
)
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.merge.modes import ModeOptions
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge, target_path
from airflow_provider_vitess.merge.report import MergeReport, TableStatus
from airflow_provider_vitess.staging.manifest import load_manifest
from airflow_provider_vitess.staging.parts_check import missing_part
from airflow_provider_vitess.staging.retention import MAX_WINDOWS_BACK, prune_after_commit, staging_location
from airflow_provider_vitess.vgtid import Vgtid

log = logging.getLogger(__name__)

# The capture task that stages each kind of window (the DAG factory's task ids).
CAPTURE_TASK = {WindowKind.SNAPSHOT: "snapshot", WindowKind.CATCHUP: "catch_up"}

Submit = Callable[[MergePlan], MergeReport | None]
# Windows whose records (row, parts, progress) the store keeps per sync: the status page's
# longest history (``status.documents.MAX_WINDOWS``); older ones are pruned after each commit.
KEEP_WINDOW_RECORDS = 500


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge task did: the window merged and committed (``seq``), or nothing (None)."""

    committed_seq: int
    seq: int | None = None
    kind: WindowKind | None = None
    committed_vgtid: Vgtid | None = None
    report: MergeReport | None = None
    message: str = ""
    streamed_before: bool = False  # the sync had a committed position before this window
    seqs: tuple[int, ...] = ()  # every window committed, in order (``seq`` is the last)
    # The merge's one plan (lineage reads it too): the one submitted, else (only windows a killed
    # merge left MERGED were committed) the last window's.
    plan: MergePlan | None = None
    as_of: datetime | None = None  # the committed position's time (``checkpoints/freshness``)


def build_plan(
    store: CheckpointStore,
    sync_id: str,
    window: Window | Sequence[Window],
    target_location: str,
    targets: Mapping[str, Mapping[str, Any]] | None = None,
    modes: ModeOptions | None = None,
    table_format: str = "delta",
    iceberg_catalog: Mapping[str, str] | None = None,
) -> MergePlan:
    """The plan for staged windows (one, or a chain staged with the same keys, in order): each
    table's Delta path, the key the windows were staged with, its target mode (``modes`` and
    ``targets``: :mod:`.modes`; the job checks it against the one the Delta table records), and
    what the sync last wrote to each table (for the job's integrity check)."""
    windows = [window] if isinstance(window, Window) else list(window)
    keys = window_keys(store, sync_id, windows[0])
    shapes = (modes or ModeOptions()).shapes(keys, targets)
    written = store.target_versions(sync_id)
    root = target_location.rstrip("/")
    planned: dict[str, TableTarget] = {}
    for table, choice in keys.items():
        given = dict((targets or {}).get(table) or {})
        from_source = choice.target_from_source or choice.source_columns
        renames = {s: t for s, t in zip(from_source, choice.target_columns, strict=True) if s != t}
        last = written.get(table)
        planned[table] = TableTarget(
            table=table,
            path=target_path(root, table, targets),
            key_columns=choice.target_columns,
            key_from_source=from_source,
            renames={**renames, **dict(given.get("renames") or {})},
            last_merged_seq=None if last is None else last.merged_seq,
            last_delta_version=None if last is None else last.table_version,
            shape=shapes[table],
        )
    to_merge = []
    for w in windows:
        replace: tuple[str, ...] = ()
        if w.kind is WindowKind.SNAPSHOT:
            copied = {p.table for p in store.progress(sync_id, w.seq)}
            replace = tuple(t for t in planned if t in copied) or tuple(planned)
        if w.manifest_path is None:
            raise CheckpointError(f"sync {sync_id!r} window {w.seq} is STAGED without a manifest path")
        to_merge.append(WindowToMerge(w.seq, w.manifest_path, replace))
    return MergePlan(sync_id, tuple(to_merge), planned, table_format, iceberg_catalog)


def mergeable(windows: Sequence[Window], committed: Vgtid | None) -> list[Window]:
    """The STAGED windows one Spark job merges: the leading STAGED ones of ``windows`` (the
    open windows after any MERGED ones, in order), as long as each starts where the one before
    it ends and was staged with the same keys. A snapshot is merged alone (it replaces tables;
    catch-up windows never follow an unmerged one)."""
    batch: list[Window] = []
    for w in windows:
        if w.state is not WindowState.STAGED:
            break
        if batch and (
            w.kind is WindowKind.SNAPSHOT
            or batch[0].kind is WindowKind.SNAPSHOT
            or w.start_vgtid != batch[-1].end_vgtid
            or w.stats.get(WINDOW_KEYS) != batch[0].stats.get(WINDOW_KEYS)
        ):
            break
        batch.append(w)
    first = batch[0] if batch else None
    if first is not None and first.kind is WindowKind.CATCHUP and committed not in (None, first.start_vgtid):
        raise CheckpointError(
            f"STAGED catch-up window {batch[0].seq} starts at {batch[0].start_vgtid.to_json()}, "
            f"not at the committed position {committed.to_json()}: merging it would skip changes; "
            "re-snapshot the sync's tables"
        )
    return batch


def window_keys(store: CheckpointStore, sync_id: str, window: Window) -> dict[str, KeyChoice]:
    """The keys the window was staged with (recorded with it), else the sync's (older windows)."""
    recorded = window.stats.get(WINDOW_KEYS) or store.sync_config(sync_id).get("keys") or {}
    return {t: KeyChoice.from_dict(c) for t, c in dict(recorded).items()}


def own_report(report: MergeReport, seq: int) -> dict[str, Any] | None:
    """What a window keeps of its chain's report: its own results only, so that a window's record
    stays the size of one window, however long the chain its merge job took."""
    own = [w for w in report.windows if w.seq == seq]
    return json.loads(MergeReport(report.sync_id, tuple(own)).to_json()) if own else None


def joined(first: MergeReport | None, then: MergeReport | None) -> MergeReport | None:
    """One report of the windows a run committed, in order (a window once, the later report's)."""
    if first is None or then is None:
        return then or first
    seqs = {w.seq for w in then.windows}
    return MergeReport(then.sync_id, (*(w for w in first.windows if w.seq not in seqs), *then.windows))


def recorded_report(window: Window) -> MergeReport | None:
    """The report a MERGED window's merge kept in the store (:meth:`CheckpointStore.mark_merged`)."""
    kept = window.stats.get(MERGE_REPORT)
    return None if not kept else MergeReport.from_json(json.dumps(kept))


def merged_targets(
    plan: MergePlan, report: MergeReport | None, seq: int | None = None
) -> dict[str, int | None]:
    """The tables that hold window ``seq`` (default: the plan's last) once the job succeeded,
    with their Delta version: what the next merge checks each table against. A replaced table
    without rows (its snapshot was empty) holds the window without a Delta table."""
    window = plan.windows[-1] if seq is None else next(w for w in plan.windows if w.seq == seq)
    if report is None:
        return {}
    found: dict[str, int | None] = {}
    for result in report.window(window.seq).tables:
        if result.status in (TableStatus.WRITTEN, TableStatus.ALREADY_APPLIED):
            found[result.table] = result.table_version
        elif result.table in window.replace_tables:
            found[result.table] = None
    return found


def merged_commits(report: MergeReport | None, seq: int) -> dict[str, TableCommit]:
    """Per table that holds window ``seq`` by a commit, how the consistent cut reads that commit
    (its format, Iceberg's snapshot id), as the job reported it."""
    if report is None:
        return {}
    return {
        r.table: TableCommit(r.table_format, r.snapshot_id, r.catalog)
        for r in report.window(seq).tables
        if r.status in (TableStatus.WRITTEN, TableStatus.ALREADY_APPLIED)
    }


def _describe(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs)) or "none"


class MergeRunner:
    """Merges and commits one sync's open windows; see the module docstring."""

    def __init__(
        self,
        store: CheckpointStore,
        sync_id: str,
        target_location: str,
        targets: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        holder: str,
        lock_stale_after: timedelta = TASK_STALE_AFTER,
        keep_staged_windows: int = MAX_WINDOWS_BACK,
        keep_window_records: int = KEEP_WINDOW_RECORDS,
        storage_options: Mapping[str, Any] | None = None,
        freshness_sla: float | None = None,
        modes: ModeOptions | None = None,
        table_format: str = "delta",
        iceberg_catalog: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.sync_id, self.holder = store, sync_id, holder
        self.modes, self.table_format, self.iceberg_catalog = modes, table_format, iceberg_catalog
        self.target_location, self.targets = target_location, targets
        self._stale_after = lock_stale_after
        self._keep, self._storage_options = keep_staged_windows, storage_options
        self._keep_records = keep_window_records
        self.freshness_sla = freshness_sla

    def run(self, submit: Submit) -> MergeOutcome:
        with self.store.hold(self.sync_id, self.holder, self._stale_after):
            self._assemble_groups()
            windows = self.store.open_windows(self.sync_id)
            before, committed_seq = self.store.committed(self.sync_id)
            if not windows:
                if history.sync(self.store.engine, self.sync_id) is None:
                    raise unknown_sync(self.store, self.sync_id)
                return MergeOutcome(
                    committed_seq, message=f"nothing staged to merge (committed window {committed_seq})"
                )
            done: list[Window] = []
            report: MergeReport | None = None
            plan: MergePlan | None = None
            # MERGED windows first (a merge killed before their commit): their rows are in Delta.
            while windows and windows[0].state is WindowState.MERGED:
                report = joined(report, recorded_report(windows[0]))
                self.store.commit(self.sync_id, windows[0].seq)
                done.append(windows.pop(0))
            batch = mergeable(windows, self.store.committed(self.sync_id)[0])
            if not batch and not done:
                window = windows[0]
                return MergeOutcome(
                    committed_seq,
                    message=(
                        f"nothing staged to merge: {window.kind.value} window {window.seq} is still "
                        f"being read (PLANNED); its {CAPTURE_TASK[window.kind]!r} task resumes it "
                        "(clear that task in the run where it failed, or let the next run's task do it)"
                    ),
                )
            if batch:
                self._hand_back_lost(batch)
                plan = build_plan(
                    self.store,
                    self.sync_id,
                    batch,
                    self.target_location,
                    self.targets,
                    self.modes,
                    self.table_format,
                    self.iceberg_catalog,
                )
                merged = submit(plan)
                report = joined(report, merged)
                # Window by window, in order: a kill in between leaves a prefix COMMITTED (and
                # perhaps one MERGED), the rest STAGED and already in Delta (a rerun skips them).
                paths = {table: target.path for table, target in plan.targets.items()}
                for w in batch:
                    kept = None if merged is None else own_report(merged, w.seq)
                    targets = merged_targets(plan, merged, w.seq)
                    commits = merged_commits(merged, w.seq)
                    self.store.mark_merged(self.sync_id, w.seq, targets, kept, paths, commits)
                    self.store.commit(self.sync_id, w.seq)
                    done.append(w)
            last = done[-1]
            if plan is None:
                plan = build_plan(
                    self.store,
                    self.sync_id,
                    last,
                    self.target_location,
                    self.targets,
                    self.modes,
                    self.table_format,
                    self.iceberg_catalog,
                )
            committed = self.store.committed(self.sync_id)[0]
            assert committed is not None
            self._prune(last)
            freshness.record_sla(self.store.engine, self.sync_id, self.freshness_sla)
            seqs = ", ".join(str(w.seq) for w in done)
            return MergeOutcome(
                last.seq,
                last.seq,
                last.kind,
                committed,
                report,
                message=f"committed window(s) {seqs} at {committed.to_json()}",
                streamed_before=before is not None,
                seqs=tuple(w.seq for w in done),
                plan=plan,
                as_of=point.as_of if (point := history.checkpoint(self.store.engine, self.sync_id)) else None,
            )

    def _assemble_groups(self) -> None:
        """A window read by shard groups whose parts are all staged becomes STAGED here, under
        the sync's lock, before the plan reads the STAGED windows (``capture/groups.py``)."""
        window = self.store.open_window(self.sync_id)
        if window is None or window.state is not WindowState.PLANNED:
            return
        location = str(self.store.sync_config(self.sync_id).get("staging") or "")
        if not location:
            return
        book = WindowBook(self.store, self.sync_id, location, self._storage_options, self.holder)
        groups.assemble(self.store, self.sync_id, book)

    def _hand_back_lost(self, batch: Sequence[Window]) -> None:
        """A window whose staged files were lost cannot be merged, and a rerun of the merge
        cannot bring them back: it goes back to capture (discarded with the windows after it,
        as capture discards one it meets first), and the next catch-up reads its changes again
        from its start. The task fails, saying so; a retry finds nothing of it and goes on."""
        for window in batch:
            assert window.manifest_path is not None  # STAGED
            location = staging_location(window.manifest_path)
            try:
                manifest = load_manifest(
                    location, self.sync_id, window.seq, storage_options=self._storage_options
                )
                problem = "its manifest is missing" if manifest is None else missing_part(manifest)
            except CorruptStagedDataError as exc:
                problem = str(exc)
            if problem is None:
                continue
            book = WindowBook(self.store, self.sync_id, location, self._storage_options, self.holder)
            book.discard_lost(window, problem)
            raise StagedWindowLostError(
                f"sync {self.sync_id!r} {window.kind.value} window {window.seq} was staged but "
                f"{problem}: it was discarded (with any staged window after it) and nothing was "
                f"merged; the next catch-up reads its changes again from {window.start_vgtid.to_json()}"
            )

    def _prune(self, window: Window) -> None:
        """Staged windows no later merge can read (its context look-back) go once this one is
        COMMITTED. Housekeeping: a failure leaves files behind, never a wrong table."""
        if window.manifest_path is None:
            return
        try:
            # Snapshots and discarded windows go as soon as a later window is committed.
            early = [
                w.seq
                for w in recent_windows(self.store.engine, self.sync_id, self._keep + 1)
                if w.kind is WindowKind.SNAPSHOT or w.state is WindowState.FAILED
            ]
            deleted = prune_after_commit(
                window.manifest_path,
                keep=self._keep,
                gone_early=early,
                storage_options=self._storage_options,
            )
        except Exception as exc:
            log.warning("sync %r: staged windows before %d not deleted: %s", self.sync_id, window.seq, exc)
            return
        log.info("sync %r: deleted staged window(s) %s", self.sync_id, _describe(deleted))
        try:
            pruned = self.store.prune_windows(self.sync_id, self._keep_records)
        except Exception as exc:
            log.warning("sync %r: old windows' records not deleted: %s", self.sync_id, exc)
            return
        if pruned:
            log.info("sync %r: deleted the records of %d old window(s)", self.sync_id, len(pruned))


def unknown_sync(store: CheckpointStore, sync_id: str) -> UnknownSyncError:
    """The error of a merge whose store never saw its sync: not "nothing staged"."""
    where = store.engine.url.render_as_string(hide_password=True)
    return UnknownSyncError(
        f"sync {sync_id!r} is unknown to the checkpoint store {where}: no capture task ever "
        "recorded it there, so this merge has nothing it could merge, and never will. Its capture "
        "task wrote elsewhere: without checkpoint_conn_id each machine has its own SQLite file "
        "under AIRFLOW_HOME, so on a deployment with several workers (Celery, Kubernetes) give "
        "the capture and merge tasks the same checkpoint_conn_id (a shared database; what a "
        "worker's file recorded moves there with python -m airflow_provider_vitess.store_copy "
        "--to-conn <that connection>, run on that worker); otherwise check that both tasks name "
        "the same checkpoint_conn_id and sync_id"
    )
