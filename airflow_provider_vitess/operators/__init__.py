"""Airflow operators: snapshot, catch-up window, the Spark/Delta merge, and the follow task
that does both in rounds."""

from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator

__all__ = ["VitessCatchUpOperator", "VitessFollowOperator", "VitessMergeOperator", "VitessSnapshotOperator"]


def __getattr__(name: str) -> object:
    # The merge operator needs apache-airflow-providers-apache-spark (the ``[spark]`` extra):
    # imported on first use so the capture operators work without it.
    if name == "VitessMergeOperator":
        from airflow_provider_vitess.operators.merge import VitessMergeOperator

        return VitessMergeOperator
    if name == "VitessFollowOperator":
        from airflow_provider_vitess.operators.follow import VitessFollowOperator

        return VitessFollowOperator
    raise AttributeError(name)
