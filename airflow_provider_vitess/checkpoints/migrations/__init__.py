"""Alembic environment of the checkpoint store; run through ``CheckpointStore.migrate()``."""
