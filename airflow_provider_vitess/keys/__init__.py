"""Unique-key choice per table, following VReplication's rules (see ``rules``).

``table_shape`` reads a table through vtgate; ``choose_key`` decides which columns identify its
rows on the source and on the target, with optional per-table ``KeyOverrides``.
"""

from airflow_provider_vitess.keys.introspect import shape_from_rows, table_shape
from airflow_provider_vitess.keys.rules import (
    Column,
    Index,
    KeyChoice,
    KeyOverrides,
    TableShape,
    best_key,
    choose_key,
    explain_no_key,
    reconcile_keys,
)

__all__ = [
    "Column",
    "Index",
    "KeyChoice",
    "KeyOverrides",
    "TableShape",
    "best_key",
    "choose_key",
    "explain_no_key",
    "reconcile_keys",
    "shape_from_rows",
    "table_shape",
]
