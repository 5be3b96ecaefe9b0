"""The status documents: what a checkpoint store says about its syncs, as JSON-able models.

Pure data assembly (no Airflow imports): the status page's API serves these models, and users'
own dashboards can call :func:`overview` / :func:`sync_status` on a
:class:`~airflow_provider_vitess.checkpoints.CheckpointStore` directly. Every value comes from
the store; nothing here writes to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from airflow_provider_vitess.checkpoints import CheckpointStore, Window, WindowState, freshness, history
from airflow_provider_vitess.checkpoints.groups import WindowGroup, groups_of_windows, readers
from airflow_provider_vitess.checkpoints.states import TableProgress
from airflow_provider_vitess.consistent_reads import consistent_cut, table_sql
from airflow_provider_vitess.exceptions import CutUnavailableError
from airflow_provider_vitess.vgtid import Vgtid

DEFAULT_WINDOWS = 20
# Whether the reader may see a sync run by these DAGs (empty: not recorded).
MayRead = Callable[[Sequence[str]], bool]
MAX_WINDOWS = 500
_FINAL = frozenset({WindowState.COMMITTED, WindowState.FAILED})


def _anyone(dags: Sequence[str]) -> bool:
    return True


class ShardPosition(BaseModel):
    keyspace: str
    shard: str
    gtid: str
    copying: bool = Field(description="the shard is still in a snapshot's copy phase")


class Committed(BaseModel):
    """The committed position: merged into Delta and durable."""

    seq: int = Field(description="the window that moved it last")
    committed_at: datetime
    age_seconds: float = Field(description="seconds since it last moved")
    vgtid: str = Field(description="the VGTID as JSON, as the operators push it to XCom")
    shards: list[ShardPosition]
    as_of: datetime | None = Field(
        default=None, description="every source transaction committed before it is in every table"
    )
    seconds_behind: float | None = Field(default=None, description="now minus as_of, in seconds")
    freshness_sla: float | None = Field(default=None, description="the objective (seconds), if any")
    freshness_breached: bool = Field(default=False, description="seconds_behind > freshness_sla")


class TableSummary(BaseModel):
    """One table of a sync on the status page: its merge key and its latest snapshot copy."""

    table: str
    key_columns: list[str] = Field(description="the unique key the merge matches rows on")
    key_reason: str | None = Field(default=None, description="why that key was chosen")
    snapshot_seq: int | None = Field(
        default=None, description="the window of the table's latest snapshot copy"
    )
    phase: str | None = None
    rows_copied: int | None = None
    rows_known: int | None = Field(default=None, description="count(*) taken while the copy ran")
    percent: float | None = Field(default=None, description="rows_copied / rows_known, capped at 100")


class GroupStatus(BaseModel):
    """One shard group's part of a window read by several processes (``capture_parallelism``)."""

    group: int
    shards: list[str] = Field(description="the shards the group reads (after a reshard: the new ones)")
    state: str = Field(description="PLANNED (being read) or STAGED (its part recorded)")
    rows: int | None = Field(default=None, description="row events its part staged")
    reader: str | None = Field(
        default=None, description="the task reading it now (holder of the group's lock), if any"
    )


class WindowStatus(BaseModel):
    seq: int
    kind: str = Field(description="snapshot or catchup")
    state: str = Field(description="PLANNED, STAGED, MERGED, COMMITTED or FAILED")
    created_at: datetime | None
    updated_at: datetime | None
    duration_seconds: float | None = Field(
        default=None, description="planned -> final state; for an open window, planned -> now"
    )
    rows: int | None = Field(default=None, description="row events staged")
    rows_per_table: dict[str, int] = Field(default_factory=dict)
    shard_lag: dict[str, int] = Field(
        default_factory=dict, description="per keyspace/shard: transactions behind the window's stop position"
    )
    stopped_early: str | None = None
    error: str | None = None
    as_of: datetime | None = Field(default=None, description="the time its end stands for, if it moves it")
    seconds_behind_at_commit: float | None = Field(
        default=None, description="how old its data was when it committed (COMMITTED windows)"
    )
    groups: list[GroupStatus] = Field(
        default_factory=list, description="its shard groups, in key-range order; empty: read by one process"
    )


class LockStatus(BaseModel):
    holder: str
    acquired_at: datetime
    heartbeat_at: datetime


class LastError(BaseModel):
    seq: int
    at: datetime | None
    error: str


class SyncSummary(BaseModel):
    store: str = Field(description="which configured checkpoint store holds the sync")
    sync_id: str
    keyspace: str
    tables: list[str]
    committed_seq: int | None
    committed_age_seconds: float | None
    latest_window: WindowStatus | None
    running: bool = Field(
        description="a task holds the sync's lock, or a shard group's (its groups are being read)"
    )
    freshness_breached: bool = Field(default=False, description="its data is older than its freshness_sla")
    dags: list[str] = Field(
        default_factory=list, description="the DAGs that ran it (who may read them may read this)"
    )


