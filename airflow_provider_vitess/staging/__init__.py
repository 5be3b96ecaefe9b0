"""Staging of VStream changes as Parquet, one dataset per table per window, plus a manifest."""

from __future__ import annotations

from airflow_provider_vitess.staging.arrow_types import arrow_type, staged_schema
from airflow_provider_vitess.staging.manifest import (
    ColumnSchema,
    DdlRecord,
    Manifest,
    PartInfo,
    TableManifest,
    TableSchema,
    load_manifest,
)
from airflow_provider_vitess.staging.parts_check import read_table, verify
from airflow_provider_vitess.staging.writer import WindowStager

__all__ = [
    "ColumnSchema",
    "DdlRecord",
    "Manifest",
    "PartInfo",
    "TableManifest",
    "TableSchema",
    "WindowStager",
    "arrow_type",
    "load_manifest",
    "read_table",
    "staged_schema",
    "verify",
]
