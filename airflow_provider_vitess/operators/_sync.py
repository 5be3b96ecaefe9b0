"""What the capture operators share: one sync's settings from their (templated) arguments.

Kept apart from the operators so they stay thin: each builds its ``SyncSpec`` with
:func:`sync_spec` and calls the capture runner. The store and object-storage settings from
Airflow connections live in :mod:`airflow_provider_vitess.connections`; log groups, metrics
and the lock holder's name in :mod:`airflow_provider_vitess.utils.task`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.spec import SyncSpec, as_tables, check_sync_id
from airflow_provider_vitess.capture.sync import VitessSync
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


SyncParts = Callable[[VitessSync, str], dict[str, Any]]
_Init = TypeVar("_Init", bound=Callable[..., None])


def accepts_sync(parts: SyncParts) -> Callable[[_Init], _Init]:
    """Let an operator's ``__init__`` take ``sync=`` (a :class:`VitessSync` or its JSON dict)
    instead of its flat arguments: ``parts(sync, sync_id)`` gives those arguments (the ones the
    DAG factory passes, derived by the object in one place). The sync id is ``sync_id=`` if
    given, else the object's. A flat argument the object also sets is refused: which one wins
    would be a guess.

    The advertised signature (what Airflow checks, and ``.partial()`` accepts) gains ``sync``
    and no longer requires what the object gives; without ``sync`` the ``__init__``'s own
    checks still require it."""

    def decorate(init: _Init) -> _Init:
        @functools.wraps(init)
        def wrapper(self: Any, **kwargs: Any) -> None:
            given = kwargs.pop("sync", None)
            if given is not None:
                kwargs = _expand(given, kwargs, parts, type(self).__name__)
            init(self, **kwargs)

        signature = inspect.signature(init)
        params = [
            p.replace(default=None) if p.kind is p.KEYWORD_ONLY and p.default is p.empty else p
            for p in signature.parameters.values()
        ]
        sync = inspect.Parameter("sync", inspect.Parameter.KEYWORD_ONLY, default=None)
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        wrapper.__signature__ = signature.replace(parameters=[*params[:at], sync, *params[at:]])  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # Airflow reads the signature above, not the wrapped one's
        return cast(_Init, wrapper)

    return decorate


def _expand(given: Any, kwargs: dict[str, Any], parts: SyncParts, operator: str) -> dict[str, Any]:
    if isinstance(given, VitessSync):
        sync = given
    elif isinstance(given, Mapping):
        sync = VitessSync.model_validate(dict(given))
    elif isinstance(given, str) and given.lstrip().startswith("{"):
        sync = VitessSync.model_validate_json(given)
    else:
        # Airflow keeps a mapped task's partial arguments as JSON: an object there becomes its
        # text (not JSON), so ``.partial()`` takes the dict.
        raise TypeError(
            f"{operator}: sync must be a VitessSync, its JSON dict or JSON text, got "
            f"{type(given).__name__}; in .partial(...) give sync=sync.model_dump(mode='json')"
        )
    sync_id = kwargs.pop("sync_id", None) or sync.sync_id
    if not sync_id:
        raise TypeError(f"{operator}: the sync has no sync_id; give sync_id= or VitessSync(sync_id=...)")
    derived = parts(sync, sync_id)
    if clash := sorted(set(derived) & set(kwargs)):
        raise TypeError(
            f"{operator}: {clash} given both as arguments and by sync=; set them in the VitessSync"
        )
    return {**kwargs, **derived}


def capture_parts(sync: VitessSync, sync_id: str) -> dict[str, Any]:
    return sync.capture_arguments(sync_id)


def snapshot_parts(sync: VitessSync, sync_id: str) -> dict[str, Any]:
    return {**sync.capture_arguments(sync_id), **sync.snapshot_arguments()}


def catch_up_parts(sync: VitessSync, sync_id: str) -> dict[str, Any]:
    budget = sync.budget
    read = {"max_events": budget.max_events, "max_seconds": budget.max_seconds}
    return {**sync.capture_arguments(sync_id), **read, "minimize_skew": sync.capture.minimize_skew}


def grouped(parts: SyncParts) -> SyncParts:
    """``parts`` with the sync's shard-group split (the plan operators')."""

    def with_split(sync: VitessSync, sync_id: str) -> dict[str, Any]:
        return {**parts(sync, sync_id), "capture_parallelism": sync.capture_parallelism}

    return with_split


def merge_parts(sync: VitessSync, sync_id: str) -> dict[str, Any]:
    return sync.merge_arguments(sync_id)
