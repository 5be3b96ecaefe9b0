"""What the capture operators share: one sync's settings from their (templated) arguments.

Kept apart from the operators so they stay thin: each builds its ``SyncSpec`` with
:func:`sync_spec` and calls the capture runner. The store and object-storage settings from
Airflow connections live in :mod:`airflow_provider_vitess.connections`; log groups, metrics
and the lock holder's name in :mod:`airflow_provider_vitess.utils.task`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.spec import SyncSpec, as_tables, check_sync_id
from airflow_provider_vitess.connections import s3_settings, store_url
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vstream.spill import MemoryLimits

# The connection settings (and ``as_tables``) were here once; their callers may still import
# them from here.
__all__ = ["as_tables", "s3_settings", "store_url", "sync_spec"]


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
    check_sync_id(sync_id)
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
