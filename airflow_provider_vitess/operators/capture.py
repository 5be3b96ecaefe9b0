"""Operators for the read side: a snapshot, and one bounded catch-up window.

Thin by design: they render their arguments, open the checkpoint store named by an Airflow
connection, run their job (``capture/snapshot.py``, ``capture/catch_up.py``), log progress in
collapsible groups, emit metrics and return a small JSON-able summary (the XCom value). All the
state lives in the checkpoint store, so clearing and rerunning a task resumes its window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast

from airflow.sdk import BaseOperator

from airflow_provider_vitess.capture.catch_up import CatchUpRun
from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.columns import require_salt
from airflow_provider_vitess.capture.outcome import SnapshotNeed, WindowOutcome, summary, window_metrics
from airflow_provider_vitess.capture.progress import LiveCopyProgress
from airflow_provider_vitess.capture.run import SyncRun
from airflow_provider_vitess.capture.snapshot import CHECKPOINT_EVERY_ROWS, SnapshotRun
from airflow_provider_vitess.capture.targets import refuse_windows_of_another_store
from airflow_provider_vitess.checkpoints.store import CheckpointStore
from airflow_provider_vitess.connections import hash_salt, open_store, refuse_single_host, s3_settings
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.lineage.openlineage import CaptureLineage, capture_facets
from airflow_provider_vitess.merge.plan import target_path
from airflow_provider_vitess.operators._sync import (
    accepts_sync,
    as_tables,
    catch_up_parts,
    memory_limits,
    snapshot_parts,
    sync_spec,
)
from airflow_provider_vitess.plugins.links import VitessSyncStatusLink
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.utils.failures import task_failures
from airflow_provider_vitess.utils.task import emit_metrics, holder, log_group
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS
from airflow_provider_vitess.vstream.window import ReadBounds

log = logging.getLogger(__name__)

Run = TypeVar("Run", bound=SyncRun)

_SYNC_FIELDS = (
    "sync_id",
    "keyspace",
    "tables",
    "staging_location",
    "storage_options",
    "vitess_conn_id",
    "checkpoint_conn_id",
    "key_columns",
    "key_overrides",
    "include_columns",
    "exclude_columns",
    "hash_columns",
    "hash_salt_conn_id",
)


class _CaptureOperatorBase(BaseOperator, Generic[Run]):
    """The capture operators' base (snapshot, catch-up): the arguments they all take."""

    job: ClassVar[type[SyncRun]]  # the run each subclass drives
    ui_color = "#f0e4ff"
    template_fields_renderers = {  # noqa: RUF012
        "storage_options": "json",
        "key_columns": "json",
        "key_overrides": "json",
        "include_columns": "json",
        "exclude_columns": "json",
        "hash_columns": "json",
    }
    operator_extra_links = (VitessSyncStatusLink(),)

    def __init__(
        self,
        *,
        sync_id: str,
        keyspace: str,
        tables: str | Sequence[str],
        staging_location: str,
        vitess_conn_id: str = VitessHook.default_conn_name,
        checkpoint_conn_id: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        aws_conn_id: str | None = None,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        key_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        allow_all_columns_key: bool = False,
        heartbeat_interval: int = 1,
        zero_date_policy: str = "null",
        zero_date_policies: Mapping[str, str] | None = None,
        spill_dir: str | None = None,
        include_columns: Mapping[str, Sequence[str]] | None = None,
        exclude_columns: Mapping[str, Sequence[str]] | None = None,
        hash_columns: Mapping[str, Sequence[str]] | None = None,
        hash_salt_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        ZeroDatePolicies.parse(zero_date_policy, zero_date_policies)  # a typo fails the DAG's import
        given = (include_columns, exclude_columns, hash_columns)
        if "{{" not in str(tables) and all(v is None or isinstance(v, Mapping) for v in given):
            # Column control that cannot apply fails the DAG's import (capture/columns.py); a
            # templated argument is checked when the task runs.
            parse_columns(as_tables(tables), *given)
        require_salt(bool(hash_columns), hash_salt_conn_id, f"task {kwargs.get('task_id')!r}")
        self.sync_id = sync_id
        self.keyspace = keyspace
        self.tables = tables
        self.staging_location = staging_location
        self.vitess_conn_id = vitess_conn_id
        self.checkpoint_conn_id = checkpoint_conn_id
        self.storage_options = storage_options
        self.aws_conn_id = aws_conn_id
        self.key_columns = key_columns
        self.key_overrides = key_overrides
        self.allow_all_columns_key = allow_all_columns_key
        self.heartbeat_interval = heartbeat_interval
        self.zero_date_policy = zero_date_policy
        self.zero_date_policies = dict(zero_date_policies or {})
        self.spill_dir = spill_dir
        self.include_columns = dict(include_columns or {})
        self.exclude_columns = dict(exclude_columns or {})
        self.hash_columns = dict(hash_columns or {})
        # The connection's name only: its password (the salt) is read at run time (_runner).
        self.hash_salt_conn_id = hash_salt_conn_id
        self._lineage: CaptureLineage | None = None
        self._running: SyncRun | None = None
        self._opened: tuple[VitessHook, CheckpointStore] | None = None  # what _runner opened

    def on_kill(self) -> None:
        """A killed task cancels its open stream and releases the sync's lock at once."""
        if self._running is not None:
            self._running.cancel()

    def _runner(self, context: Any, **spec: Any) -> Run:
        refuse_single_host(context, self.checkpoint_conn_id, [("staging_location", self.staging_location)])
        # Credentials join the options here, at run time: never in a (rendered) operator field.
        s3 = s3_settings(self.aws_conn_id)
        options = {**(s3.storage_options() if s3 else {}), **dict(self.storage_options or {})}
        hook, store = VitessHook(self.vitess_conn_id), open_store(self.checkpoint_conn_id)
        self._opened = (hook, store)
        run = cast(
            Run,
            self.job(
                hook,
                store,
                sync_spec(
                    sync_id=self.sync_id,
                    keyspace=self.keyspace,
                    tables=as_tables(self.tables),
                    staging_location=self.staging_location,
                    storage_options=options or None,
                    key_columns=dict(self.key_columns or {}),
                    key_overrides=self.key_overrides,
                    allow_all_columns_key=self.allow_all_columns_key,
                    heartbeat_interval=self.heartbeat_interval,
                    zero_date_policy=self.zero_date_policy,
                    zero_date_policies=self.zero_date_policies,
                    memory=memory_limits(self.spill_dir),
                    include_columns=self.include_columns,
                    exclude_columns=self.exclude_columns,
                    hash_columns=self.hash_columns,
                    # Read here, at run time: never in an operator field, a log or XCom.
                    hash_salt=hash_salt(self.hash_salt_conn_id) if self.hash_columns else None,
                    **spec,
                ),
                holder=holder(context),
                dag_id=self.dag_id,
                emit_progress=self._progress,
            ),
        )
        self._running = run
        return run

    def _close(self) -> None:
        """Close the connections :meth:`_runner` opened (the follow task reads hundreds of times
        in one process)."""
        if self._opened is not None:
            hook, store = self._opened
            self._opened = None
            hook.close()
            store.close()

    def _staged(self, runner: SyncRun, outcome: WindowOutcome) -> dict[str, Any]:
        """The task's summary; remembers what was read for OpenLineage."""
        spec = runner.spec
        self._lineage = CaptureLineage(
            runner.hook.config.grpc_target, spec.keyspace, spec.tables, outcome.manifest
        )
        return summary(outcome)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the Vitess tables read, with the staged schemas (see ``lineage``)."""
        return capture_facets(self._lineage)

    def _progress(self, p: LiveCopyProgress) -> None:
        self.log.info("progress %s", p.line())
        values: dict[str, float] = {f"{p.table}.rows_copied": p.rows_copied}
        if p.rows_known is not None:
            values[f"{p.table}.rows_known"] = p.rows_known
        emit_metrics("snapshot", self.sync_id, values)


class VitessSnapshotOperator(_CaptureOperatorBase[SnapshotRun]):
    """Snapshot the sync's tables (the first run), or re-snapshot chosen ones.

    :param sync_id: names the sync: its checkpoint, staging directory and Delta transaction ids.
    :param keyspace: the Vitess keyspace; ``tables`` its tables (list, or comma-separated text).
    :param staging_location: local path or fsspec URL where windows are staged as Parquet.
    :param aws_conn_id: an Airflow ``aws`` connection for an ``s3a://`` (or ``s3://``) staging
        location: keys, ``endpoint_url``, region (see :mod:`airflow_provider_vitess.object_storage`).
    :param storage_options: further fsspec options (they win over the connection's).
    :param spill_dir: where a read spills what exceeds its memory limits (large transactions,
        units held for the cross-shard order); default ``[vitess] spill_dir`` in the Airflow
        configuration, else the system's temporary directory. Spill files are anonymous: they
        vanish when the task ends, however it ends.
    :param resnapshot_tables: tables to copy again although the sync already streams (e.g. from
        DAG params: ``"{{ params.resnapshot_tables }}"``); the other tables are untouched.
    :param only_if_needed: when the sync already has a committed position and no re-snapshot is
        asked for, do nothing (the normal scheduled run). ``False`` forces a full re-snapshot.
    :param checkpoint_every_rows: how often a long copy records where to resume: a killed
        snapshot recopies at most about this many rows.
    :param copy_stall_timeout: seconds a copying shard may send no row (vtgate's heartbeats only)
        before the snapshot fails naming the table, vttablet's ``--vreplication-copy-phase-duration``
        and the remedy; default 3900, just over that flag's default (1h). Keep it above the flag
        (docs/design.md, "Large tables").
    :param target_location: where the merge writes the Delta tables (with ``targets``, as the
        merge operator takes them). Given, a sync's first snapshot refuses to start when the
        checkpoint store has never recorded a window of the sync but a table already holds one
        (a replaced or restored store, see ``capture/targets.py``).

    Returns (XCom) the staged window's summary, or ``{"snapshot": "not needed", ...}``.
    """

    job = SnapshotRun

    template_fields: Sequence[str] = (*_SYNC_FIELDS, "resnapshot_tables")

    @accepts_sync(snapshot_parts)
    def __init__(
        self,
        *,
        resnapshot_tables: str | Sequence[str] | None = None,
        only_if_needed: bool = True,
        checkpoint_every_rows: int = CHECKPOINT_EVERY_ROWS,
        copy_stall_timeout: float = COPY_STALL_SECONDS,
        target_location: str | None = None,
        targets: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.resnapshot_tables = resnapshot_tables
        self.only_if_needed = only_if_needed
        self.checkpoint_every_rows = checkpoint_every_rows
        self.copy_stall_timeout = copy_stall_timeout
        self.target_location = target_location
        self.targets = targets

    def execute(self, context: Any) -> dict[str, Any]:
        with task_failures(self.log):
            return self._snapshot(context)

    def _needed(self, runner: SnapshotRun) -> SnapshotNeed:
        """What to copy, or (logged) that the sync already streams and nothing is asked."""
        settings = runner.spec
        need = runner.snapshot_need(as_tables(self.resnapshot_tables), only_if_needed=self.only_if_needed)
        if not need.needed:
            self.log.info(
                "sync %r already streams (committed window %d); no snapshot needed",
                settings.sync_id,
                need.committed_seq,
            )
            return need
        # A sync the store has never committed nor opened a window of: its first snapshot.
        first = not need.resnapshot and runner.store.open_window(settings.sync_id) is None
        if self.target_location and first:
            paths = {t: target_path(self.target_location, t, self.targets) for t in settings.tables}
            refuse_windows_of_another_store(settings.sync_id, paths, settings.storage_options)
        return need

    def _snapshot(self, context: Any) -> dict[str, Any]:
        runner = self._runner(context)
        settings = runner.spec
        need = self._needed(runner)
        if not need.needed:
            return need.not_needed(settings.sync_id)
        what = "re-snapshot of " + ", ".join(need.tables) if need.resnapshot else "snapshot"
        started = time.monotonic()
        with log_group(f"Vitess {what} of {settings.keyspace} (sync {settings.sync_id})"):
            outcome = runner.snapshot(
                tables=need.tables,
                need=need,
                checkpoint_every_rows=self.checkpoint_every_rows,
                copy_stall_seconds=self.copy_stall_timeout,
            )
        result = self._staged(runner, outcome)
        self.log.info(
            "staged snapshot window %d: %s rows (%s)",
            outcome.seq,
            f"{result['rows']:,}",
            ", ".join(f"{t}: {n:,}" for t, n in result["rows_per_table"].items()),
        )
        elapsed = time.monotonic() - started
        emit_metrics("snapshot", settings.sync_id, window_metrics(outcome, elapsed))
        emit_metrics("snapshot", settings.sync_id, {"duration": elapsed}, timing=True)
        return result


class VitessCatchUpOperator(_CaptureOperatorBase[CatchUpRun]):
    """Read the sync's backlog in bounded catch-up windows: from the committed VGTID to the
    position the keyspace had when the run started, each window staged as Parquet with a
    manifest. A window ends at a transaction boundary after ``max_events`` row changes; the
    next one starts there, until the backlog is read or ``max_seconds`` (the whole run's read
    time) are spent; the merge task merges them all (see ``capture/catch_up.py``).

    Returns (XCom) the last window's summary (manifest path, per table counts, end VGTID, lag)
    with ``windows``: the seqs of every window of the run, and ``rows_all_windows``.
    """

    job = CatchUpRun

    template_fields: Sequence[str] = (*_SYNC_FIELDS, "max_events", "max_seconds")

    @accepts_sync(catch_up_parts)
    def __init__(
        self,
        *,
        max_events: int | None = None,
        max_seconds: float | None = None,
        minimize_skew: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_events = max_events
        self.max_seconds = max_seconds
        self.minimize_skew = minimize_skew

    def execute(self, context: Any) -> dict[str, Any]:
        with task_failures(self.log):
            try:
                return self._catch_up(context)
            finally:
                self._close()

    def _catch_up(self, context: Any) -> dict[str, Any]:
        runner = self._runner(context, minimize_skew=self.minimize_skew)
        settings = runner.spec
        bounds = ReadBounds(
            max_events=int(self.max_events) if self.max_events else None,
            max_seconds=float(self.max_seconds) if self.max_seconds else None,
        )
        started = time.monotonic()
        with log_group(f"Vitess catch-up of {settings.keyspace} (sync {settings.sync_id})"):
            backlog = runner.backlog(bounds)
        elapsed = time.monotonic() - started
        outcome = backlog.last
        result = {**self._staged(runner, outcome), "windows": [w.seq for w in backlog.windows]}
        result["rows_all_windows"] = backlog.rows
        lag = result["stats"].get("shard_lag_transactions", {})
        self.log.info(
            "staged catch-up window(s) %s: %s row changes in %.1f s (%s); shards behind the stop: %s",
            ", ".join(map(str, result["windows"])),
            f"{backlog.rows:,}",
            elapsed,
            backlog.stopped,
            lag or "none",
        )
        emit_metrics(
            "catch_up",
            settings.sync_id,
            {**window_metrics(outcome, elapsed), "events": backlog.rows, "windows": len(backlog.windows)},
        )
        emit_metrics("catch_up", settings.sync_id, {"duration": elapsed}, timing=True)
        return result
