"""``vitess_sync_dag``: one DAG per sync, snapshot-if-needed -> merge -> sense -> catch-up -> merge.

Every run is safe to start at any time, including as a backfill over past intervals: the sync's
position lives in the checkpoint store, not in the run's logical date, so a run always reads
from the committed VGTID up to *now* (a CDC source cannot be read "as of" a past interval).
A backfill run therefore catches up like a scheduled one, or finds nothing to do; it never
rewinds the checkpoint and never applies a window twice (Delta transaction ids).

Scheduled runs of one DAG never overlap (``max_active_runs=1``); a backfill has its own
``max_active_runs`` (Airflow's default is 10), so create backfills with ``max_active_runs=1``:
otherwise its runs race for the sync, and the sync lock fails all but one of them at once,
naming the holder (safe, but noisy).

Re-snapshot: trigger the DAG with the param ``resnapshot_tables`` (the trigger form lists the
sync's tables); that run copies those tables again and replaces their Delta tables.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param
from pydantic import ValidationError

from airflow_provider_vitess.capture.group_layout import group_split
from airflow_provider_vitess.capture.sync import VitessSync, domain_error, retitled
from airflow_provider_vitess.capture.sync_keywords import KEYWORDS, sync_from_keywords
from airflow_provider_vitess.deadlines import freshness_deadline
from airflow_provider_vitess.exceptions import SyncSettingsError
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator
from airflow_provider_vitess.operators.capture_groups import (
    VitessCatchUpGroupOperator,
    VitessCatchUpPlanOperator,
    VitessSnapshotGroupOperator,
    VitessSnapshotPlanOperator,
)
from airflow_provider_vitess.operators.follow import VitessFollowOperator
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.sensors.changes import VitessChangesSensor
from airflow_provider_vitess.utils.airflow_compat import DeadlineSafeDAG

RESNAPSHOT_PARAM = "resnapshot_tables"
# The share of the schedule's interval a run's catch-up may read for by default: the merge of
# what it read takes time too, and the next run should not wait for this one.
READ_SHARE_OF_INTERVAL = 0.5


# How long an on-changes run's sensor waits before the run ends as "no change" (and the next one
# starts waiting): long, so an idle sync costs one short run an hour.
ON_CHANGES_SENSOR_TIMEOUT = 3600.0


def schedule_interval(schedule: Any, start: datetime | None = None) -> timedelta | None:
    """The shortest time between two runs of ``schedule`` (a timedelta, a cron expression or
    preset), looked at over its next few runs; None for other schedules (manual, assets)."""
    if isinstance(schedule, timedelta):
        return schedule
    if not isinstance(schedule, str):
        return None
    from airflow.utils.dates import cron_presets
    from croniter import croniter  # type: ignore[import-untyped]  # Airflow's own cron library

    expression = cron_presets.get(schedule, schedule)
    if not croniter.is_valid(expression):
        return None  # "@once", "@continuous": no interval to fit in
    fires = croniter(expression, start or datetime(2026, 1, 1))
    times = [fires.get_next(datetime) for _ in range(8)]
    return timedelta(seconds=min((b - a).total_seconds() for a, b in itertools.pairwise(times)))


def default_max_seconds(schedule: Any) -> float | None:
    """A catch-up run's read budget when none is given: half the schedule's interval, so that a
    long backlog is read over several runs that each fit their interval; None (read until
    caught up) for schedules without an interval."""
    interval = schedule_interval(schedule)
    return None if interval is None else interval.total_seconds() * READ_SHARE_OF_INTERVAL


def vitess_sync_dag(
    dag_id: str,
    sync: VitessSync | Mapping[str, Any] | None = None,
    *,
    schedule: str | timedelta | None = "*/5 * * * *",
    start_date: datetime | None = None,
    default_args: Mapping[str, Any] | None = None,
    freshness_callback: Any = None,
    **kwargs: Any,
) -> DAG:
    """A DAG mirroring the tables of ``sync`` (a :class:`VitessSync`, or its JSON dict) into
    Delta tables under its ``target_location``; ``kwargs`` go to the DAG. Every field:
    ``docs/reference.md`` (generated from the models).

    The keyword form (``keyspace=``, ``tables=``, ``hash_columns=``, ``merge_kwargs=``, ...
    instead of ``sync``: the names of
    :func:`~airflow_provider_vitess.capture.sync_keywords.sync_from_keywords`) is kept,
    deprecated: it builds the same object, and the same DAG.

    ``wait.wait_for_changes``: a deferrable sensor waits up to ``wait.sensor_timeout`` seconds
    for a change to the tables past the committed position; without one the run ends early
    (skipped tasks), so frequent schedules cost seconds when nothing changes. A wait whose read
    the timeout cut before it reached the source's position (other tables' traffic on the
    shards) is not "no change": the run goes on. ``wait.lag_threshold``: the sensor also lets
    the run go on when a shard is more than this many transactions past the committed position.
    ``wait.on_changes``: run on the source's changes instead of a clock (``@continuous``, one run
    at a time; each run's deferred sensor waits in the triggerer, ``sensor_timeout`` one hour by
    default then); it replaces ``schedule``.

    ``budget.max_events`` bounds one catch-up window (what one Delta commit applies and what a
    killed read reads again); a run stages window after window until the backlog is read or its
    ``budget.max_seconds`` are spent, by default half the schedule's interval
    (:func:`default_max_seconds`), so each run fits its interval; without an interval a run
    reads it all. With ``capture_parallelism`` (shard groups: ``plan_snapshot``/``snapshot[i]``
    and ``plan_catch_up``/``catch_up[i]``, mapped over the groups) both bound a window read by
    one process only: each group reads to the window's stop.

    ``freshness_sla`` (seconds): past it the merge task warns and returns ``breached: true`` but
    succeeds, the status page shows the sync in red; each run also gets Airflow's deadline alert
    (``airflow_provider_vitess.deadlines``): a run not succeeded by its queue time + the
    sensor's wait + ``freshness_sla`` calls ``freshness_callback`` (an ``AsyncCallback``;
    default: an error in the triggerer's log); a ``deadline`` in ``kwargs`` replaces it.
    """
    keywords = {k: kwargs.pop(k) for k in list(kwargs) if k in KEYWORDS}
    if sync is None:
        sync = _from_keywords(dag_id, keywords)
    elif keywords:
        raise TypeError(
            f"DAG {dag_id!r}: give the sync as sync= or as keywords, not both: {sorted(keywords)} "
            "belong in the VitessSync"
        )
    elif not isinstance(sync, VitessSync):
        sync = VitessSync.model_validate(sync)
    return _sync_dag(dag_id, sync, schedule, start_date, default_args, freshness_callback, kwargs)


def _from_keywords(dag_id: str, keywords: dict[str, Any]) -> VitessSync:
    """The keyword form's object; a refusal is the rule's own error (as before the object)."""
    try:
        return sync_from_keywords(**keywords)
    except ValidationError as exc:
        error = domain_error(exc)
        raise (retitled(error, f"DAG {dag_id!r}: {error}") if error is not exc else exc) from None
    except SyncSettingsError as exc:
        raise retitled(exc, f"DAG {dag_id!r}: {exc}") from None
    except TypeError as exc:  # a required keyword missing
        raise TypeError(f"vitess_sync_dag({dag_id!r}, ...): {exc}") from None


def _sync_dag(
    dag_id: str,
    sync: VitessSync,
    schedule: Any,
    start_date: datetime | None,
    default_args: Mapping[str, Any] | None,
    freshness_callback: Any,
    dag_kwargs: dict[str, Any],
) -> DAG:
    """The DAG of ``sync``: every task's arguments from the object."""
    split = group_split(sync.capture_parallelism)
    table_list = sync.table_names
    wait = sync.wait
    if wait.on_changes:
        schedule = "@continuous"
    sensor_timeout = wait.sensor_timeout
    if sensor_timeout is None:
        sensor_timeout = ON_CHANGES_SENSOR_TIMEOUT if wait.on_changes else 60.0
    sync_id = sync.sync_id or dag_id
    common = sync.capture_arguments(sync_id)
    snapshot = sync.snapshot_arguments()
    merge = sync.merge_arguments(sync_id)
    freshness_sla = sync.freshness_sla
    if freshness_sla is not None and "deadline" not in dag_kwargs:
        sensor_wait = sensor_timeout if wait.wait_for_changes else None
        if wait.follow_seconds is not None:  # the follow task's rounds go on after the wait
            sensor_wait = (sensor_wait or 0.0) + wait.follow_seconds
        dag_kwargs["deadline"] = freshness_deadline(sync_id, freshness_sla, sensor_wait, freshness_callback)
    # DeadlineSafeDAG: ``airflow dags test`` of a DAG with a deadline works (see the class).
    dag = DeadlineSafeDAG(
        dag_id,
        schedule=schedule,
        start_date=start_date or datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        render_template_as_native_obj=True,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=30), **dict(default_args or {})},
        params={
            RESNAPSHOT_PARAM: Param(
                [],
                type="array",
                items={"type": "string", "enum": table_list},
                title="Re-snapshot tables",
                description="Copy these tables again and replace their Delta tables (others untouched).",
            )
        },
        tags=["vitess", sync.keyspace],
        doc_md=__doc__,
        **dag_kwargs,
    )
    with dag:
        resnapshot = "{{ params." + RESNAPSHOT_PARAM + " }}"
        copied: Any
        if split != 1:
            # The snapshot is copied by the same groups: plan_snapshot -> snapshot[0..N-1]. A
            # plan with nothing to copy maps the copy over no group (skipped): the merge still runs.
            plan_snapshot = VitessSnapshotPlanOperator(
                task_id="plan_snapshot",
                capture_parallelism=split,
                resnapshot_tables=resnapshot,
                **snapshot,
                **common,
            )
            copies = VitessSnapshotGroupOperator.partial(task_id="snapshot", **snapshot, **common).expand(
                group=plan_snapshot.output
            )
            plan_snapshot >> copies
            copied = copies
            merge_snapshot = VitessMergeOperator(
                task_id="merge_snapshot", trigger_rule="none_failed", **merge
            )
        else:
            copied = VitessSnapshotOperator(
                task_id="snapshot",
                resnapshot_tables=resnapshot,
                **snapshot,
                **common,
            )
            merge_snapshot = VitessMergeOperator(task_id="merge_snapshot", **merge)
        max_events, max_seconds = sync.budget.max_events, sync.budget.max_seconds
        read_for = default_max_seconds(schedule) if max_seconds is None else max_seconds
        # What bounds a catch-up read, the same whichever task reads.
        reads: dict[str, Any] = {
            "max_events": max_events,
            "max_seconds": read_for,
            "minimize_skew": sync.capture.minimize_skew,
        }
        catch_up: Any
        read: Any
        merge_changes: Any = None
        if wait.follow_seconds is not None:
            # Rounds of catch-up and merge in one task while the source is busy (capture/follow.py).
            catch_up = read = VitessFollowOperator(
                task_id="follow",
                catch_up={**common, **reads},
                follow_seconds=wait.follow_seconds,
                **merge,
            )
        elif split != 1:
            plan = VitessCatchUpPlanOperator(task_id="plan_catch_up", capture_parallelism=split, **common)
            groups = VitessCatchUpGroupOperator.partial(task_id="catch_up", **reads, **common).expand(
                group=plan.output
            )
            plan >> groups
            catch_up, read = plan, groups
        else:
            catch_up = read = VitessCatchUpOperator(task_id="catch_up", **reads, **common)
        if wait.follow_seconds is None:
            merge_changes = VitessMergeOperator(task_id="merge", **merge)
        if wait.wait_for_changes:
            sense = VitessChangesSensor(
                task_id="wait_for_changes",
                vitess_conn_id=sync.vitess_conn_id,
                sync_id=sync_id,
                keyspace=sync.keyspace,
                tables=table_list,
                checkpoint_conn_id=sync.checkpoint_conn_id,
                timeout=sensor_timeout,
                poke_interval=5,
                # Only "no change" skips the rest of the run; errors fail (soft_fail would
                # turn every failure into a skip).
                skip_on_timeout=True,
                deferrable=wait.deferrable,
                lag_threshold=wait.lag_threshold,
            )
            copied >> merge_snapshot >> sense >> catch_up
        else:
            copied >> merge_snapshot >> catch_up
        if merge_changes is not None:
            read >> merge_changes
    return dag
