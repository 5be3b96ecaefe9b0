"""Lock tokens (fencing) and the version each Delta target was last merged at.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

``vitess_sync_lock.token``: a new random token each time the lock is taken (or taken over);
every store write made under the lock names it and is refused once another holder took over.
``vitess_sync_target``: per sync and table, the last window merged into the Delta table and the
Delta version of that commit, checked before the next merge writes (integrity of the target).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("vitess_sync_lock") as batch:
        batch.add_column(sa.Column("token", sa.String(32), nullable=True))
    updated = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    op.create_table(
        "vitess_sync_target",
        sa.Column("sync_id", sa.String(200), nullable=False),
        sa.Column("table_name", sa.String(255), nullable=False),
        sa.Column("merged_seq", sa.Integer(), nullable=False),
        sa.Column("delta_version", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", updated, nullable=False),
        sa.ForeignKeyConstraint(
            ["sync_id"], ["vitess_sync_sync.sync_id"], name="fk_vitess_sync_target_vitess_sync_sync"
        ),
        sa.PrimaryKeyConstraint("sync_id", "table_name", name="pk_vitess_sync_target"),
    )


def downgrade() -> None:
    op.drop_table("vitess_sync_target")
    with op.batch_alter_table("vitess_sync_lock") as batch:
        batch.drop_column("token")
