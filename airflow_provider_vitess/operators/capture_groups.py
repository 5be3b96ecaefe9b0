"""Operators of a sync read by shard groups (``capture_parallelism``, ``capture/groups.py``).

``VitessCatchUpPlanOperator`` plans the window (stop position and group layout) under the sync's
lock and returns its groups; ``VitessCatchUpGroupOperator``, mapped over them
(``.partial(...).expand(group=plan.output)``), reads one group each, so on a Celery or Kubernetes
executor the groups run on different workers. A failed group is retried (or cleared) alone: the
others' parts stay staged. The merge task then merges the window as one.

The snapshot of such a sync is split the same way (``capture/group_snapshot.py``):
``VitessSnapshotPlanOperator`` decides whether a snapshot is needed (as the snapshot task does)
and plans it with its groups (``[]``: nothing to copy, the mapped copy is skipped);
``VitessSnapshotGroupOperator``, mapped over them, copies one group's shards each.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from airflow_provider_vitess.capture.group_layout import GroupSplit, group_split
from airflow_provider_vitess.capture.group_snapshot import GroupedSnapshot
from airflow_provider_vitess.capture.groups import GroupedCatchUp
from airflow_provider_vitess.operators._sync import (
    accepts_sync,
    capture_parts,
    catch_up_parts,
    grouped,
    snapshot_parts,
)
from airflow_provider_vitess.operators.capture import (
    _SYNC_FIELDS,
    VitessSnapshotOperator,
    _CaptureOperatorBase,
)
from airflow_provider_vitess.utils.failures import task_failures
from airflow_provider_vitess.utils.task import emit_metrics, log_group
from airflow_provider_vitess.vstream.window import ReadBounds


class VitessCatchUpPlanOperator(_CaptureOperatorBase[GroupedCatchUp]):
    """Plan the sync's next catch-up window read by shard groups (``capture_parallelism``: their
    number, or their key ranges such as ``["-80", "80-"]``), or find the unfinished one. Returns
    (XCom) the window's group numbers, what the group task is mapped over (``[0]``: one process
    reads it, a keyspace of one shard or during a reshard)."""

    job = GroupedCatchUp

    template_fields: Sequence[str] = (*_SYNC_FIELDS, "capture_parallelism")

    @accepts_sync(grouped(capture_parts))
    def __init__(self, *, capture_parallelism: GroupSplit | str = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capture_parallelism = capture_parallelism

    def execute(self, context: Any) -> list[int]:
        with task_failures(self.log):
            runner = self._runner(context)
            groups = runner.plan(group_split(self.capture_parallelism))
            self.log.info("sync %r: the window is read by group(s) %s", self.sync_id, groups)
            return groups


class VitessCatchUpGroupOperator(_CaptureOperatorBase[GroupedCatchUp]):
    """Read one shard group's part of the sync's planned catch-up window (``group``: mapped
    from the plan task's result), to the window's stop: the parts of a window are one cut, so
    ``max_events``/``max_seconds`` bound only a window read by one process (group 0 of ``[0]``)."""

    job = GroupedCatchUp

    template_fields: Sequence[str] = (*_SYNC_FIELDS, "group", "max_events", "max_seconds")

    @accepts_sync(catch_up_parts)
    def __init__(
        self,
        *,
        group: int | str = 0,
        max_events: int | None = None,
        max_seconds: float | None = None,
        minimize_skew: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.group = group
        self.max_events = max_events
        self.max_seconds = max_seconds
        self.minimize_skew = minimize_skew

    def execute(self, context: Any) -> dict[str, Any]:
        with task_failures(self.log):
            runner = self._runner(context, minimize_skew=self.minimize_skew)
            bounds = ReadBounds(
                max_events=int(self.max_events) if self.max_events else None,
                max_seconds=float(self.max_seconds) if self.max_seconds else None,
            )
            started = time.monotonic()
            with log_group(f"Vitess catch-up of {self.keyspace} group {self.group} (sync {self.sync_id})"):
                result = runner.read_group(int(self.group), bounds)
            elapsed = time.monotonic() - started
            self.log.info("sync %r group %s: %s in %.1f s", self.sync_id, self.group, result, elapsed)
            emit_metrics("catch_up_group", self.sync_id, {"events": float(result.get("rows") or 0)})
            return result


class VitessSnapshotPlanOperator(VitessSnapshotOperator):
    """The snapshot task of a sync read by shard groups: whether a snapshot is needed (as
    :class:`VitessSnapshotOperator` decides: a new sync, ``resnapshot_tables``, tables that joined,
    an unfinished snapshot), and if so its window planned with the group layout. Returns (XCom)
    the groups the copy task is mapped over: ``[]`` when nothing is to be copied, ``[0]`` for a
    window copied by one process (fewer than two groups)."""

    job = GroupedSnapshot

    template_fields: Sequence[str] = (*VitessSnapshotOperator.template_fields, "capture_parallelism")

    @accepts_sync(grouped(snapshot_parts))
    def __init__(self, *, capture_parallelism: GroupSplit | str = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capture_parallelism = capture_parallelism

    def execute(self, context: Any) -> list[int]:  # type: ignore[override]  # the groups, not a summary
        with task_failures(self.log):
            runner = cast(GroupedSnapshot, self._runner(context))
            need = self._needed(runner)
            if not need.needed:
                return []
            groups = runner.plan_snapshot(group_split(self.capture_parallelism), need.tables, need)
            self.log.info("sync %r: the snapshot is copied by group(s) %s", self.sync_id, groups)
            return groups


class VitessSnapshotGroupOperator(VitessSnapshotOperator):
    """Copy one shard group's part of the sync's planned snapshot window (``group``: mapped from
    the plan task's result), checkpointed every ``checkpoint_every_rows`` rows of the group."""

    job = GroupedSnapshot

    template_fields: Sequence[str] = (*_SYNC_FIELDS, "group")

    @accepts_sync(snapshot_parts)
    def __init__(self, *, group: int | str = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group = group

    def execute(self, context: Any) -> dict[str, Any]:
        with task_failures(self.log):
            runner = cast(GroupedSnapshot, self._runner(context))
            started = time.monotonic()
            with log_group(f"Vitess snapshot of {self.keyspace} group {self.group} (sync {self.sync_id})"):
                result = runner.copy_group(
                    int(self.group),
                    checkpoint_every_rows=self.checkpoint_every_rows,
                    copy_stall_seconds=self.copy_stall_timeout,
                )
            elapsed = time.monotonic() - started
            self.log.info(
                "sync %r snapshot group %s: %s in %.1f s", self.sync_id, self.group, result, elapsed
            )
            emit_metrics("snapshot_group", self.sync_id, {"rows": float(result.get("rows") or 0)})
            return result
