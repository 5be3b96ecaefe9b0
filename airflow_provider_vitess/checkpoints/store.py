"""``CheckpointStore``: window states, staged parts, per-table progress and the committed VGTID,
in any SQLAlchemy database (SQLite, MariaDB/MySQL, PostgreSQL); the database and the per-sync
lock that fences its writes are :mod:`.database`'s.

Correctness rests on two rules (docs/design.md, "The window state machine"):
- every state change is a conditional ``UPDATE ... WHERE state = <the state we read>`` whose row
  count is checked, so two racing processes can never both move the same window;
- ``commit`` moves the window MERGED -> COMMITTED and the checkpoint in one transaction, so the
  committed position never passes a window whose Delta merge is not durable.

Only portable SQL is used (no upserts, no ``SELECT ... FOR UPDATE``, no advisory locks): the
lock is a row whose primary key makes the second INSERT fail on every database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from airflow_provider_vitess.checkpoints import committed as committed_rows
from airflow_provider_vitess.checkpoints import (
    freshness,
    models,
    progress,
    pruning,
    versions,
    window_chain,
)
from airflow_provider_vitess.checkpoints import groups as window_groups
from airflow_provider_vitess.checkpoints import parts as staged_parts
from airflow_provider_vitess.checkpoints.database import StoreDatabase
from airflow_provider_vitess.checkpoints.progress import GroupProgress
from airflow_provider_vitess.checkpoints.states import (
    Part,
    Phase,
    TableProgress,
    TargetVersion,
    Window,
    WindowKind,
    WindowState,
    check_transition,
    window_from_row,
)
from airflow_provider_vitess.exceptions import CheckpointError
from airflow_provider_vitess.vgtid import Vgtid

_SYNC = cast(Table, models.SyncRow.__table__)
_WINDOW = cast(Table, models.WindowRow.__table__)
# Where a MERGED window's stats keep the merge job's report.
MERGE_REPORT = "merge_report"


class CheckpointStore(StoreDatabase):
    """The metadata/checkpoint store of one database; call :meth:`migrate` once before use.
    The database, its schema and the per-sync lock are :class:`~.database.StoreDatabase`'s."""

    # -- syncs and the committed position -----------------------------------------------------

    def ensure_sync(
        self, sync_id: str, keyspace: str, tables: Sequence[str], config: Mapping[str, Any]
    ) -> None:
        """Create the sync, or update its tables and config; its keyspace can never change."""
        now, values = self._clock(), {"tables": list(tables), "config": dict(config)}
        for _ in range(2):
            with self._begin("sync update") as conn:
                row = conn.execute(select(_SYNC).where(_SYNC.c.sync_id == sync_id)).first()
                if row is not None:
                    if row.keyspace != keyspace:
                        raise CheckpointError(
                            f"sync {sync_id!r} belongs to keyspace {row.keyspace!r}, not {keyspace!r}: "
                            "use a new sync id for another keyspace"
                        )
                    if row.tables != values["tables"] or row.config != values["config"]:
                        conn.execute(
                            update(_SYNC).where(_SYNC.c.sync_id == sync_id).values(updated_at=now, **values)
                        )
                    return
            try:
                with self._begin("sync creation") as conn:
                    conn.execute(
                        insert(_SYNC).values(
                            sync_id=sync_id, keyspace=keyspace, created_at=now, updated_at=now, **values
                        )
                    )
                return
            except IntegrityError:
                continue  # created concurrently: the next round compares and updates it
        raise CheckpointError(f"sync {sync_id!r} could not be created or read")

    def sync_config(self, sync_id: str) -> dict[str, Any]:
        """The sync's stored config (staging location, each table's key choice)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(_SYNC.c.config).where(_SYNC.c.sync_id == sync_id)).first()
        if row is None:
            raise CheckpointError(f"unknown sync {sync_id!r}: nothing was captured for it yet")
        return dict(row.config or {})

    def committed(self, sync_id: str) -> tuple[Vgtid | None, int]:
        """The committed VGTID and window seq; ``(None, 0)`` before the first commit."""
        with self.engine.connect() as conn:
            end, seq = committed_rows.position(conn, sync_id)
        return (None if end is None else Vgtid.from_json(end)), seq

    # -- windows ------------------------------------------------------------------------------

    def window(self, sync_id: str, seq: int) -> Window:
        with self.engine.connect() as conn:
            return window_from_row(self._window_row(conn, sync_id, seq))

    def open_window(self, sync_id: str) -> Window | None:
        """The latest unfinished (PLANNED, STAGED or MERGED) window, the one to resume, if any.

        Earlier unfinished windows exist only as a chain of STAGED catch-up windows (with
        perhaps MERGED ones before them): see :meth:`open_windows`."""
        with self.engine.connect() as conn:
            rows = window_chain.open_rows(conn, sync_id)
        return window_from_row(rows[-1]) if rows else None

    def open_windows(self, sync_id: str) -> list[Window]:
        """Every unfinished window, in seq order: what a merge finishes, first to last."""
        with self.engine.connect() as conn:
            return [window_from_row(r) for r in window_chain.open_rows(conn, sync_id)]

    def next_catchup_start(self, sync_id: str) -> Vgtid | None:
        """Where the sync's next catch-up window starts: the end of its chain of STAGED catch-up
        windows, else the committed VGTID (None before the first commit)."""
        with self.engine.connect() as conn:
            chain = window_chain.open_rows(conn, sync_id)
        if chain and WindowState(chain[-1].state) is WindowState.STAGED and chain[-1].end_vgtid:
            return Vgtid.from_json(chain[-1].end_vgtid)
        return self.committed(sync_id)[0]

    def plan_window(
        self,
        sync_id: str,
        kind: WindowKind | str,
        start_vgtid: Vgtid,
        stop_vgtid: Vgtid | None = None,
        stop_taken_at: datetime | None = None,
        groups: Sequence[Sequence[str]] | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> int:
        """Record a new PLANNED window and return its seq (1, 2, ...).

        Refused while another window is unfinished (resume that one via :meth:`open_window`),
        except that a catch-up may follow STAGED catch-up windows (a backlog read in several
        bounded windows by one run, merged together later); and refused for a catch-up that does
        not start where the previous window ends (the committed VGTID, or the last STAGED
        window's end): either would leave a gap or an overlap between windows. ``stop_taken_at``:
        when the stop was taken (the window's *as of* time once it reaches it, :mod:`.freshness`).
        ``groups``: the window is read by shard groups at once, each the shards given (recorded
        with the window, in its transaction: :mod:`.groups`). ``stats``: more of the window's
        stats, known when it is planned (a run that resumes it reads them back; its STAGED mark
        keeps them).
        """
        kind = WindowKind(kind)
        planned: dict[str, Any] = dict(stats or {})
        if stop_taken_at is not None:
            planned[freshness.STOP_TAKEN_AT] = stop_taken_at.isoformat()
        if groups:
            planned[window_groups.WINDOW_GROUPS] = [list(g) for g in groups]
        now, start, seq = self._clock(), start_vgtid.to_json(), 0
        try:
            with self._begin("window plan") as conn:
                if conn.execute(select(_SYNC.c.sync_id).where(_SYNC.c.sync_id == sync_id)).first() is None:
                    raise CheckpointError(f"unknown sync {sync_id!r}: call ensure_sync first")
                # Two racing planners read the same latest window and collide on the
                # (sync_id, seq) key: no isolation level needed.
                seq = window_chain.refuse_if_open(conn, sync_id, kind) + 1
                window_chain.check_start(conn, sync_id, kind, start)
                conn.execute(
                    insert(_WINDOW).values(
                        sync_id=sync_id,
                        seq=seq,
                        kind=kind.value,
                        state=WindowState.PLANNED.value,
                        start_vgtid=start,
                        stop_vgtid=None if stop_vgtid is None else stop_vgtid.to_json(),
                        stats=planned,
                        created_at=now,
                        updated_at=now,
                    )
                )
                if groups:
                    window_groups.record_layout(conn, now, sync_id, seq, groups)
            return seq
        except IntegrityError as exc:
            with self.engine.connect() as conn:
                window_chain.refuse_if_open(conn, sync_id, kind)  # names the window planned concurrently
            raise CheckpointError(f"sync {sync_id!r}: window {seq} was planned concurrently") from exc

    def mark_staged(
        self,
        sync_id: str,
        seq: int,
        end_vgtid: Vgtid,
        manifest_path: str,
        stats: Mapping[str, Any] | None = None,
    ) -> None:
        """PLANNED -> STAGED once the manifest exists; repeating it with the same values is a no-op."""
        end = end_vgtid.to_json()

        def same(row: Row[Any]) -> None:
            if (row.end_vgtid, row.manifest_path) != (end, manifest_path):
                raise CheckpointError(
                    f"sync {sync_id!r} window {seq} is already STAGED with manifest {row.manifest_path!r} "
                    f"ending at {row.end_vgtid}; staged windows are immutable"
                )

        with self._begin("STAGED mark") as conn:
            planned = self._window_row(conn, sync_id, seq).stats or {}  # the stop's time
            self._transition(
                conn,
                sync_id,
                seq,
                WindowState.STAGED,
                {"end_vgtid": end, "manifest_path": manifest_path, "stats": {**planned, **(stats or {})}},
                same,
            )

    def mark_merged(
        self,
        sync_id: str,
        seq: int,
        targets: Mapping[str, int | None] | None = None,
        report: Mapping[str, Any] | None = None,
        paths: Mapping[str, str] | None = None,
        commits: Mapping[str, versions.TableCommit] | None = None,
    ) -> None:
        """STAGED -> MERGED after the Delta commit (txnAppId=sync id, txnVersion=seq) is durable.

        ``targets``: the tables that now hold this window, with the Delta version of its commit
        (None where no Delta table was needed or the version is unknown); recorded in the same
        transaction, for the integrity check of the next merge (:meth:`target_versions`).
        ``report`` (the merge job's, JSON) is kept in the window's stats under ``merge_report``:
        a task killed after this step reruns from MERGED and still knows what the merge changed.
        With ``paths`` (each target's location) the versions are kept per window too (cuts),
        each with its table's format and Iceberg snapshot from ``commits`` (none: Delta).
        """
        with self._begin("MERGED mark") as conn:
            values = None
            if report is not None:
                stats = self._window_row(conn, sync_id, seq).stats or {}
                values = {"stats": {**stats, MERGE_REPORT: dict(report)}}
            self._transition(conn, sync_id, seq, WindowState.MERGED, values)
            for table, version in (targets or {}).items():
                committed_rows.record_target(conn, self._clock(), sync_id, table, seq, version)
            versions.record(conn, self._clock(), sync_id, seq, targets or {}, paths or {}, commits)

    def target_versions(self, sync_id: str) -> dict[str, TargetVersion]:
        """Per table, the last window merged into its Delta table and that commit's version."""
        with self.engine.connect() as conn:
            return committed_rows.target_versions(conn, sync_id)

    def mark_failed(self, sync_id: str, seq: int, error: str) -> None:
        """Abandon an unmerged window; the next window starts again from the committed VGTID."""
        with self._begin("FAILED mark") as conn:
            self._transition(conn, sync_id, seq, WindowState.FAILED, {"error": error})

    def discard_unmerged(self, sync_id: str, error: str, from_seq: int = 0) -> list[int]:
        """Abandon (FAILED) every unfinished window from ``from_seq`` on, in one transaction:
        a chain of STAGED windows never keeps a window whose predecessor was discarded (it would
        start where nothing ends). Refused, with nothing changed, if one of them is MERGED: its
        rows are in Delta already, it can only be committed. Returns the seqs discarded."""
        with self._begin("FAILED mark") as conn:
            rows = [r for r in window_chain.open_rows(conn, sync_id) if r.seq >= from_seq]
            merged = [r.seq for r in rows if WindowState(r.state) is WindowState.MERGED]
            if merged:
                raise CheckpointError(
                    f"sync {sync_id!r} window {merged[0]} is MERGED: it cannot be discarded, only "
                    "committed; run the merge task first"
                )
            for row in rows:
                self._transition(conn, sync_id, row.seq, WindowState.FAILED, {"error": error})
        return [int(r.seq) for r in rows]

    def prune_windows(self, sync_id: str, keep: int) -> list[int]:
        """Delete the rows of old finished windows, keeping the newest ``keep`` (see
        :mod:`.pruning`); the seqs deleted."""
        with self._begin("window pruning") as conn:
            return pruning.prune_windows(conn, sync_id, keep)

    def commit(self, sync_id: str, seq: int) -> Vgtid:
        """MERGED -> COMMITTED and advance the checkpoint to the window's end, atomically.

        Returns the committed VGTID (also on an idempotent repeat, for the XCom push).
        """
        with self._begin("commit") as conn:
            row = self._window_row(conn, sync_id, seq)
            changed = self._transition(conn, sync_id, seq, WindowState.COMMITTED)
            end = committed_rows.commit_position(conn, self._clock(), row, changed)
        return Vgtid.from_json(end)

    def _window_row(self, conn: Connection, sync_id: str, seq: int) -> Row[Any]:
        row = conn.execute(select(_WINDOW).where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq)).first()
        if row is None:
            raise CheckpointError(f"sync {sync_id!r} has no window {seq}")
        return row

    def _transition(
        self,
        conn: Connection,
        sync_id: str,
        seq: int,
        requested: WindowState,
        values: Mapping[str, Any] | None = None,
        on_repeat: Callable[[Row[Any]], None] | None = None,
    ) -> bool:
        """Move the window to ``requested``; False (and no write) on an idempotent repeat."""
        row = self._window_row(conn, sync_id, seq)
        current = WindowState(row.state)
        if not check_transition(sync_id, seq, current, requested):
            if on_repeat is not None:
                on_repeat(row)
            return False
        changed = conn.execute(
            update(_WINDOW)
            .where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.seq == seq, _WINDOW.c.state == current.value)
            .values(state=requested.value, updated_at=self._clock(), **(values or {}))
        ).rowcount
        if changed != 1:
            raise CheckpointError(
                f"sync {sync_id!r} window {seq}: left {current.value} concurrently while moving to "
                f"{requested.value}; re-read the window and retry"
            )
        return True

    # -- shard groups -------------------------------------------------------------------------

    def window_groups(self, sync_id: str, seq: int) -> list[window_groups.WindowGroup]:
        """The window's shard groups, in order; empty for a window read by one process."""
        with self.engine.connect() as conn:
            return window_groups.load(conn, sync_id, seq)

    def mark_group_staged(
        self,
        sync_id: str,
        seq: int,
        group: int,
        end_vgtid: Vgtid,
        manifest_path: str,
        stats: Mapping[str, Any] | None = None,
    ) -> bool:
        """A group's part is staged (under the group's lock, fenced by it); see :mod:`.groups`."""
        with self._begin(f"group {group} STAGED mark") as conn:
            return window_groups.mark_staged(
                conn, self._clock(), sync_id, seq, group, end_vgtid, manifest_path, dict(stats or {})
            )

    # -- staged parts -------------------------------------------------------------------------

    def record_parts(
        self,
        sync_id: str,
        seq: int,
        parts: Sequence[Part],
        resume_vgtid: Vgtid,
        group: int | None = None,
        copied: Mapping[str, tuple[int, Phase]] | None = None,
    ) -> int:
        """Record staged files and the VGTID at which they end, in one transaction.

        A killed window resumes streaming from :meth:`resume_vgtid` and keeps these parts.
        Re-recording an identical part is a no-op (a retried batch); a different file under a
        known path is refused. Returns the number of parts newly recorded. With ``group`` (a
        snapshot copied by shard groups, under the group's lock): the parts are that group's and
        the resume position is the group's (:meth:`window_groups`). ``copied``: each table's
        rows copied and phase at that position, recorded in the same transaction (the phases a
        resume chooses ``tables_to_copy`` by must be those of its position).
        """
        return staged_parts.checkpoint(
            lambda: self._begin("staged parts"),
            self._clock,
            sync_id,
            seq,
            parts,
            resume_vgtid.to_json(),
            group,
            copied or {},
        )

    def parts(self, sync_id: str, seq: int, group: int | None = None) -> list[Part]:
        """The window's recorded parts (``group``: those the shard group recorded)."""
        with self.engine.connect() as conn:
            return staged_parts.load(conn, sync_id, seq, group)

    def resume_vgtid(self, sync_id: str, seq: int) -> Vgtid | None:
        """Where a resumed window streams from; None if it never recorded parts."""
        return self.window(sync_id, seq).resume_vgtid

    # -- progress -----------------------------------------------------------------------------

    def update_progress(
        self,
        sync_id: str,
        seq: int,
        table: str,
        rows_known: int | None = None,
        rows_copied: int | None = None,
        phase: Phase | str | None = None,
        key_columns: Sequence[str] | None = None,
        key_source: str | None = None,
        group: int | None = None,
    ) -> None:
        """Set the given fields of one table's progress (``group``: the shard group's, of a
        snapshot copied by groups; no key fields then); None leaves a field as it is."""
        values = progress.changes(rows_known, rows_copied, phase, key_columns, key_source)
        progress.save(lambda: self._begin("progress"), self._clock(), sync_id, seq, table, values, group)

    def progress(self, sync_id: str, seq: int) -> list[TableProgress]:
        """Every table's progress in the window, by table name; ``.percent`` when count is known.
        A window copied by shard groups: each table's figures summed over its groups."""
        return progress.load(self.engine, sync_id, seq)

    def group_progress(self, sync_id: str, seq: int) -> list[GroupProgress]:
        """Each group's per-table progress of a snapshot copied by groups (empty otherwise)."""
        with self.engine.connect() as conn:
            return progress.load_groups(conn, sync_id, seq)
