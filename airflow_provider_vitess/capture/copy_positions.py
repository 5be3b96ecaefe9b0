"""Where each re-snapshotted table was copied, for the catch-ups that read that stretch again (pure).

A re-snapshot of some tables commits without moving the sync's position (the other tables are
only there), so the next catch-ups read the re-copied tables' changes from before their copy
again. Those changes are in the copy already, and may not even be stageable: rows logged before
an incompatible DDL arrive with columns vtgate cannot name. So each re-copied table keeps its copy
position (``copied_at`` in the sync's config, written by the commit) until the committed
position has passed it, and catch-ups skip its changes up to there (``WindowReader``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_provider_vitess.vgtid import Vgtid


def copy_positions(
    recorded: Mapping[str, str] | None, tables: Sequence[str], committed: Vgtid | None
) -> dict[str, Vgtid]:
    """The sync's tables whose recorded copy position (VGTID JSON) the committed position has
    not reached yet; a table past it, or out of the sync, needs no skipping any more."""
    positions: dict[str, Vgtid] = {}
    for table, text in (recorded or {}).items():
        copied = Vgtid.from_json(text)
        if table in tables and not (committed is not None and committed.has_reached(copied)):
            positions[table] = copied
    return positions
