"""What the operators share: one sync's settings, its checkpoint store, log groups and metrics.

Kept apart from the operators so they stay thin: each builds its ``SyncSpec`` with :func:`sync_spec` from its
(templated) arguments, opens the store named by an Airflow connection, and calls the capture
or merge modules.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.runner import SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.store import default_url
from airflow_provider_vitess.checkpoints.urls import url_from_connection
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vstream.spill import MemoryLimits

log = logging.getLogger(__name__)

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
    **spec: Any,
) -> SyncSpec:
    """The capture runner's :class:`SyncSpec` from operator arguments (after template rendering):
    the sync id checked, per-table key overrides and zero-date policies parsed from the DAG's
    dicts."""
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


def store_url(checkpoint_conn_id: str | None) -> str:
    """The store's SQLAlchemy URL: from an Airflow connection (credentials stay there), else
    the default SQLite file under ``AIRFLOW_HOME``."""
    if not checkpoint_conn_id:
        return default_url()
    from airflow.sdk.bases.hook import BaseHook

    return url_from_connection(BaseHook.get_connection(checkpoint_conn_id))


def s3_settings(aws_conn_id: str | None) -> S3Settings | None:
    """Object-storage settings from the Airflow ``aws`` connection, if one is named."""
    if not aws_conn_id:
        return None
    from airflow.sdk.bases.hook import BaseHook

    conn = BaseHook.get_connection(aws_conn_id)
    return S3Settings.from_connection(
        conn_id=aws_conn_id,
        conn_type=conn.conn_type,
        login=conn.login,
        password=conn.password,
        extra=conn.extra_dejson,
    )


def open_store(checkpoint_conn_id: str | None) -> CheckpointStore:
    store = CheckpointStore(store_url(checkpoint_conn_id))
    store.migrate()
    return store


def holder(context: Mapping[str, Any]) -> str:
    """Who holds a sync's lock while a task runs: shown to a concurrent run that is refused."""
    ti = context.get("ti") or context.get("task_instance")
    if ti is None:
        return f"pid on {socket.gethostname()}"
    return (
        f"dag {ti.dag_id!r} run {ti.run_id!r} task {ti.task_id!r} try {ti.try_number} "
        f"on {socket.gethostname()}"
    )


@contextlib.contextmanager
def log_group(title: str) -> Iterator[None]:
    """A collapsible group in the Airflow task log (the UI folds ``::group::`` blocks)."""
    print(f"::group::{title}", flush=True)
    try:
        yield
    finally:
        print("::endgroup::", flush=True)


def airflow_conf() -> Any:
    """Airflow's configuration as the task side reads it."""
    from airflow.sdk.configuration import conf

    return conf


def _stats() -> Any:
    try:
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow 3.0/3.1
        from airflow.stats import Stats
    return Stats


def emit_metrics(prefix: str, sync_id: str, values: Mapping[str, float], *, timing: bool = False) -> None:
    """Airflow metrics ``vitess.<prefix>.<name>`` tagged with the sync; never fails the task."""
    try:
        stats = _stats()
        for name, value in values.items():
            metric = f"vitess.{prefix}.{name}"
            if timing:
                stats.timing(metric, value, tags={"sync_id": sync_id})
            else:
                stats.gauge(metric, value, tags={"sync_id": sync_id})
    except Exception as exc:  # metrics are an aid, not part of the result
        log.debug("could not emit metrics %s: %s", prefix, exc)
