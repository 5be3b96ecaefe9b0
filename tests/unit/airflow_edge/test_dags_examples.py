"""The example DAGs load in Airflow's DagBag without errors and build the expected syncs."""

from __future__ import annotations

from airflow_provider_vitess.utils.airflow_compat import dag_bag
from tests.support.local import REPO

EXAMPLES = REPO / "dags_examples"


def test_every_example_dag_loads() -> None:
    bag = dag_bag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == [
        "vitess_commerce_multi",
        "vitess_commerce_sync",
        "vitess_corder_consumer",
        "vitess_customer_multi",
        "vitess_customer_sync",
    ]
    incremental = bag.dags["vitess_customer_sync"]  # get_dag() would ask the metadata database
    assert [t.task_id for t in incremental.topological_sort()] == [
        "snapshot",
        "merge_snapshot",
        "wait_for_changes",
        "catch_up",
        "merge",
    ]
    assert bag.dags["vitess_commerce_sync"].schedule is None  # manual: re-snapshots on demand
    assert bag.dags["vitess_customer_sync"].schedule == "*/5 * * * *"
    # The consumer is scheduled on exactly the Asset the sync's merge tasks declare for corder.
    merge_outlets = {o.uri for o in incremental.get_task("merge").outlets}
    consumer_assets = {a.uri for a in bag.dags["vitess_corder_consumer"].timetable.asset_condition.objects}
    assert consumer_assets <= merge_outlets and len(consumer_assets) == 1, (consumer_assets, merge_outlets)