class CutTable(BaseModel):
    path: str
    version: int = Field(
        description="the table's version to read: Delta's; Iceberg's snapshot sequence number less one"
    )
    window: int = Field(description="the window that produced that version")
    table_format: str = Field(default="delta", description="the table's format: delta or iceberg")
    snapshot_id: int | None = Field(
        default=None, description="the Iceberg snapshot of that version, which Iceberg's time travel names"
    )
    catalog: str | None = Field(
        default=None,
        description="the Iceberg JDBC catalog the SQL names the table in (null: named by its location)",
    )
    sql: str = Field(
        description="Spark SQL reading the table at the cut (a SQL comment saying why where there is none)"
    )


class ConsistentCut(BaseModel):
    """Every table at the end of one committed window: read together, no transaction is torn."""

    window: int
    tables: dict[str, CutTable]


class SyncStatus(SyncSummary):
    table_status: list[TableSummary]
    committed: Committed | None
    cut: ConsistentCut | None = Field(
        default=None, description="each table's version at the committed position"
    )
    windows: list[WindowStatus] = Field(description="the last windows, newest first")
    lock: LockStatus | None
    last_error: LastError | None


class Overview(BaseModel):
    generated_at: datetime
    syncs: list[SyncSummary]
    errors: dict[str, str] = Field(default_factory=dict, description="stores that could not be read, and why")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def window_status(window: Window, now: datetime, groups: Sequence[WindowGroup] = ()) -> WindowStatus:
    stats: Mapping[str, Any] = window.stats or {}
    end = window.updated_at if window.state in _FINAL else now
    stopped = stats.get("stopped_early")
    as_of = freshness.window_as_of(window.kind, stats, window.created_at) if window.created_at else None
    committed = window.state is WindowState.COMMITTED
    return WindowStatus(
        seq=window.seq,
        kind=window.kind.value,
        state=window.state.value,
        created_at=window.created_at,
        updated_at=window.updated_at,
        duration_seconds=_seconds(window.created_at, end),
        rows=stats.get("rows"),
        rows_per_table={str(t): int(n) for t, n in dict(stats.get("rows_per_table") or {}).items()},
        shard_lag={str(s): int(n) for s, n in dict(stats.get("shard_lag_transactions") or {}).items()},
        stopped_early=str(stopped) if stopped else None,
        error=window.error,
        as_of=as_of,
        seconds_behind_at_commit=(
            freshness.seconds_behind(as_of, window.updated_at) if committed and window.updated_at else None
        ),
        groups=[_group_status(g) for g in groups],
    )


def _group_status(group: WindowGroup) -> GroupStatus:
    rows = group.stats.get("rows")
    return GroupStatus(
        group=group.group,
        shards=list(group.shards),
        state=group.state.value,
        rows=None if rows is None else int(rows),
    )


def _with_groups(store: CheckpointStore, windows: Sequence[Window], now: datetime) -> list[WindowStatus]:
    """The windows' statuses with their shard groups, read in one query for all of them (and one
    for who reads the open ones' groups now): each group's shards are the ones it read, so a
    window planned after a reshard shows the new shards."""
    if not windows:
        return []
    found = groups_of_windows(store.engine, windows[0].sync_id, [w.seq for w in windows])
    reading = readers(
        store.engine, (g for g in itertools.chain(*found.values()) if g.state is WindowState.PLANNED)
    )
    shown = [window_status(w, now, found.get(w.seq, ())) for w in windows]
    for status in shown:
        for group in status.groups:
            holder = reading.get((status.seq, group.group))
            group.reader = None if holder is None else holder.holder
    return shown


def _reading(shown: Sequence[WindowStatus]) -> bool:
    """A group of a shown window is being read (the sync's own lock is free meanwhile)."""
    return any(g.reader for w in shown for g in w.groups)


def _table_status(table: str, config: Mapping[str, Any], copied: TableProgress | None) -> TableSummary:
    choice = dict(dict(config.get("keys") or {}).get(table) or {})
    key = list(choice.get("target_columns") or (copied.key_columns if copied else None) or [])
    status = TableSummary(table=table, key_columns=key, key_reason=choice.get("reason"))
    if copied is not None:
        status.snapshot_seq = copied.seq
        status.phase = copied.phase.value
        status.rows_copied = copied.rows_copied
        status.rows_known = copied.rows_known
        pct = copied.percent
        status.percent = None if pct is None else round(pct, 1)
    return status


