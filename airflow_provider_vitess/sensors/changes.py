"""``VitessChangesSensor``: wait until a sync's tables have changes past its committed VGTID.

"Changes" means changes of the sync's tables, found by streaming from the committed VGTID with
the sync's table filter (:mod:`..vstream.changes`). Deferrable, it waits in the triggerer
(:class:`VitessChangesTrigger`); otherwise each poke reads on from where the last one stopped.
Only "no change within ``timeout``" may end the wait without success (skipped with
``skip_on_timeout``); every other outcome fails the task. A "no change" read up to the keyspace's
position, taken when the wait began, proves the sync's data fresh up to that moment: with
``sync_id`` it is recorded as the sync's *as of* (``checkpoints/freshness.record_quiet``), so a
quiet source's runs, which skip their catch-up and merge, do not leave it behind. Arguments,
reasons and the summary it returns: ``docs/reference.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_vitess.checkpoints.freshness import record_quiet
from airflow_provider_vitess.checkpoints.store import CheckpointStore
from airflow_provider_vitess.connections import refuse_single_host, store_url
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.plugins.links import VitessSyncStatusLink
from airflow_provider_vitess.triggers.changes import VitessChangesTrigger
from airflow_provider_vitess.utils.airflow_compat import (
    AirflowException,
    AirflowSensorTimeout,
    AirflowSkipException,
)
from airflow_provider_vitess.utils.failures import fail_permanently, task_failures
from airflow_provider_vitess.utils.task import airflow_conf
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.change_watch import ChangeWatch
from airflow_provider_vitess.vstream.changes import (
    SCAN_UNFINISHED,
    Change,
    parse_start_vgtid,
    start_verdict,
    unscanned_verdict,
    watched_columns,
)
from airflow_provider_vitess.vstream.moves import refuse_moved


def default_deferrable() -> bool:
    return bool(airflow_conf().getboolean("operators", "default_deferrable", fallback=False))


if TYPE_CHECKING:
    from airflow.sdk import Context


class VitessChangesSensor(BaseSensorOperator):
    """Waits until the tables of a sync have changes after its committed VGTID.

    :param keyspace: the sync's keyspace.
    :param tables: the sync's tables (bare names; one name or a list).
    :param sync_id: read the committed VGTID of this sync from the checkpoint store...
    :param checkpoint_conn_id: ...named by this Airflow connection (default: the SQLite file
        under ``AIRFLOW_HOME``), as for the capture and merge operators.
    :param start_vgtid: ...or watch from this VGTID (JSON text, templated; empty or ``None``
        means "no checkpoint"). Give either ``sync_id`` or ``start_vgtid``.
    :param vitess_conn_id: the ``vitess`` connection.
    :param lag_threshold: also succeed when a shard's current position is more than this many
        transactions past the committed one, whatever tables they touched: keeps a quiet sync's
        checkpoint from falling behind the binlogs the server keeps. None (default): never.
    :param deferrable: wait in the triggerer instead of poking from a worker slot; default:
        Airflow's ``[operators] default_deferrable`` (the DAG factory passes True).
    :param heartbeat_interval: seconds between vtgate heartbeats on the trigger's idle stream.
    :param lag_check_interval: seconds between the trigger's lag checks.
    :param poke_read_seconds: longest stream read of one poke (not deferrable).
    :param skip_on_timeout: no change within ``timeout`` skips the task (and with it the rest of
        the run) instead of failing it; errors still fail it.

    ``poke_interval``, ``timeout`` and ``mode`` are the usual sensor arguments; ``timeout`` also
    bounds the deferral.
    """

    # The trigger ends its own wait at ``timeout``; the deferral's timeout only catches a
    # triggerer that never answered, so it comes this much later and is a failure.
    DEFERRAL_MARGIN_SECONDS = 60.0

    template_fields: Sequence[str] = (
        "keyspace",
        "tables",
        "sync_id",
        "start_vgtid",
        "vitess_conn_id",
        "checkpoint_conn_id",
    )
    ui_color = "#f3e9ff"
    operator_extra_links = (VitessSyncStatusLink(),)

    def __init__(
        self,
        *,
        keyspace: str,
        tables: str | Sequence[str],
        sync_id: str | None = None,
        checkpoint_conn_id: str | None = None,
        start_vgtid: str | None = None,
        vitess_conn_id: str = VitessHook.default_conn_name,
        lag_threshold: int | None = None,
        deferrable: bool | None = None,
        heartbeat_interval: int = 10,
        lag_check_interval: float = 60.0,
        poke_read_seconds: float = 30.0,
        skip_on_timeout: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (sync_id is None) == (start_vgtid is None):
            raise ValueError(
                "VitessChangesSensor needs either sync_id (with the checkpoint store) or start_vgtid"
            )
        if lag_threshold is not None and lag_threshold < 0:
            raise ValueError("lag_threshold must be 0 or more transactions")
        self.keyspace = keyspace
        self.tables: list[str] = [tables] if isinstance(tables, str) else list(tables)
        if not self.tables:
            raise ValueError("VitessChangesSensor needs at least one table")
        self.sync_id = sync_id
        self.checkpoint_conn_id = checkpoint_conn_id
        self.start_vgtid = start_vgtid
        self.vitess_conn_id = vitess_conn_id
        self.lag_threshold = lag_threshold
        # Like Airflow's own sensors: [operators] default_deferrable unless told.
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.heartbeat_interval = heartbeat_interval
        self.lag_check_interval = lag_check_interval
        self.poke_read_seconds = poke_read_seconds
        self.skip_on_timeout = skip_on_timeout
        # Poke mode: the reads, from the first poke's position on (vstream/change_watch.py).
        self._watch: ChangeWatch | None = None
        # Tables under column control: their key columns only are streamed (read with the
        # committed position from the sync's config; capture/columns.watched_columns).
        self._columns: dict[str, list[str]] = {}

    # ----- where to start -----------------------------------------------------------------

    def committed_vgtid(self) -> Vgtid | None:
        """The VGTID to watch from: ``start_vgtid``, or the sync's committed one (None: none yet)."""
        if self.sync_id is None:
            return parse_start_vgtid(self.start_vgtid)
        store = CheckpointStore(store_url(self.checkpoint_conn_id))
        try:
            if store.schema_revision() is None:
                self.log.info("The checkpoint store has no tables yet: sync %r never ran", self.sync_id)
                return None
            vgtid, seq = store.committed(self.sync_id)
            if vgtid is not None:
                self._columns = watched_columns(store.sync_config(self.sync_id))
        finally:
            store.close()
        if vgtid is not None:
            self.log.info("Sync %r committed window %d at %s", self.sync_id, seq, vgtid.to_json())
        return vgtid

    def refuse_moved_tables(self) -> None:
        """A MoveTables that switched the tables to another keyspace fails a wait that saw no
        change: the keyspace's stream stays silent on moved tables, so every run would otherwise
        end "no change" (skipped) instead of naming the move."""
        hook = VitessHook(self.vitess_conn_id)
        try:
            refuse_moved(hook, self.sync_id or self.keyspace, self.keyspace, self.tables)
        finally:
            hook.close()

    def _done(self, change: Change) -> dict[str, Any]:
        summary = change.summary()
        if change.reason == SCAN_UNFINISHED:
            self.log.warning(
                "The timeout (%g s) ended the read of %s.%s before the position it started at "
                '(transactions left per shard: %s): not a "no change"; the run goes on',
                self.timeout,
                self.keyspace,
                ",".join(self.tables),
                dict(change.lag) if change.lag is not None else "unknown",
            )
        self.log.info("Sync %s has work: %s", self.sync_id or self.keyspace, summary)
        return summary

    # ----- deferrable ---------------------------------------------------------------------

    def _no_change(self, watched_from: Vgtid | None = None, taken_at: datetime | None = None) -> Exception:
        """The end of a wait that read from ``watched_from`` up to the position taken at
        ``taken_at`` and found no change: recorded as the sync's freshness (after the check
        for moved tables: their silence proves nothing)."""
        with task_failures(self.log):
            self.refuse_moved_tables()  # "no change" is also what tables moved away look like
            self._record_quiet(watched_from, taken_at)
        message = f"No change to {self.keyspace}.{','.join(self.tables)} within {self.timeout:g} s"
        if self.skip_on_timeout:
            return AirflowSkipException(f"{message}: nothing to do, the rest of this run is skipped")
        return AirflowSensorTimeout(message)

    def _record_quiet(self, watched_from: Vgtid | None, taken_at: datetime | None) -> None:
        if self.sync_id is None or watched_from is None or taken_at is None:
            return
        store = CheckpointStore(store_url(self.checkpoint_conn_id))
        try:
            before = record_quiet(store.engine, self.sync_id, watched_from, taken_at)
        finally:
            store.close()
        if before is not None:
            self.log.info(
                "Sync %r: no change of its tables up to the position taken at %s: its data is as "
                "of then (it was as of %s)",
                self.sync_id,
                taken_at.isoformat(),
                before.isoformat(),
            )

    def execute(self, context: Context) -> Any:
        with task_failures(self.log):
            if self.sync_id is not None:  # a sync's store: one every host the task may run on sees
                refuse_single_host(context, self.checkpoint_conn_id)
            committed = self.committed_vgtid()
            verdict = start_verdict(committed, self.keyspace)
        if verdict is not None:
            return self._done(verdict)
        assert committed is not None
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout:
                watch = self._watch
                read_to, stop = (None, None) if watch is None else (watch.read_to, watch.watch_stop)
                unscanned = unscanned_verdict(self.keyspace, read_to, stop)
                if unscanned is not None:
                    return self._done(unscanned)
                raise self._no_change(committed, self._watch_stop_at) from None
        self.log.info("Deferring until %s.%s changes", self.keyspace, ",".join(self.tables))
        self.defer(
            trigger=VitessChangesTrigger(
                vitess_conn_id=self.vitess_conn_id,
                keyspace=self.keyspace,
                tables=self.tables,
                start_vgtid=committed.to_json(),
                lag_threshold=self.lag_threshold,
                heartbeat_interval=self.heartbeat_interval,
                lag_check_interval=self.lag_check_interval,
                timeout_at=time.time() + float(self.timeout),
                columns=self._columns,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + self.DEFERRAL_MARGIN_SECONDS),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resumed by the trigger: the change it saw becomes the task's result."""
        if event and event.get("status") == "timeout":
            watched_from, taken_at = event.get("watched_from"), event.get("watched_at")
            raise self._no_change(
                Vgtid.from_json(watched_from) if watched_from else None,
                datetime.fromisoformat(taken_at) if taken_at else None,
            )
        if not event or event.get("status") != "change":
            message = (event or {}).get("message", "the trigger ended without an event")
            failure = f"Watching {self.keyspace} for changes failed: {message}"
            if (event or {}).get("permanent"):
                raise fail_permanently(failure)
            raise AirflowException(failure)
        return self._done(Change.from_summary(event))

    # ----- poke (not deferrable) ----------------------------------------------------------

    def poke(self, context: Context) -> bool | PokeReturnValue:
        committed = self.committed_vgtid()
        verdict = start_verdict(committed, self.keyspace)
        if verdict is not None:
            return PokeReturnValue(is_done=True, xcom_value=self._done(verdict))
        assert committed is not None
        hook = VitessHook(self.vitess_conn_id)
        try:
            with task_failures(self.log):
                change = self.read_once(hook, committed)
        finally:
            hook.close()
        if change is None:
            read_to = self._watch.read_to if self._watch is not None else None
            where = read_to.to_json() if read_to is not None else "its start"
            self.log.info("No change yet (read up to %s); the next poke goes on", where)
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._done(change))

    def read_once(self, hook: VitessHook, committed: Vgtid) -> Change | None:
        """One bounded read: the first change between ``committed`` and now, or None."""
        if self._watch is None:
            self._watch = ChangeWatch(
                self.keyspace,
                self.tables,
                what=f"the changes sensor of sync {self.sync_id!r}",
                read_seconds=self.poke_read_seconds,
                lag_threshold=self.lag_threshold,
                columns=self._columns,
            )
        return self._watch.read_once(hook, committed)

    @property
    def _watch_stop_at(self) -> datetime | None:
        """The source time of the position the first poke took (None: none, or not known)."""
        return None if self._watch is None else self._watch.watch_stop_at
