"""Triggers: the asynchronous waits of the provider's deferrable sensors (run in the triggerer)."""

from __future__ import annotations

from airflow_provider_vitess.triggers.changes import VitessChangesTrigger

__all__ = ["VitessChangesTrigger"]
