"""Copy syncs from one checkpoint store to another: the way to move a store between databases
(the SQLite default to PostgreSQL or MySQL) without losing the syncs' windows.

A sync's store and its Delta tables move in step: each table holds the sync's windows as
transaction versions, and the store says which of them were committed and where the stream
goes on. A sync started on an empty store would number its windows from 1 again (refused, see
``capture/targets.py``), so a new store gets the old one's rows, copied whole and unchanged, in
one transaction. Locks are not copied: a sync is moved while none of its tasks run.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from airflow_provider_vitess.checkpoints.models import Base, LockRow, SyncRow
from airflow_provider_vitess.checkpoints.store import CheckpointStore
from airflow_provider_vitess.exceptions import CheckpointError


def copy_syncs(
    source: CheckpointStore, target: CheckpointStore, sync_ids: Sequence[str] | None = None
) -> dict[str, int]:
    """Copy ``sync_ids`` (default: every sync of ``source``) into ``target``; rows per table.

    Both stores are migrated to the newest schema first. A sync the target already holds is
    refused, naming it: merging two histories of one sync has no right answer.
    """
    source.migrate()
    target.migrate()
    with source.engine.connect() as conn:
        known = [str(s) for s in conn.scalars(select(SyncRow.sync_id))]
    chosen = list(sync_ids) if sync_ids else known
    missing = sorted(set(chosen) - set(known))
    if missing:
        raise CheckpointError(f"the source store holds no sync {missing} (it holds {sorted(known)})")
    tables = [t for t in Base.metadata.sorted_tables if t.name != LockRow.__tablename__]
    counts: dict[str, int] = {}
    with source.engine.connect() as read, target.engine.begin() as write:
        present = sorted(
            str(s) for s in write.scalars(select(SyncRow.sync_id).where(SyncRow.sync_id.in_(chosen)))
        )
        if present:
            raise CheckpointError(
                f"the target checkpoint store already holds sync(s) {present}: nothing was copied. "
                "Copy into a store that has never run them"
            )
        for table in tables:  # parents before children (foreign keys)
            rows = [dict(r._mapping) for r in read.execute(select(table).where(table.c.sync_id.in_(chosen)))]
            if rows:
                write.execute(table.insert(), rows)
            counts[table.name] = len(rows)
    return counts
