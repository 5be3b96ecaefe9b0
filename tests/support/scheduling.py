"""How ``make test``'s two workers share the integration modules (``tests/conftest.py``'s
scheduler and collection order use these; ``tests/unit/house/test_tests_layout.py`` checks every
name is a module). Modules are named by their file's stem, unique within a tier."""

from __future__ import annotations

# Modules that write the same tables of the one cluster and check them whole (a table against its
# Delta copy, the events of a window, "no change" for a while), so a write of one breaks the
# other's check: each group runs in one worker, one module after another. A module not listed
# uses tables of its own and runs beside any other.
SHARED_TABLES: dict[str, tuple[str, ...]] = {
    # customer.customer and customer.corder (and commerce.product, commerce.big, which
    # test_snapshot and test_fencing get from the big_table fixture)
    "customer_tables": (
        "test_backfill_api",
        "test_backlog",
        "test_catchup",
        "test_dag_sync",
        "test_fencing",
        "test_lineage",
        "test_s3_sync",
        "test_snapshot",
        "test_status_page",
        "test_vstream_dml",
        "test_window",
    ),
    # customer.chgsensor_* (one fixture creates them), and the triggerer's default log port;
    # test_busy_shard and test_long_transaction use tables of their own, but their 170,000
    # transactions and 400,000-row transaction are in the one binlog every stream reads (one
    # MariaDB serves all shards): beside these modules a sensor's "no change" within its timeout
    # would become "scan_unfinished" and its latency asserts would fail.
    "changes_sensor_tables": (
        "test_changes_sensor",
        "test_sensor_failures",
        "test_busy_shard",
        "test_long_transaction",
    ),
    # customer.fault_rows, dropped and created again by each
    "fault_rows_table": ("test_faults", "test_staging_recovery"),
    # The four-shard cluster's keyspaces: test_reshard_groups creates and drops keyspace `regroup`,
    # and while its SrvKeyspace is gone vtgate refuses every MySQL connection ("keyspace regroup
    # fetch error"), so the other modules on that cluster failed beside it (a full run, session 22).
    "four_shard_cluster": ("test_copy_phase", "test_groups_four_shards", "test_reshard_groups"),
}

# The longest units of work, first: with ``--no-loadscope-reorder`` the workers take units in
# collection order (rooms alphabetically, then the job tier, then the unit tier's seconds-long
# modules), and a long unit taken last would be the run's tail. A module of a SHARED_TABLES group
# brings its whole group forward. Longest first, by a full run's times (session 23): the customer
# tables' group (~1,050 s), test_target_modes (~420 s), the changes sensor's group (~410 s),
# test_merge_delta (~330 s), the four-shard cluster's group (~250 s), then ~230-180 s each.
LONG_FIRST = (
    "test_backfill_api",
    "test_dag_sync",
    "test_target_modes",
    "test_busy_shard",
    "test_merge_delta",
    "test_groups_four_shards",
    "test_reshard",
    "test_sync_changes",
    "test_operations",
    "test_iceberg_sync",  # ~130 s alone (session 32): its own tables, Spark 4.1 merges
)
