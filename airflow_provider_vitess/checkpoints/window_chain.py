"""A sync's unfinished windows, and where a new window may start.

Windows follow one another without a gap or an overlap: a new window is planned only when no
window is unfinished, except that a catch-up may follow STAGED catch-up windows (a backlog read
in several bounded windows by one run and merged together later); and a catch-up starts exactly
where the previous window ends (the last STAGED window's end, else the committed VGTID).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Row, Table, func, select
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints import committed as committed_rows
from airflow_provider_vitess.checkpoints import models
from airflow_provider_vitess.checkpoints.states import OPEN_STATES, WindowKind, WindowState
from airflow_provider_vitess.exceptions import CheckpointError

_WINDOW = cast(Table, models.WindowRow.__table__)


def open_rows(conn: Connection, sync_id: str) -> list[Row[Any]]:
    """The sync's unfinished (PLANNED, STAGED, MERGED) windows' rows, in seq order."""
    return list(
        conn.execute(
            select(_WINDOW)
            .where(_WINDOW.c.sync_id == sync_id, _WINDOW.c.state.in_([s.value for s in OPEN_STATES]))
            .order_by(_WINDOW.c.seq)
        )
    )


def refuse_if_open(conn: Connection, sync_id: str, kind: WindowKind) -> int:
    """The latest window's seq (0 if none); raises if an unfinished window forbids a new
    one: any, except STAGED catch-up windows before a new catch-up window."""
    latest = conn.execute(select(func.max(_WINDOW.c.seq)).where(_WINDOW.c.sync_id == sync_id)).scalar()
    for row in open_rows(conn, sync_id):
        chained = (
            kind is WindowKind.CATCHUP
            and WindowState(row.state) is WindowState.STAGED
            and WindowKind(row.kind) is WindowKind.CATCHUP
        )
        if not chained:
            raise CheckpointError(
                f"sync {sync_id!r}: window {row.seq} is {row.state}, not COMMITTED; resume it "
                "(open_window) instead of planning a new window"
            )
    return int(latest or 0)


def check_start(conn: Connection, sync_id: str, kind: WindowKind, start: str) -> None:
    """Refuse a catch-up that does not start where the previous window ends (``start`` is the
    VGTID's JSON): it would leave a gap or an overlap between windows."""
    if kind is not WindowKind.CATCHUP:
        return
    chain = open_rows(conn, sync_id)
    if chain and chain[-1].end_vgtid != start:
        raise CheckpointError(
            f"sync {sync_id!r}: a catch-up window after STAGED window {chain[-1].seq} must "
            f"start at its end ({chain[-1].end_vgtid}), not {start}"
        )
    committed, committed_seq = committed_rows.position(conn, sync_id)
    if not chain and committed and committed != start:
        raise CheckpointError(
            f"sync {sync_id!r}: a catch-up window must start at the committed VGTID of "
            f"window {committed_seq} ({committed}), not {start}"
        )
