"""Seeded DML on the demo tables ``customer.customer`` and ``customer.corder`` through vtgate, for
the DAG and backfill tests: upserts of customers, updates and deletes of orders, orders moved
between shards (DELETE + INSERT under another customer_id), and some customers deleted."""

from __future__ import annotations

import random

import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook


def run_workload(
    hook: VitessHook, seed: int, *, id_base: int, customers: int, orders: int, rounds: int, tag: str
) -> None:
    """``rounds`` seeded steps in one transaction, on ids ``id_base`` .. ``id_base + orders``."""
    rng = random.Random(seed)
    with hook.connect_sql() as conn, conn.begin():
        for i in range(rounds):
            cid, oid = id_base + rng.randint(0, customers), id_base + rng.randint(0, orders)
            conn.execute(
                sqlalchemy.text(
                    "INSERT INTO customer.customer (customer_id, email) VALUES (:c, :e) "
                    "ON DUPLICATE KEY UPDATE email = :e"
                ),
                {"c": cid, "e": f"{tag}-{seed}-{i}@example.com"},
            )
            action = rng.random()
            if action < 0.3:
                conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid})
            elif action < 0.6:
                conn.execute(
                    sqlalchemy.text("UPDATE customer.corder SET price = :p, sku = :s WHERE order_id = :o"),
                    {"o": oid, "p": rng.randint(-10, 10**12), "s": bytes([seed, i % 256, 0])},
                )
            else:  # delete + insert under another customer: the row moves between shards
                conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid})
                conn.execute(
                    sqlalchemy.text(
                        "INSERT INTO customer.corder (order_id, customer_id, sku, price) "
                        "VALUES (:o, :c, :s, :p)"
                    ),
                    {"o": oid, "c": cid, "s": bytes([i % 256, seed, 255]), "p": rng.randint(0, 10**9)},
                )
            if rng.random() < 0.15:
                conn.execute(
                    sqlalchemy.text("DELETE FROM customer.customer WHERE customer_id = :c"),
                    {"c": id_base + rng.randint(0, customers)},
                )
