"""Airflow operators: snapshot, catch-up window, and the Spark/Delta merge."""

from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator

__all__ = ["VitessCatchUpOperator", "VitessMergeOperator", "VitessSnapshotOperator"]


def __getattr__(name: str) -> object:
    # The merge operator needs apache-airflow-providers-apache-spark (the ``[spark]`` extra):
    # imported on first use so the capture operators work without it.
    if name == "VitessMergeOperator":
        from airflow_provider_vitess.operators.merge import VitessMergeOperator

        return VitessMergeOperator
    raise AttributeError(name)
