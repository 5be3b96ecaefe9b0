"""A sync's first snapshot checks that its Delta tables hold none of its windows yet.

Delta's transaction ids make each (table, window seq) apply once. A checkpoint store that has
never recorded a window of the sync numbers its first snapshot 1; if the targets already hold
this sync's windows up to N (the store was replaced, e.g. moved from the SQLite default to
PostgreSQL, or restored from an older backup), that snapshot is taken for applied, writes
nothing, and every later window is refused as ahead of the store: a loop no re-snapshot ends.
So the first task refuses, before anything is read or recorded, and names the remedies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_vitess.delta_txns import transaction_versions, txn_app_id
from airflow_provider_vitess.exceptions import STORE_REMEDY, TargetIntegrityError


def refuse_windows_of_another_store(
    sync_id: str, table_paths: Mapping[str, str], storage_options: Mapping[str, Any] | None
) -> None:
    """Raise :class:`TargetIntegrityError` if a table of ``table_paths`` holds a window of
    ``sync_id`` (for a store that has recorded none)."""
    for table, path in sorted(table_paths.items()):
        versions = transaction_versions(path, storage_options) or {}
        held = versions.get(txn_app_id(sync_id, table))
        if held is not None:
            raise TargetIntegrityError(
                f"sync {sync_id!r}: the checkpoint store has never recorded a window of this sync, "
                f"but the Delta table of {table!r} at {path} holds its window {held}: the store "
                "was replaced (a new database) or restored from a backup older than the table. A "
                "snapshot from this store would be taken for already applied, so nothing was read "
                f"or written. {STORE_REMEDY}"
            )
