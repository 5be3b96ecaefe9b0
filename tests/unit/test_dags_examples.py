"""The example DAGs load in Airflow's DagBag without errors and build the expected syncs."""

from __future__ import annotations

from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

EXAMPLES = Path(__file__).resolve().parents[2] / "dags_examples"


def test_every_example_dag_loads() -> None:
    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == [
        "vitess_commerce_multi",
        "vitess_commerce_sync",
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
