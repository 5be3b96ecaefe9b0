"""Which window a capture run works on: the sync's unfinished one, resumed, or a new one.

Windows never interleave: a run first looks at the sync's unfinished window. One already staged
by an earlier run is handed back as it is (its files checked); one whose staged files are lost
or corrupt is abandoned and read again; one whose manifest was written by a run killed before
it recorded STAGED is adopted. Everything here runs under the sync's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_vitess.capture.outcome import WindowOutcome
from airflow_provider_vitess.checkpoints import CheckpointStore, Window, WindowKind, WindowState
from airflow_provider_vitess.exceptions import CheckpointError, CorruptStagedDataError
from airflow_provider_vitess.staging import load_manifest, verify
from airflow_provider_vitess.staging.retention import delete_window

log = logging.getLogger(__name__)


class WindowBook:
    """The unfinished-window rules of one sync (``location``/``options``: its staging)."""

    def __init__(
        self,
        store: CheckpointStore,
        sync_id: str,
        location: str,
        options: Mapping[str, Any] | None,
        holder: str,
    ) -> None:
        self.store, self.sync_id, self.location, self.holder = store, sync_id, location, holder
        self._options = self.options = options

    def unfinished(self, kind: WindowKind, *, discard: bool = False, reason: str = "") -> Window | None:
        """The sync's unfinished window, which must be of ``kind``: windows never interleave.

        With ``discard``, an unfinished window of the other kind that is not merged yet is
        abandoned (FAILED) instead: a re-snapshot is the way out of a window that cannot be
        staged or merged (a value no policy accepts, a schema change Delta cannot take). Nothing
        is lost: the checkpoint has not moved, so the next catch-up reads those changes again.
        """
        window = self.store.open_window(self.sync_id)
        if window is None or window.kind is kind:
            return window
        if discard and window.state in (WindowState.PLANNED, WindowState.STAGED):
            message = f"discarded by {reason} ({self.holder})"
            self.store.discard_unmerged(self.sync_id, message)  # with STAGED ones before it
            log.warning(
                "sync %r: unfinished %s window %d (%s) %s; the next catch-up reads its changes again "
                "from the committed position",
                self.sync_id,
                window.kind.value,
                window.seq,
                window.state.value,
                message,
            )
            return None
        # The factory's task names. A STAGED window is finished by its merge, not by its capture
        # task: a rerun of that task hands the same window back, and this run is refused again.
        # A DAG with follow_seconds catches up and merges in its follow task.
        snapshot = window.kind is WindowKind.SNAPSHOT
        if snapshot:
            capture_task, merge_task = "snapshot", "its merge task (merge_snapshot) commits it"
        else:
            capture_task = "catch_up"
            merge_task = "its merge task (merge; follow in a DAG with follow_seconds) commits it"
        remedy = (
            f"its {capture_task} task resumes it, then {merge_task}"
            if window.state is WindowState.PLANNED
            else f"{merge_task} (clear that task if it failed)"
        )
        raise CheckpointError(
            f"sync {self.sync_id!r} has an unfinished {window.kind.value} window {window.seq} "
            f"({window.state.value}); finish it before a {kind.value}: {remedy}"
        )

    def already_staged(self, window: Window) -> WindowOutcome | None:
        """The outcome of a window staged by an earlier run, or None when its staged files are
        lost or corrupt and the window was discarded (see :meth:`discard_lost`)."""
        seq, kind = window.seq, window.kind
        try:
            manifest = load_manifest(self.location, self.sync_id, seq, storage_options=self._options)
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
                f"sync {self.sync_id!r} window {seq} is {window.state.value} but {problem} in "
                f"{self.location!r}; run the merge task (follow in a DAG with follow_seconds) to commit it"
            )
        self.discard_lost(window, problem or "unreadable")
        return None

    def discard_lost(self, window: Window, problem: str) -> None:
        """An uncommitted window whose staged files are lost or corrupt is re-readable: its changes
        are still in vtgate from its start VGTID on. Abandon it (FAILED) and delete what is left
        of it; the caller plans a new window from the committed position, as a run would have."""
        log.warning(
            "sync %r window %d (%s) was staged but %s; discarding it and reading its changes again from %s",
            self.sync_id,
            window.seq,
            window.kind.value,
            problem,
            window.start_vgtid.to_json(),
        )
        delete_window(self.location, self.sync_id, window.seq, storage_options=self._options)
        # With the STAGED windows after it, which start where it ends.
        self.store.discard_unmerged(self.sync_id, f"staged files lost or corrupt: {problem}", window.seq)

    def replace(self, window: Window, reason: str) -> None:
        """An unmerged snapshot window that is not what is asked now (``reason``): delete its
        files and abandon it (FAILED), with any STAGED window after it; the caller plans the one
        asked for. Nothing committed is lost: the committed position does not move."""
        log.warning(
            "sync %r: unmerged %s window %d (%s) is replaced: %s (%s)",
            self.sync_id,
            window.kind.value,
            window.seq,
            window.state.value,
            reason,
            self.holder,
        )
        delete_window(self.location, self.sync_id, window.seq, storage_options=self._options)
        self.store.discard_unmerged(self.sync_id, f"replaced: {reason} ({self.holder})", window.seq)

    def adopt_written_manifest(self, seq: int, kind: WindowKind) -> WindowOutcome | None:
        """A run killed between writing the manifest and recording STAGED left a complete window:
        the manifest is written last, so its existence means every part is there. Record it."""
        manifest = load_manifest(self.location, self.sync_id, seq, storage_options=self._options)
        if manifest is None:
            return None
        verify(manifest)
        self.store.mark_staged(self.sync_id, seq, manifest.end_vgtid, manifest.path, dict(manifest.stats))
        log.info("sync %r window %d was staged by a run that stopped before recording it", self.sync_id, seq)
        return WindowOutcome(seq, kind, manifest, resumed=True, result=None)
