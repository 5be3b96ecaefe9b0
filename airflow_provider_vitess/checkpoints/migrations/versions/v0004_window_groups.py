"""Shard groups: each group's part of a window read by several groups at once.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28

``vitess_sync_window_group``: per sync, window and group, the shards the group reads (the window's
group layout, fixed when the window is planned), its state (PLANNED, then STAGED once its part's
manifest is written), the position its read ended at and its manifest's path. The window itself
becomes STAGED, with one manifest listing every group's parts, once every group is STAGED
(``capture/groups.py``, docs/design.md "Shard groups").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    stamp = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    op.create_table(
        "vitess_sync_window_group",
        sa.Column("sync_id", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("group_no", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("shards", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("end_vgtid", sa.Text(), nullable=True),
        sa.Column("manifest_path", sa.Text(), nullable=True),
        sa.Column("stats", sa.JSON(), nullable=True),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.CheckConstraint("state IN ('PLANNED', 'STAGED')", name="ck_vitess_sync_window_group_state"),
        sa.ForeignKeyConstraint(
            ["sync_id", "seq"],
            ["vitess_sync_window.sync_id", "vitess_sync_window.seq"],
            name="fk_vitess_sync_window_group_vitess_sync_window",
        ),
        sa.PrimaryKeyConstraint("sync_id", "seq", "group_no", name="pk_vitess_sync_window_group"),
    )


def downgrade() -> None:
    op.drop_table("vitess_sync_window_group")
