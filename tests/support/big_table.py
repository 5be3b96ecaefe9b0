"""Table ``commerce.big`` (200,000 rows) for the snapshot tests that kill a long copy (the snapshot's
and the fencing's modules; the ``big_table`` fixture is in ``tests/integration/conftest.py``), and
how they read the source, the staged rows and the copy's progress."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import Manifest, read_table
from tests.support.local import LocalVitess, connection_uri_env

BIG_ROWS = 200_000


def make_big_table(vitess: LocalVitess) -> str:
    """commerce.big with exactly 200,000 rows, built by doubling with INSERT ... SELECT (and
    commerce.product long enough to copy to be killed mid-way); the connection id to use."""
    name, value = connection_uri_env("vitess_big", vitess)
    os.environ[name] = value
    hook = VitessHook("vitess_big")
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text(
                "CREATE TABLE IF NOT EXISTS commerce.big (id BIGINT NOT NULL PRIMARY KEY, "
                "name VARCHAR(64), amount DECIMAL(12,2), created DATETIME(6))"
            )
        )
    with hook.connect_sql() as conn:
        products = conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM commerce.product")).scalar_one()
    if products < 20_000:  # product must take long enough to copy to be killed mid-way
        for batch in range(20):
            with hook.connect_sql() as conn, conn.begin():
                conn.execute(
                    sqlalchemy.text(
                        "INSERT IGNORE INTO commerce.product (sku, description, price) VALUES (:sku, :d, :p)"
                    ),
                    [
                        {"sku": f"bulk-{batch}-{i}".encode(), "d": f"bulk product {i} " + "x" * 80, "p": i}
                        for i in range(1000)
                    ],
                )
    with hook.connect_sql() as conn:
        count = conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM commerce.big")).scalar_one()
    if count != BIG_ROWS:
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(sqlalchemy.text("DELETE FROM commerce.big"))
            conn.execute(
                sqlalchemy.text(
                    "INSERT INTO commerce.big VALUES (1, 'row 1', 0.01, '2026-01-01 00:00:00.000001')"
                )
            )
        size = 1
        while size < BIG_ROWS:
            with hook.connect_sql() as conn, conn.begin():
                conn.execute(
                    sqlalchemy.text(
                        "INSERT INTO commerce.big SELECT id + :n, CONCAT('row ', id + :n), amount + 1.25, "
                        "created + INTERVAL 1 SECOND FROM commerce.big WHERE id + :n <= :max"
                    ),
                    {"n": size, "max": BIG_ROWS},
                )
            size *= 2
    return "vitess_big"


def select_all(hook: VitessHook, keyspace: str, table: str) -> dict[Any, tuple[Any, ...]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        # OLAP streams the result: vttablet caps OLTP results at 10,000 rows.
        cur.execute("SET workload = 'olap'")
        cur.execute(f"SELECT * FROM `{keyspace}`.`{table}`")
        return {row[0]: tuple(row) for row in cur.fetchall()}
    finally:
        raw.close()


def staged_rows(manifest: Manifest, table: str) -> tuple[dict[Any, tuple[Any, ...]], int]:
    """Staged rows of a snapshot (inserts only) by key, and how many rows were staged."""
    data = read_table(manifest, table).to_pylist()
    columns = [c for c in data[0] if not c.startswith("_")] if data else []
    rows = {r[columns[0]]: tuple(r[c] for c in columns) for r in data if r["_op"] != "delete"}
    return rows, len(data)


def copied_rows(store: CheckpointStore, sync_id: str) -> int:
    """Rows copied so far over all tables, as the running snapshot last recorded them."""
    try:
        return sum(p.rows_copied or 0 for p in store.progress(sync_id, 1))
    except Exception:  # the child has not created the store's tables yet
        return 0
