"""The keyword form of ``vitess_sync_dag`` (deprecated, kept): its arguments as a
:class:`~airflow_provider_vitess.capture.sync.VitessSync`.

The keyword form spreads a table's settings over parallel mappings (``hash_columns={"t": [...]}``,
``targets={"t": {...}}``, ...) and reaches Spark Connect through ``merge_kwargs``. This module
folds them into one ``TableSpec`` per table and a named merge backend, so the factory has one
form to build from. A mapping naming a table not in ``tables`` is refused, naming the option
(a ``targets`` entry excepted: a table that left the sync may still have windows to merge, so it
becomes a ``former_tables`` entry, as the merge operator has always read it).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.spec import as_tables
from airflow_provider_vitess.capture.sync import SparkConnect, SparkSubmit, VitessSync
from airflow_provider_vitess.exceptions import SyncSettingsError
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies

__all__ = ["KEYWORDS", "sync_from_keywords"]

# The keyword form's per-table mappings are named as the TableSpec fields they go to, but one.
_FIELD = {"zero_date_policies": "zero_date_policy"}


def sync_from_keywords(
    *,
    keyspace: str,
    tables: str | Sequence[str],
    staging_location: str,
    target_location: str,
    sync_id: str | None = None,
    vitess_conn_id: str = "vitess_default",
    spark_conn_id: str = "spark_default",
    checkpoint_conn_id: str | None = None,
    aws_conn_id: str | None = None,
    key_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    key_columns: Mapping[str, Sequence[str]] | None = None,
    zero_date_policy: str = "null",
    zero_date_policies: Mapping[str, str] | None = None,
    include_columns: Mapping[str, Sequence[str]] | None = None,
    exclude_columns: Mapping[str, Sequence[str]] | None = None,
    hash_columns: Mapping[str, Sequence[str]] | None = None,
    hash_salt_conn_id: str | None = None,
    max_events: int | None = None,
    max_seconds: float | None = None,
    wait_for_changes: bool = True,
    sensor_timeout: float | None = None,
    sensor_deferrable: bool = True,
    on_changes: bool = False,
    follow_seconds: float | None = None,
    lag_threshold: int | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    merge_kwargs: Mapping[str, Any] | None = None,
    freshness_sla: float | None = None,
    target_mode: str = "mirror",
    metadata_columns: bool | None = None,
    metadata_prefix: str = "_vitess_",
    change_data_feed: bool = False,
    table_features: Sequence[str] = (),
    table_format: str = "delta",
    iceberg_catalog_conn_id: str | None = None,
    targets: Mapping[str, Mapping[str, Any]] | None = None,
    capture_parallelism: int | Sequence[str] = 1,
) -> VitessSync:
    """The keyword form's arguments (``vitess_sync_dag``'s before ``sync=``) as one object."""
    names = list(as_tables(tables))
    specs: dict[str, dict[str, Any]] = {t: {"name": t} for t in names}
    given = {
        "key_overrides": key_overrides,
        "key_columns": key_columns,
        "zero_date_policies": zero_date_policies,
        "include_columns": include_columns,
        "exclude_columns": exclude_columns,
        "hash_columns": hash_columns,
    }
    # A mapping naming another table: refused by the rules that refuse it in the operators,
    # with their words; the keys' mappings had none (their entry was never read).
    ZeroDatePolicies.parse(zero_date_policy, zero_date_policies, names)
    parse_columns(names, include_columns, exclude_columns, hash_columns)
    for option, per_table in given.items():
        for table, value in dict(per_table or {}).items():
            if table not in specs:
                raise SyncSettingsError(
                    f"{option} names {[table]}, not among the sync's tables {sorted(names)}: "
                    "fix the name, or add the table to tables"
                )
            specs[table][_FIELD.get(option, option)] = value
    former: list[dict[str, Any]] = []
    for table, entry in dict(targets or {}).items():
        if not isinstance(entry, Mapping):
            raise SyncSettingsError(f"targets[{table!r}] must be a mapping of target settings, got {entry!r}")
        if table in specs:
            specs[table].update(entry)
        else:
            former.append({"name": table, **entry})
    return VitessSync.model_validate(
        {
            "keyspace": keyspace,
            "tables": list(specs.values()),
            "former_tables": former,
            "staging_location": staging_location,
            "target_location": target_location,
            "sync_id": sync_id,
            "vitess_conn_id": vitess_conn_id,
            "checkpoint_conn_id": checkpoint_conn_id,
            "aws_conn_id": aws_conn_id,
            "hash_salt_conn_id": hash_salt_conn_id,
            "budget": {"max_events": max_events, "max_seconds": max_seconds},
            "wait": {
                "wait_for_changes": wait_for_changes,
                "sensor_timeout": sensor_timeout,
                "deferrable": sensor_deferrable,
                "on_changes": on_changes,
                "follow_seconds": follow_seconds,
                "lag_threshold": lag_threshold,
            },
            "target": {
                "mode": target_mode,
                "metadata_columns": metadata_columns,
                "metadata_prefix": metadata_prefix,
                "change_data_feed": change_data_feed,
                "table_features": table_features,
                "table_format": table_format,
                "iceberg_catalog_conn_id": iceberg_catalog_conn_id,
            },
            "capture": {"zero_date_policy": zero_date_policy},
            "freshness_sla": freshness_sla,
            "capture_parallelism": capture_parallelism,
            **_merge(spark_conn_id, spark_conf, merge_kwargs),
        }
    )


def _merge(
    spark_conn_id: str, spark_conf: Mapping[str, Any] | None, merge_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The merge backend from ``spark_conn_id``, ``spark_conf`` and the catch-all ``merge_kwargs``
    (which won over the factory's own arguments: ``conf`` and ``conn_id`` in it replace those)."""
    extra = dict(merge_kwargs or {})
    conf = dict(extra.pop("conf", None) or spark_conf or {})
    out: dict[str, Any] = {}
    if "spark_history_url" in extra:
        out["spark_history_url"] = extra.pop("spark_history_url")
    if "freshness_sla" in extra:
        out["freshness_sla"] = extra.pop("freshness_sla")
    connect = extra.pop("spark_connect_conn_id", None)
    if connect:
        if extra:
            raise SyncSettingsError(
                f"merge_kwargs {sorted(extra)} with spark_connect_conn_id: a Spark Connect merge "
                "takes only session settings (spark_conf); drop them, or drop spark_connect_conn_id "
                "to merge with spark-submit"
            )
        out["merge"] = SparkConnect(conn_id=connect, conf=conf)
        return out
    fields = {k: extra.pop(k) for k in list(extra) if k in SparkSubmit.model_fields and k != "backend"}
    fields.setdefault("conn_id", spark_conn_id)
    out["merge"] = SparkSubmit(**{**fields, "conf": conf, "arguments": extra})
    return out


# The keyword form's names: what ``vitess_sync_dag`` takes from its keywords for the object.
KEYWORDS = frozenset(inspect.signature(sync_from_keywords).parameters)
