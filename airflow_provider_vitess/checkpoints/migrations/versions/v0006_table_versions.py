"""Format-neutral table versions: ``delta_version`` is ``table_version``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

The merge writes through a table format (``merge/job/formats``; Delta today, Iceberg next), so
the version a window's commit produced is named for the table, not for Delta:
``vitess_sync_target.delta_version`` and ``vitess_sync_window_version.delta_version`` are renamed
``table_version``, values kept. The provider's readers still answer the old name
(``TargetVersion.delta_version``); SQL that reads the store directly reads the new column. A
rename, not a second column: one number, one place (the downgrade renames it back).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, whether the column is nullable there)
_COLUMNS = (("vitess_sync_target", True), ("vitess_sync_window_version", False))


def _rename(old: str, new: str) -> None:
    for table, nullable in _COLUMNS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                old, new_column_name=new, existing_type=sa.BigInteger(), existing_nullable=nullable
            )


def upgrade() -> None:
    _rename("delta_version", "table_version")


def downgrade() -> None:
    _rename("table_version", "delta_version")
