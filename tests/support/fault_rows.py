"""Table ``customer.fault_rows``, dropped and created again by each module that uses it (the fault
tests and the staging recovery's; ``tests/conftest.py`` runs them in one worker)."""

from __future__ import annotations

import random
from typing import Any

import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook

TABLE = "fault_rows"


def execute(hook: VitessHook, *statements: str, params: list[dict[str, Any]] | None = None) -> None:
    with hook.connect_sql() as conn:
        for sql in statements:
            conn.execute(sqlalchemy.text(sql), params or {})
            conn.commit()


def setup_table(hook: VitessHook) -> None:
    execute(
        hook,
        f"DROP TABLE IF EXISTS customer.{TABLE}",
        f"CREATE TABLE customer.{TABLE} (id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
        "payload VARBINARY(255), PRIMARY KEY (id))",
    )
    try:  # the vschema outlives a dropped table
        execute(hook, f"ALTER VSCHEMA ON customer.{TABLE} ADD VINDEX hash(customer_id) USING hash")
    except sqlalchemy.exc.DBAPIError as exc:
        if "already" not in str(exc):
            raise


def insert_rows(hook: VitessHook, rng: random.Random, ids: range, customer: int | None = None) -> None:
    """One transaction inserting ``ids`` (on one shard when ``customer`` is given)."""
    rows = [
        {"i": i, "c": customer if customer is not None else rng.randint(1, 1000), "p": rng.randbytes(200)}
        for i in ids
    ]
    with hook.connect_sql() as conn:
        conn.execute(
            sqlalchemy.text(f"INSERT INTO customer.{TABLE} (id, customer_id, payload) VALUES (:i, :c, :p)"),
            rows,
        )
        conn.commit()
