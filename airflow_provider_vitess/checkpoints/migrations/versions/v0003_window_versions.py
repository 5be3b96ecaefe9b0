"""The Delta version each committed window produced in each of its tables; the committed
position's time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28

``vitess_sync_window_version``: per sync, window and table, the Delta version of the window's
commit and the table's path: a cut across the sync's tables at one source position is read from
these rows (a table a window did not change has none; its version is its latest row's before).
``vitess_sync_checkpoint.as_of``: every source transaction committed before it is in the targets
(the stop position's time, ``checkpoints/freshness.py``); ``versions_from``: the oldest window a
cut can be taken at once older versions were pruned; ``freshness_sla``: the freshness objective
the merge task was given (seconds), for the status page.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    merged = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    with op.batch_alter_table("vitess_sync_checkpoint") as batch:
        batch.add_column(sa.Column("as_of", merged, nullable=True))
        batch.add_column(sa.Column("versions_from", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("freshness_sla", sa.Float(), nullable=True))
    op.create_table(
        "vitess_sync_window_version",
        sa.Column("sync_id", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("table_name", sa.String(255), nullable=False),
        sa.Column("delta_version", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("merged_at", merged, nullable=False),
        sa.ForeignKeyConstraint(
            ["sync_id"], ["vitess_sync_sync.sync_id"], name="fk_vitess_sync_window_version_vitess_sync_sync"
        ),
        sa.PrimaryKeyConstraint("sync_id", "seq", "table_name", name="pk_vitess_sync_window_version"),
    )


def downgrade() -> None:
    op.drop_table("vitess_sync_window_version")
    with op.batch_alter_table("vitess_sync_checkpoint") as batch:
        batch.drop_column("freshness_sla")
        batch.drop_column("versions_from")
        batch.drop_column("as_of")
