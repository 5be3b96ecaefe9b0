"""A manually triggered sync of ``commerce`` whose runs can re-snapshot chosen tables.

Every DAG built by ``vitess_sync_dag`` takes the param ``resnapshot_tables``: in the UI, "Trigger
DAG" shows a form listing the sync's tables; the tables picked are copied again and their Delta
tables replaced (one Delta commit each); the other tables are left untouched, and the run then
catches up as usual. From the CLI:

    airflow dags trigger vitess_commerce_sync -c '{"resnapshot_tables": ["product"]}'
"""

from __future__ import annotations

import os

from airflow_provider_vitess.dag_factory import vitess_sync_dag

LAKE = os.environ.get("VITESS_LAKE", "/tmp/vitess-lake")

dag = vitess_sync_dag(
    "vitess_commerce_sync",
    keyspace="commerce",
    tables=["product"],
    staging_location=f"{LAKE}/staging",
    target_location=f"{LAKE}/delta/commerce",
    schedule=None,
)
