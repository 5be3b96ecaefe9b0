"""One sync DAG per keyspace, from a small table of settings.

Each keyspace is its own sync (own checkpoint, staging directory and lock), so keyspaces catch up
independently and one failing keyspace does not hold the others back.
"""

from __future__ import annotations

import os

from airflow_provider_vitess.dag_factory import vitess_sync_dag

LAKE = os.environ.get("VITESS_LAKE", "/tmp/vitess-lake")

# keyspace -> (tables, schedule)
KEYSPACES: dict[str, tuple[list[str], str]] = {
    "commerce": (["product"], "*/10 * * * *"),
    "customer": (["customer", "corder"], "*/5 * * * *"),
}

for keyspace, (tables, schedule) in KEYSPACES.items():
    dag_id = f"vitess_{keyspace}_multi"
    globals()[dag_id] = vitess_sync_dag(
        dag_id,
        keyspace=keyspace,
        tables=tables,
        schedule=schedule,
        staging_location=f"{LAKE}/staging",
        target_location=f"{LAKE}/delta/multi/{keyspace}",
    )