def _committed(point: history.Checkpoint | None, now: datetime) -> Committed | None:
    if point is None:
        return None
    vgtid = Vgtid.from_json(point.committed_vgtid)
    return Committed(
        seq=point.committed_seq,
        committed_at=point.updated_at,
        age_seconds=_seconds(point.updated_at, now) or 0.0,
        vgtid=point.committed_vgtid,
        shards=[ShardPosition(keyspace=s.keyspace, shard=s.shard, gtid=s.gtid, copying=s.is_copying)
                for s in vgtid.shard_gtids],
        as_of=point.as_of,
        seconds_behind=freshness.seconds_behind(point.as_of, now),
        freshness_sla=point.freshness_sla,
        freshness_breached=freshness.breached(point.as_of, point.freshness_sla, now),
    )  # fmt: skip


def _summary(
    store_name: str, info: history.SyncInfo, committed: Committed | None,
    latest: WindowStatus | None, running: bool,
) -> SyncSummary:  # fmt: skip
    return SyncSummary(
        store=store_name,
        sync_id=info.sync_id,
        keyspace=info.keyspace,
        tables=info.tables,
        committed_seq=committed.seq if committed else None,
        committed_age_seconds=committed.age_seconds if committed else None,
        freshness_breached=committed.freshness_breached if committed else False,
        latest_window=latest,
        running=running,
        dags=dags_of(info),
    )


def dags_of(info: history.SyncInfo) -> list[str]:
    """The DAGs that ran the sync, as its capture tasks recorded them (none before they did)."""
    return [str(d) for d in info.config.get("dags") or ()]


def _cut(store: CheckpointStore, sync_id: str) -> ConsistentCut | None:
    try:
        taken = consistent_cut(store, sync_id)
    except CutUnavailableError:
        return None
    tables = {
        t.table: CutTable(
            path=t.path,
            version=t.version,
            window=t.seq,
            table_format=t.table_format,
            snapshot_id=t.snapshot_id,
            catalog=t.catalog,
            sql=table_sql(t),
        )
        for t in taken.tables.values()
    }
    return ConsistentCut(window=taken.seq, tables=tables)


def sync_summary(
    store: CheckpointStore, store_name: str, info: history.SyncInfo, now: datetime
) -> SyncSummary:
    latest = history.recent_windows(store.engine, info.sync_id, 1)
    committed = _committed(history.checkpoint(store.engine, info.sync_id), now)
    shown = _with_groups(store, latest[:1], now)
    running = store.lock_holder(info.sync_id) is not None or _reading(shown)
    return _summary(store_name, info, committed, shown[0] if shown else None, running)


def sync_status(
    store: CheckpointStore,
    store_name: str,
    sync_id: str,
    now: datetime,
    windows: int = DEFAULT_WINDOWS,
    may_read: MayRead = _anyone,
) -> SyncStatus | None:
    """Everything the store knows about one sync; None if it has no such sync, or if
    ``may_read`` (given the sync's DAGs) says the reader may not see it."""
    info = history.sync(store.engine, sync_id)
    if info is None or not may_read(dags_of(info)):
        return None
    recent = history.recent_windows(store.engine, sync_id, max(1, min(windows, MAX_WINDOWS)))
    committed = _committed(history.checkpoint(store.engine, sync_id), now)
    lock = store.lock_holder(sync_id)
    progress = history.latest_progress(store.engine, sync_id)
    failed = history.last_failed_window(store.engine, sync_id)
    shown = _with_groups(store, recent, now)
    running = lock is not None or _reading(shown)
    summary = _summary(store_name, info, committed, shown[0] if shown else None, running)
    return SyncStatus(
        **summary.model_dump(),
        table_status=[_table_status(t, info.config, progress.get(t)) for t in info.tables],
        committed=committed,
        cut=_cut(store, sync_id),
        windows=shown,
        lock=None if lock is None else LockStatus(
            holder=lock.holder, acquired_at=lock.acquired_at, heartbeat_at=lock.heartbeat_at
        ),
        last_error=None if failed is None or not failed.error else LastError(
            seq=failed.seq, at=failed.updated_at, error=failed.error
        ),
    )  # fmt: skip


def overview(stores: Mapping[str, CheckpointStore], now: datetime, may_read: MayRead = _anyone) -> Overview:
    """Every sync of every store that ``may_read`` (given the sync's DAGs) lets the reader see;
    a store that cannot be read is named in ``errors``."""
    syncs: list[SyncSummary] = []
    errors: dict[str, str] = {}
    for name, store in stores.items():
        try:
            if store.schema_revision() is None:
                continue  # no sync ever ran against this store
            syncs.extend(
                sync_summary(store, name, info, now)
                for info in history.syncs(store.engine)
                if may_read(dags_of(info))
            )
        except Exception as exc:  # one broken store must not hide the others
            errors[name] = f"{type(exc).__name__}: {exc}"
    return Overview(generated_at=now, syncs=syncs, errors=errors)
