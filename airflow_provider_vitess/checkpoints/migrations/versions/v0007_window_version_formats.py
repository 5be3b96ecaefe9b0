"""Each window's table version with its table's format and, for Iceberg, its snapshot id.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

A consistent cut reads every table at the version a window's commit produced. Delta's time travel
names that version; Iceberg's names a snapshot id, which our Iceberg version (the snapshot's
sequence number less one) does not tell without the table's metadata log, and the status page
builds its SQL without a session. ``vitess_sync_window_version.table_format`` is the table's
format (``delta``, ``iceberg``), ``snapshot_id`` the Iceberg snapshot of that commit and
``catalog`` the JDBC catalog whose name the table has (NULL: an Iceberg table named by its
location, a Delta table). All nullable: the rows before this revision record none and read as
Delta, which every table of a released provider was (the downgrade drops them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("vitess_sync_window_version") as batch:
        batch.add_column(sa.Column("table_format", sa.String(16), nullable=True))
        batch.add_column(sa.Column("snapshot_id", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("catalog", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vitess_sync_window_version") as batch:
        batch.drop_column("catalog")
        batch.drop_column("snapshot_id")
        batch.drop_column("table_format")
