"""The extra links' old import path, kept for ``operators/merge.py``; they live in
:mod:`airflow_provider_vitess.plugins.links` (Airflow serializes links by name, not path)."""

from airflow_provider_vitess.plugins.links import DeltaTableLink, SparkUILink, VitessSyncStatusLink

__all__ = ["DeltaTableLink", "SparkUILink", "VitessSyncStatusLink"]
