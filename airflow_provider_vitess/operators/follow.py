"""``VitessFollowOperator``: catch up and merge in one task, window after window, while the
source keeps changing (``capture/follow.py`` says why and when it ends).

It is the merge operator (its Spark backend, outlets, links, XCom and OpenLineage) that also
runs the catch-up operator's read, with the arguments in ``catch_up``: a round is exactly the
catch-up task's run followed by the merge task's, under the sync's lock, so what each of them
guarantees (a killed read staged again, a killed merge merged again, never twice) holds round by
round, and a rerun of a killed follow task starts with whatever its last round left staged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.follow import FollowBounds, follow
from airflow_provider_vitess.checkpoints.store import CheckpointStore
from airflow_provider_vitess.connections import open_store
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.lineage import assets as lineage_assets
from airflow_provider_vitess.operators._sync import as_tables
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.utils.failures import task_failures
from airflow_provider_vitess.vstream.change_watch import ChangeWatch
from airflow_provider_vitess.vstream.changes import watched_columns

# The longest stream read of one check for a change (a quiet stream is read on from there).
CHECK_READ_SECONDS = 5.0


class _RoundRead(VitessCatchUpOperator):
    """The catch-up of a follow task's rounds: the follow task's DAG recorded as the sync's."""

    def __init__(self, *, follow_dag_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._follow_dag_id = follow_dag_id

    @property
    def dag_id(self) -> str:
        return self._follow_dag_id


class VitessFollowOperator(VitessMergeOperator):
    """Catch up and merge the sync's changes in rounds, until ``follow_seconds`` are spent or no
    change came for ``idle_seconds``; the DAG factory puts it behind the changes sensor of an
    ``on_changes`` sync with ``wait.follow_seconds`` set.

    :param catch_up: the :class:`VitessCatchUpOperator` arguments of each round's read (``sync_id``,
        ``keyspace``, ``tables``, ``staging_location``, ``max_events``...).
    :param follow_seconds: the task's whole time: no round starts after it.
    :param idle_seconds: end once no change came for this long after a round.
    :param poll_interval: seconds between two checks for a change (each a short stream read).

    The other arguments are :class:`VitessMergeOperator`'s. Returns (XCom) the last round's merge
    summary with ``rounds``, ``stopped`` (``follow_seconds`` or ``idle_seconds``), ``windows``
    (every window merged, in order) and ``rows`` (the row changes read).
    """

    template_fields: Sequence[str] = (*VitessMergeOperator.template_fields, "catch_up")
    template_fields_renderers = {**VitessMergeOperator.template_fields_renderers, "catch_up": "json"}  # noqa: RUF012
    ui_color = "#e4fff0"

    def __init__(
        self,
        *,
        catch_up: Mapping[str, Any],
        follow_seconds: float = 600.0,
        idle_seconds: float = 60.0,
        poll_interval: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.catch_up = dict(catch_up)
        self.bounds = FollowBounds(float(follow_seconds), float(idle_seconds), float(poll_interval))
        self._read: _RoundRead | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        self.outlets = lineage_assets.withhold(self.outlets, self.table_uris)  # each round adds back
        read = self._read = _RoundRead(task_id=self.task_id, follow_dag_id=self.dag_id, **self.catch_up)
        windows: list[int] = []
        rows = 0

        def round_() -> dict[str, Any]:
            nonlocal rows
            staged = read.execute(context)  # it closes what it opened, as the merge does
            rows += int(staged.get("rows_all_windows") or 0)
            merged = self.merge_staged(context)
            windows.extend(staged.get("windows") or ())
            return merged

        hook, store = VitessHook(read.vitess_conn_id), open_store(self.checkpoint_conn_id)
        try:
            outcome = follow(round_, _ChangeCheck(self, hook, store).changed, self.bounds)
        finally:
            hook.close()
            store.close()
        self.log.info(
            "sync %r: followed in %d round(s), %s row changes, windows %s; ended: %s",
            self.sync_id,
            len(outcome.results),
            f"{rows:,}",
            windows,
            outcome.stopped,
        )
        return {**outcome.results[-1], "rounds": len(outcome.results), "stopped": outcome.stopped,
                "windows": windows, "rows": rows}  # fmt: skip

    def on_kill(self) -> None:
        """Stop whichever of the round's read and merge is running; its window stays as it was."""
        if self._read is not None:
            self._read.on_kill()
        super().on_kill()


class _ChangeCheck:
    """Between rounds: has the sync a change past its committed position? One watch for the
    task: it reads on from where its last check of the same committed position stopped."""

    def __init__(self, task: VitessFollowOperator, hook: VitessHook, store: CheckpointStore) -> None:
        self.task, self.hook, self.store = task, hook, store
        self._watch: ChangeWatch | None = None

    def changed(self) -> bool:
        task, store = self.task, self.store
        committed, _ = store.committed(task.sync_id)
        if committed is None:
            return True  # nothing committed (a re-snapshot dropped it): the round says why
        if self._watch is None:  # the column choice is the sync's as the first round left it
            self._watch = ChangeWatch(
                str(task.catch_up["keyspace"]),
                as_tables(task.catch_up["tables"]),
                what=f"the follow task of sync {task.sync_id!r}",
                read_seconds=CHECK_READ_SECONDS,
                columns=watched_columns(store.sync_config(task.sync_id)),
            )
        with task_failures(task.log):
            return self._watch.read_once(self.hook, committed) is not None
