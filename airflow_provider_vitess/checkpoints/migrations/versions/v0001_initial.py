"""Initial checkpoint store schema: sync, window, window_part, table_progress, checkpoint, lock.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Written out in full rather than generated from the models at run time: a migration must keep
creating exactly this schema even after the models move on.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SYNC_ID = sa.String(200)
NAME = sa.String(255)
ENUM = sa.String(16)


def _ts(name: str, nullable: bool = False) -> sa.Column[object]:
    # Naive UTC; MySQL/MariaDB DATETIME would drop the microseconds without fsp=6.
    kind = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    return sa.Column(name, kind, nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "vitess_sync_sync",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("keyspace", NAME, nullable=False),
        sa.Column("tables", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("sync_id", name="pk_vitess_sync_sync"),
    )
    op.create_table(
        "vitess_sync_window",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", ENUM, nullable=False),
        sa.Column("state", ENUM, nullable=False),
        sa.Column("start_vgtid", sa.Text(), nullable=False),
        sa.Column("stop_vgtid", sa.Text(), nullable=True),
        sa.Column("end_vgtid", sa.Text(), nullable=True),
        sa.Column("resume_vgtid", sa.Text(), nullable=True),
        sa.Column("manifest_path", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stats", sa.JSON(), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.CheckConstraint(
            "state IN ('PLANNED', 'STAGED', 'MERGED', 'COMMITTED', 'FAILED')",
            name="ck_vitess_sync_window_state",
        ),
        sa.CheckConstraint("kind IN ('snapshot', 'catchup')", name="ck_vitess_sync_window_kind"),
        sa.ForeignKeyConstraint(
            ["sync_id"], ["vitess_sync_sync.sync_id"], name="fk_vitess_sync_window_vitess_sync_sync"
        ),
        sa.PrimaryKeyConstraint("sync_id", "seq", name="pk_vitess_sync_window"),
    )
    op.create_index("ix_vitess_sync_window_open", "vitess_sync_window", ["sync_id", "state"])
    op.create_table(
        "vitess_sync_window_part",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("part_no", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("table_name", NAME, nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("byte_count", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("resume_vgtid", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        _ts("created_at"),
        sa.ForeignKeyConstraint(
            ["sync_id", "seq"],
            ["vitess_sync_window.sync_id", "vitess_sync_window.seq"],
            name="fk_vitess_sync_window_part_vitess_sync_window",
        ),
        sa.PrimaryKeyConstraint("sync_id", "seq", "part_no", name="pk_vitess_sync_window_part"),
    )
    op.create_table(
        "vitess_sync_table_progress",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("table_name", NAME, nullable=False),
        sa.Column("rows_known", sa.BigInteger(), nullable=True),
        sa.Column("rows_copied", sa.BigInteger(), nullable=False),
        sa.Column("phase", ENUM, nullable=False),
        sa.Column("key_columns", sa.JSON(), nullable=True),
        sa.Column("key_source", sa.Text(), nullable=True),
        _ts("updated_at"),
        sa.CheckConstraint(
            "phase IN ('copying', 'copied', 'streaming')", name="ck_vitess_sync_table_progress_phase"
        ),
        sa.ForeignKeyConstraint(
            ["sync_id", "seq"],
            ["vitess_sync_window.sync_id", "vitess_sync_window.seq"],
            name="fk_vitess_sync_table_progress_vitess_sync_window",
        ),
        sa.PrimaryKeyConstraint("sync_id", "seq", "table_name", name="pk_vitess_sync_table_progress"),
    )
    op.create_table(
        "vitess_sync_checkpoint",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("committed_vgtid", sa.Text(), nullable=False),
        sa.Column("committed_seq", sa.Integer(), nullable=False),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(
            ["sync_id"], ["vitess_sync_sync.sync_id"], name="fk_vitess_sync_checkpoint_vitess_sync_sync"
        ),
        sa.PrimaryKeyConstraint("sync_id", name="pk_vitess_sync_checkpoint"),
    )
    op.create_table(
        "vitess_sync_lock",
        sa.Column("sync_id", SYNC_ID, nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        _ts("acquired_at"),
        _ts("heartbeat_at"),
        sa.PrimaryKeyConstraint("sync_id", name="pk_vitess_sync_lock"),
    )


def downgrade() -> None:
    op.drop_table("vitess_sync_lock")
    op.drop_table("vitess_sync_checkpoint")
    op.drop_table("vitess_sync_table_progress")
    op.drop_table("vitess_sync_window_part")
    op.drop_index("ix_vitess_sync_window_open", table_name="vitess_sync_window")
    op.drop_table("vitess_sync_window")
    op.drop_table("vitess_sync_sync")
