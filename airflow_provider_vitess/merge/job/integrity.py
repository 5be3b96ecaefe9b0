"""Is each table what the sync last wrote to it? Checked before a merge writes (pure).

The same check for both formats, over the states each reads (Delta's transaction ids and
``RESTORE`` commits; Iceberg's snapshot summaries, sequence numbers and rollbacks:
:mod:`.iceberg_log`); the messages name the format. Below, Delta's terms.

A catch-up window holds only the changes since the previous window. Merged into a table that
is not the one the previous windows built, it silently makes a wrong table: into a missing
table it creates a partial one from this window's rows alone; into a table rolled back with
``RESTORE`` (or replaced) it re-applies nothing of what was lost. So before writing, each table
a window merges into (not one the plan's first window replaces: a snapshot rebuilds it whole) is
compared with what
the checkpoint store recorded when the sync last merged into it (``TableTarget.last_*``):

* the table must exist, unless the sync never needed one (its snapshot copied no rows);
* its Delta transaction version for the sync's app id must be at least the recorded window
  seq (lower: rolled back or replaced) and at most the plan's last window (higher: written by
  a run whose checkpoint store is not this one; checked for a snapshot's tables too, whose
  window would otherwise be taken for already applied);
* its Delta version must not be below the recorded commit's (recreated), and no ``RESTORE``
  may have been committed since.
* a window of the plan that the table holds already must hold the same read of the source
  (its commit's mark, :mod:`.marks`): another read of the same seq means the store planned the
  window again from an older position (restored from a backup, its staging gone).
* a ``history`` or ``changelog`` table must hold no window between the one the store recorded
  and the plan's first: such a window was committed by a merge killed before the store knew,
  then discarded with its staging lost, and the plan reads its changes again, which would append
  them twice. A ``mirror`` or ``soft_delete`` table takes them again as the same upserts.

Any mismatch raises :class:`TargetIntegrityError` naming the table, what was expected and found,
and the remedy: re-snapshot that table (nothing was written; other tables are unaffected).

A snapshot replaces its tables whole, so they are not compared; but a table this sync never
wrote that holds data and no window of this sync (another sync's, another program's) is not
replaced: refused, naming it (two syncs pointed at one target are found so).
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_vitess.exceptions import STORE_REMEDY, TargetIntegrityError, TargetModeChangedError
from airflow_provider_vitess.merge.job.steps import TableState
from airflow_provider_vitess.merge.modes import TargetMode, recorded_shape, shape_change, shape_marker
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget


def check_targets(
    plan: MergePlan, states: Mapping[str, TableState], reads: Mapping[int, str] | None = None
) -> None:
    """Raise :class:`TargetIntegrityError` for the first table of ``states`` that is not what
    the sync wrote. ``states``: the tables the plan writes (the job reads no others: a table a
    run does not write cannot be made wrong by it, and is checked by the run that writes it).
    ``reads``: per window seq of the plan, the read its manifest names (:mod:`.marks`)."""
    last_seq = max(w.seq for w in plan.windows)
    for table in sorted(states):
        target, state = plan.targets[table], states[table]
        _refuse_shape_change(plan, table, state)
        other = _other_read(state, reads or {})
        if other is not None:
            raise TargetIntegrityError(
                f"sync {plan.sync_id!r} table {table!r}: the {_kind(plan)} table at {target.path} {other}; "
                f"nothing was written. {STORE_REMEDY}"
            )
        ahead = _ahead(target, state, last_seq)
        if ahead is not None:
            # Not a re-snapshot: its window would be numbered below the table's and taken for
            # already applied, so that remedy would loop.
            raise TargetIntegrityError(
                f"sync {plan.sync_id!r} table {table!r}: the {_kind(plan)} table at {target.path} {ahead}; "
                f"nothing was written. {STORE_REMEDY}"
            )
        if table in plan.windows[0].replace_tables:
            # Rebuilt whole by the plan's first window (a snapshot): nothing earlier counts, but
            # a table this sync never wrote is someone else's, and is not replaced.
            _refuse_foreign(plan, table, state)
            continue
        problem = _problem(target, state, _kind(plan)) or _discarded_but_held(target, state, plan)
        if problem is not None:
            raise TargetIntegrityError(
                f"sync {plan.sync_id!r} table {table!r}: the {_kind(plan)} table at {target.path} {problem}; "
                "merging this window into it would leave a partial or wrong table, so nothing was "
                "written. Re-snapshot the table to rebuild it (trigger the DAG with "
                f'{{"resnapshot_tables": ["{table}"]}}); the other tables are unaffected'
            )


def _refuse_shape_change(plan: MergePlan, table: str, state: TableState) -> None:
    """A table keeps the target mode it was built in (its properties record it): a window in
    another mode would mix two shapes of rows in one table, so nothing is written."""
    if not state.exists:
        return
    target = plan.targets[table]
    # Delta records the shape in the schema's column metadata, Iceberg (which keeps none) in the
    # table's properties: the state carries both.
    change = shape_change(recorded_shape({**shape_marker(state.schema), **state.properties}), target.shape)
    if change is None:
        return
    raise TargetModeChangedError(
        f"sync {plan.sync_id!r} table {table!r}: the {_kind(plan)} table at {target.path} {change}; a "
        "table's target mode cannot change, so nothing was written. Keep the mode it was built "
        "in, or give the table a new target location (its entry in targets, or target_location) "
        f'and re-snapshot it (trigger the DAG with {{"resnapshot_tables": ["{table}"]}})'
    )


def _other_read(state: TableState, reads: Mapping[int, str]) -> str | None:
    """A window of the plan that the table holds from another read of the source (its commit's
    mark): the seq was planned again from an older position. Taken for applied, the changes
    read past the old window would be lost."""
    for seq in sorted(state.marks):
        if seq in reads and state.marks[seq] != reads[seq]:
            return (
                f"holds window {seq} of this sync from another read of the source (read "
                f"{state.marks[seq]}; the window to merge now is read {reads[seq]}): the checkpoint "
                "store was restored from an older backup, or its windows were planned again, after "
                f"window {seq} was merged, so this window would be taken for applied and the "
                "changes read past the old one lost"
            )
    return None


def _ahead(target: TableTarget, state: TableState, last_seq: int) -> str | None:
    """Written by a run of another checkpoint store (a snapshot's table included)."""
    if state.txn_version is None or state.txn_version <= last_seq:
        return None
    seq = target.last_merged_seq
    expected = "no window" if seq is None else f"window {seq}"
    return (
        f"holds window {state.txn_version} of this sync, ahead of the checkpoint store "
        f"({expected} merged, window {last_seq} to merge now): it was written by a run with "
        "another checkpoint store, or the store was replaced or restored from an older backup"
    )


def _discarded_but_held(target: TableTarget, state: TableState, plan: MergePlan) -> str | None:
    """A window the table holds that the store never recorded as merged into it, before the
    plan's: committed by a killed merge, then discarded (its staged files lost) and read again
    by the plan's windows. An appending mode would hold its changes twice."""
    if target.last_merged_seq is None or target.shape.mode not in _APPENDING:
        return None
    held = {*state.marks, *([] if state.txn_version is None else [state.txn_version])}
    first = plan.windows[0].seq
    between = sorted(s for s in held if target.last_merged_seq < s < first)
    if not between:
        return None
    return (
        f"holds window {between[-1]} of this sync, which the checkpoint store discarded (its staged "
        f"files were lost after a merge that was killed had committed it; the store recorded window "
        f"{target.last_merged_seq} last): the windows to merge now ({first} on) read its changes "
        f"again, and a {target.shape.mode.value} table would hold them twice"
    )


_APPENDING = (TargetMode.HISTORY, TargetMode.CHANGELOG)


def _refuse_foreign(plan: MergePlan, table: str, state: TableState) -> None:
    """A snapshot may replace a table this sync built (a re-snapshot), never one with data that
    holds no window of it: another sync's (two syncs pointed at one target) or another
    program's. Replacing it would lose that data silently, and the two writers would then
    overwrite each other."""
    target = plan.targets[table]
    if target.last_merged_seq is not None or not state.exists or state.txn_version is not None:
        return
    if state.size is not None and state.size.files == 0:
        return  # an empty table made ready for the sync: nothing to lose
    version = "" if state.version is None else f" ({_kind(plan)} version {state.version})"
    raise TargetIntegrityError(
        f"sync {plan.sync_id!r} table {table!r}: the {_kind(plan)} table at {target.path} already exists"
        f"{version} and holds no window of this sync: another sync or program wrote it. Its "
        "snapshot would replace that table, so nothing was written. Give this sync's table "
        "another target (target_location, or its entry in targets); or, if that table may be "
        "replaced, delete it and run the sync again"
    )


def _kind(plan: MergePlan) -> str:
    """The tables' format as the messages name it."""
    return {"delta": "Delta", "iceberg": "Iceberg"}.get(plan.table_format, plan.table_format)


def _problem(target: TableTarget, state: TableState, kind: str = "Delta") -> str | None:
    seq, version = target.last_merged_seq, target.last_delta_version
    if seq is None:
        if not state.exists:
            return "does not exist and this sync never built it (no snapshot of the table was merged)"
        if state.txn_version is None:
            return "exists but holds no window of this sync (it was not built by this sync)"
    elif not state.exists:
        if version is None:
            return None  # its snapshot copied no rows: this window may create it
        return (
            f"is missing: this sync last merged window {seq} into it ({kind} version {version}); "
            "it was deleted or moved"
        )
    elif state.txn_version is None:
        return (
            f"holds no window of this sync, but window {seq} was merged into it: it was replaced "
            "by another writer"
        )
    elif state.txn_version < seq:
        return (
            f"holds this sync's windows only up to {state.txn_version}, but window {seq} was merged "
            f"into it: it was rolled back ({'RESTORE' if kind == 'Delta' else 'rollback_to_snapshot'}) "
            "or replaced by an older copy"
        )
    if version is not None and state.version is not None and state.version < version:
        return (
            f"is at {kind} version {state.version}, below version {version} this sync committed "
            f"window {seq} as: it was recreated"
        )
    if state.restores:
        at = ", ".join(map(str, state.restores))
        how = f"RESTORE at Delta version {at}" if kind == "Delta" else f"rolled back to version {at}"
        return f"was restored to an earlier version ({how}) after this sync last wrote it"
    return None
