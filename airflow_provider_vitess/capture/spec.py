"""What one sync mirrors: its keyspace and tables, where it stages, how each table's key is
chosen, and the read's limits. Built by the operators from their arguments and connections;
immutable for a run."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess.capture.columns import ColumnChoice, TableColumns, resolve
from airflow_provider_vitess.exceptions import VitessProviderError
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.keys import KeyChoice, KeyOverrides, choose_key, table_shape
from airflow_provider_vitess.staging.hashing import ColumnHasher
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vstream.spill import MemoryLimits

__all__ = ["SyncSpec", "as_tables", "check_sync_id"]

_SYNC_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_sync_id(sync_id: str) -> str:
    """``sync_id`` if it may name a sync (it names staging directories and Delta transaction
    ids), else :class:`VitessProviderError` saying what it may hold."""
    if not isinstance(sync_id, str) or not _SYNC_ID.match(sync_id):
        raise VitessProviderError(
            f"sync_id {sync_id!r} must be 1-128 letters, digits, '_', '-' or '.', starting "
            "with a letter or digit (it names staging directories and Delta transaction ids)"
        )
    return sync_id


def as_tables(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Tables given as a list, or as text (a comma-separated or JSON list, from a template)."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return tuple(str(t) for t in json.loads(text))
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return tuple(str(t) for t in value)


@dataclass(frozen=True)
class SyncSpec:
    """What one sync mirrors and where it stages."""

    sync_id: str
    keyspace: str
    tables: tuple[str, ...]
    staging_location: str
    # May hold object-store credentials (from an aws connection): kept out of repr and logs.
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    # Explicit staged key per table (skips the key choice); otherwise the key is chosen by the
    # VReplication rules from the table's indexes, with ``key_overrides`` applied.
    key_columns: Mapping[str, Sequence[str]] = field(default_factory=dict)
    key_overrides: Mapping[str, KeyOverrides] = field(default_factory=dict)
    allow_all_columns_key: bool = False
    heartbeat_interval: int = 1
    minimize_skew: bool = False
    # What zero/invalid DATE/DATETIME/TIMESTAMP values are staged as, in both phases.
    zero_dates: ZeroDatePolicies = field(default_factory=ZeroDatePolicies)
    # What a read holds in memory before it spills to disk, and where it spills.
    memory: MemoryLimits = field(default_factory=MemoryLimits)
    # Column control per table (capture/columns.py); tables not in it read every column.
    columns: Mapping[str, TableColumns] = field(default_factory=dict)
    # The salt of hash_columns, from an Airflow connection at run time: never in a repr or log.
    hash_salt: str | None = field(default=None, repr=False)

    def hasher(self) -> ColumnHasher | None:
        """The stager's hashing of ``hash_columns`` (None: no table hashes a column)."""
        hashed = {t: c.hash for t, c in self.columns.items() if c.hash}
        return ColumnHasher(self.hash_salt or "", hashed) if hashed else None

    def column_choices(self, hook: VitessClient, keys: Mapping[str, KeyChoice]) -> dict[str, ColumnChoice]:
        """The column control of each table that has one, checked against the table as the
        source shows it now and against its key (``keys``)."""
        return {
            table: resolve(table_shape(hook, self.keyspace, table), given, keys[table])
            for table, given in self.columns.items()
        }

    def key_choices(self, hook: VitessClient) -> dict[str, KeyChoice]:
        """Each table's key: given in ``key_columns``, else chosen from its indexes as the source
        shows them now (and ``key_overrides``)."""
        choices = {}
        for table in self.tables:
            given = self.key_columns.get(table)
            if given:
                cols = tuple(given)
                choices[table] = KeyChoice(table, cols, cols, None, "given as key_columns", cols)
            else:
                choices[table] = choose_key(
                    table_shape(hook, self.keyspace, table),
                    self.key_overrides.get(table),
                    allow_all_columns_key=self.allow_all_columns_key,
                )
        return choices
