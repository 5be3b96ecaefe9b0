"""Old windows' rows leave the store, so that a sync's records stay bounded however long it runs.

A window's row, its staged parts and its per-table progress serve while it is open (resume, the
merge's keys) and for a while after (the status page's recent windows). Kept, per sync: every
open window, the newest ``keep`` windows, and the window of each table's latest progress row
(the key that table was built with, and its snapshot's figures). Every other COMMITTED or FAILED
window goes with its parts, progress and shard-group rows. The committed position and the targets' versions
live in tables of their own and are never pruned.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table, delete, func, select
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints import models, versions

_WINDOW = cast(Table, models.WindowRow.__table__)
_PART = cast(Table, models.WindowPartRow.__table__)
_PROGRESS = cast(Table, models.TableProgressRow.__table__)
_GROUP = cast(Table, models.WindowGroupRow.__table__)
_GROUP_PROGRESS = cast(Table, models.GroupProgressRow.__table__)
_DONE = ("COMMITTED", "FAILED")


def prune_windows(conn: Connection, sync_id: str, keep: int) -> list[int]:
    """Delete the rows of ``sync_id``'s windows no one reads any more (see the module); their seqs."""
    newest = conn.execute(select(func.max(_WINDOW.c.seq)).where(_WINDOW.c.sync_id == sync_id)).scalar()
    if newest is None or newest <= keep:
        return []
    latest_progress = (
        select(func.max(_PROGRESS.c.seq))
        .where(_PROGRESS.c.sync_id == sync_id)
        .group_by(_PROGRESS.c.table_name)
    )
    held = {int(s) for s in conn.scalars(latest_progress)}
    candidates = conn.scalars(
        select(_WINDOW.c.seq).where(
            _WINDOW.c.sync_id == sync_id, _WINDOW.c.seq <= newest - keep, _WINDOW.c.state.in_(_DONE)
        )
    )
    gone = sorted(int(s) for s in candidates if int(s) not in held)
    versions.prune(conn, sync_id, before=newest - keep + 1)
    for chunk in (gone[i : i + 500] for i in range(0, len(gone), 500)):  # bound each IN list
        for table in (_PART, _PROGRESS, _GROUP_PROGRESS, _GROUP, _WINDOW):  # children before their window
            conn.execute(delete(table).where(table.c.sync_id == sync_id, table.c.seq.in_(chunk)))
    return gone
