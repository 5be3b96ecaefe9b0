"""Schema migrations of the checkpoint store, run from code through Alembic (no alembic.ini).

The Alembic environment and the versioned scripts live in ``migrations/`` inside the package;
the version table is ``vitess_sync_alembic_version`` so that it never collides with Airflow's
own ``alembic_version`` when the store shares Airflow's metadata database.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import DBAPIError

from airflow_provider_vitess.checkpoints.models import PREFIX, VERSION_TABLE
from airflow_provider_vitess.exceptions import CheckpointError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Alembic's ``context`` and ``op`` are module-global proxies: two threads migrating at once in one
# process would overwrite each other's, so threads take turns (processes race safely, below).
_IN_PROCESS = threading.Lock()


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the checkpoint store ships at least one migration"
    return head


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at; None before the first migration."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def migrate(engine: Engine, wait_seconds: float = 60.0) -> str:
    """Upgrade the schema to the newest revision and return it; a no-op when already there.

    Two processes may migrate at once (two Airflow tasks on a fresh database): the loser's
    CREATE TABLE fails with "already exists" (or, on PostgreSQL, a duplicate key in the
    catalog), after which it waits for the winner to finish instead of failing the task.
    """
    head = head_revision()
    config = alembic_config()
    try:
        with _IN_PROCESS, engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
        return head
    except DBAPIError as exc:
        deadline = time.monotonic() + wait_seconds
        while True:
            if schema_revision(engine) == head:
                log.info("the checkpoint store schema was migrated concurrently by another process")
                return head
            # Without any of our tables nobody else is migrating: the error is the real problem.
            if not _has_store_tables(engine) or time.monotonic() > deadline:
                raise CheckpointError(
                    f"migrating the checkpoint store at {engine.url!r} failed: {exc}"
                ) from exc
            time.sleep(0.5)


def _has_store_tables(engine: Engine) -> bool:
    with engine.connect() as conn:
        return any(name.startswith(PREFIX) for name in inspect(conn).get_table_names())
