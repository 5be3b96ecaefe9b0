"""Runs after each merge that changed the Delta table ``corder`` of ``vitess_customer_sync``.

Scheduled on the table's Asset (its location as a URI); the asset event's ``extra`` tells which
window changed it and how (``kind``: snapshot, catchup or re-snapshot; rows inserted, updated,
deleted; the committed VGTID). A window that did not touch ``corder`` does not trigger it.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, task

LAKE = os.environ.get("VITESS_LAKE", "/tmp/vitess-lake")
CORDER = Asset(f"file://{LAKE}/delta/customer/corder")  # s3a://bucket/... would be s3://bucket/...

with DAG("vitess_corder_consumer", schedule=[CORDER], tags=["vitess"]):

    @task(inlets=[CORDER])
    def report_change(inlet_events: dict | None = None) -> dict:
        extra = dict(inlet_events[CORDER][-1].extra) if inlet_events else {}
        print(f"corder changed by window {extra.get('window_seq')} ({extra.get('kind')}): {extra}")
        return extra

    report_change()
