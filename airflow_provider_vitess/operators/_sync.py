"""What the capture operators share: one sync's settings from their (templated) arguments.

Kept apart from the operators so they stay thin: each builds its ``SyncSpec`` with
:func:`sync_spec` and calls the capture runner. The store and object-storage settings from
Airflow connections live in :mod:`airflow_provider_vitess.connections`; log groups, metrics
and the lock holder's name in :mod:`airflow_provider_vitess.utils.task`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.spec import SyncSpec
from airflow_provider_vitess.connections import s3_settings, store_url
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vstream.spill import MemoryLimits

# The connection settings were here once; their callers may still import them from here.
__all__ = ["as_tables", "s3_settings", "store_url", "sync_spec"]

_SYNC_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def sync_spec(
    *,
    sync_id: str,
    keyspace: str,
    tables: Sequence[str],
    staging_location: str,
    key_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    zero_date_policy: str | None = None,
    zero_date_policies: Mapping[str, str] | None = None,
    include_columns: Mapping[str, Any] | None = None,
    exclude_columns: Mapping[str, Any] | None = None,
    hash_columns: Mapping[str, Any] | None = None,
    **spec: Any,
) -> SyncSpec:
    """The capture runner's :class:`SyncSpec` from operator arguments (after template rendering):
    the sync id checked, per-table key overrides, zero-date policies and column control parsed
    from the DAG's dicts."""
    if not _SYNC_ID.match(sync_id):
        raise VitessProviderError(
            f"sync_id {sync_id!r} must be 1-128 letters, digits, '_', '-' or '.', starting "
            "with a letter or digit (it names staging directories and Delta transaction ids)"
        )
    if not tables:
        raise VitessProviderError(f"sync {sync_id!r}: no tables given")
    overrides = {}
    for table, value in (key_overrides or {}).items():
        parsed = KeyOverrides.from_mapping(value)
        if parsed is not None:
            overrides[table] = parsed
    return SyncSpec(
        sync_id=sync_id,
        keyspace=keyspace,
        tables=tuple(tables),
        staging_location=staging_location,
        key_overrides=overrides,
        zero_dates=ZeroDatePolicies.parse(zero_date_policy, zero_date_policies, tables),
        columns=parse_columns(tables, include_columns, exclude_columns, hash_columns),
        **spec,
    )


def memory_limits(spill_dir: str | None) -> MemoryLimits:
    """The read's memory limits, spilling to ``spill_dir``, else to ``[vitess] spill_dir`` of the
    Airflow configuration, else to the system's temporary directory."""
    if not spill_dir:
        from airflow.configuration import conf

        spill_dir = conf.get("vitess", "spill_dir", fallback="") or None
    return MemoryLimits(spill_dir=spill_dir)


def as_tables(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Tables given as a list, or as text (a comma-separated or JSON list, from a template)."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            return tuple(str(t) for t in json.loads(text))
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return tuple(str(t) for t in value)
