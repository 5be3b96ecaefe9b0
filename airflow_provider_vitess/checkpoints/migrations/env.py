"""Alembic environment, driven programmatically by ``CheckpointStore.migrate()`` (no alembic.ini).

The store passes its open connection in ``config.attributes["connection"]``; the version table
is ``vitess_sync_alembic_version`` so it never collides with Airflow's own ``alembic_version``
when both live in the same database. Offline mode (``alembic upgrade --sql``) is kept so a DBA
can review the DDL before granting it.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from airflow_provider_vitess.checkpoints.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run the checkpoint store migrations through CheckpointStore.migrate()")
    run_online(connection)
