"""Snapshots copied by shard groups: each group's resume position, parts and progress.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28

A snapshot window of a sync with ``capture_parallelism`` is copied by its groups at once
(``capture/group_snapshot.py``), each checkpointing on its own: ``vitess_sync_window_group.
resume_vgtid`` is where a killed group resumes, ``vitess_sync_window_part.group_no`` the group
that recorded a part (NULL: the window's one reader, as every part before this revision), and
``vitess_sync_group_progress`` each group's per-table copy progress (the window's is their sum).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("vitess_sync_window_group") as batch:
        batch.add_column(sa.Column("resume_vgtid", sa.Text(), nullable=True))
    with op.batch_alter_table("vitess_sync_window_part") as batch:
        batch.add_column(sa.Column("group_no", sa.Integer(), nullable=True))
    stamp = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    op.create_table(
        "vitess_sync_group_progress",
        sa.Column("sync_id", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("group_no", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("table_name", sa.String(255), nullable=False),
        sa.Column("rows_known", sa.BigInteger(), nullable=True),
        sa.Column("rows_copied", sa.BigInteger(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.CheckConstraint(
            "phase IN ('copying', 'copied', 'streaming')", name="ck_vitess_sync_group_progress_phase"
        ),
        sa.ForeignKeyConstraint(
            ["sync_id", "seq"],
            ["vitess_sync_window.sync_id", "vitess_sync_window.seq"],
            name="fk_vitess_sync_group_progress_vitess_sync_window",
        ),
        sa.PrimaryKeyConstraint(
            "sync_id", "seq", "group_no", "table_name", name="pk_vitess_sync_group_progress"
        ),
    )


def downgrade() -> None:
    op.drop_table("vitess_sync_group_progress")
    with op.batch_alter_table("vitess_sync_window_part") as batch:
        batch.drop_column("group_no")
    with op.batch_alter_table("vitess_sync_window_group") as batch:
        batch.drop_column("resume_vgtid")
