"""Incremental sync of the ``customer`` keyspace into Delta every 5 minutes.

The first run snapshots the tables; every run after it waits (deferred, no worker slot held) for
changes, reads one bounded catch-up window and merges it. Needs two Airflow connections:
``vitess_default`` (type ``vitess``: vtgate host, gRPC and MySQL ports, user, password, TLS) and
``spark_default`` (type ``spark``: ``local[*]``, ``spark://host:7077``, YARN or k8s).
Set ``VITESS_LAKE`` to where staging and Delta tables go (a local path or an s3a:// URI), and
``VITESS_CHANGE_WAIT`` to how many seconds a run waits for a change before it skips its catch-up
(60 by default; ``make demo`` sets 5, its first run has nothing to wait for).
"""

from __future__ import annotations

import os

from airflow_provider_vitess.dag_factory import vitess_sync_dag

LAKE = os.environ.get("VITESS_LAKE", "/tmp/vitess-lake")

dag = vitess_sync_dag(
    "vitess_customer_sync",
    keyspace="customer",
    tables=["customer", "corder"],
    staging_location=f"{LAKE}/staging",
    target_location=f"{LAKE}/delta/customer",
    schedule="*/5 * * * *",
    max_seconds=240,  # reading time per run (windows of max_events each): fits the interval
    sensor_timeout=float(os.environ.get("VITESS_CHANGE_WAIT", "60")),
)
