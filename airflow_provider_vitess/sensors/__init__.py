"""Sensors: wait for Vitess before a sync runs."""

from __future__ import annotations

from airflow_provider_vitess.sensors.changes import VitessChangesSensor

__all__ = ["VitessChangesSensor"]
