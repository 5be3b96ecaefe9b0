"""An in-memory ``history`` table for the job tier: a window's :func:`.history.versions` rows
applied as ``history.merge_statement``'s MERGE applies them (close rows end the key's current
version, or the version an earlier window ended at a move's delete; insert rows add versions)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from airflow_provider_vitess.merge.job import history
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape

SHAPE = TargetShape(TargetMode.HISTORY)
Version = dict[str, Any]


class HistoryTable:
    """Per key (column ``id``), its versions: v, valid_from, valid_to, current, deleted."""

    def __init__(self, copied: dict[int, str] | None = None) -> None:
        """``copied``: keys a snapshot copied (value ``v``), each one current version."""
        self.versions: dict[int, list[Version]] = {
            k: [{"v": v, "valid_from": None, "valid_to": None, "current": True, "deleted": False}]
            for k, v in (copied or {}).items()
        }

    def apply(self, rows: Iterable[Any]) -> None:
        """One window's MERGE: its closes match the versions from before the window only."""
        n = SHAPE.name
        rows = list(rows)
        for r in rows:
            if r[history.ACTION] == history.CLOSE:
                healed_at = r[history.HEAL_TS]
                healed_to = None
                if healed_at is not None:
                    healed_to = datetime.fromtimestamp(healed_at, timezone.utc).replace(tzinfo=None)
                for v in self.versions.get(r["id"], []):
                    healed = v["deleted"] and healed_to is not None and v["valid_to"] == healed_to
                    if v["current"] or healed:
                        v.update(valid_to=r[n("valid_to")], current=False, deleted=r[n("deleted")])
        for r in rows:
            if r[history.ACTION] == history.INSERT:
                self.versions.setdefault(r["id"], []).append(
                    {
                        "v": r["v"],
                        "valid_from": r[n("valid_from")],
                        "valid_to": r[n("valid_to")],
                        "current": r[n("current")],
                        "deleted": r[n("deleted")],
                    }
                )

    def current(self) -> dict[int, list[str]]:
        """Per key, the values of its current versions (one at most, when the merge is right)."""
        return {k: [v["v"] for v in vs if v["current"]] for k, vs in self.versions.items()}

    def lives(self) -> dict[int, list[tuple[Any, ...]]]:
        """Per key, (v, current, deleted) of its versions in the order they start."""
        return {
            k: [(v["v"], v["current"], v["deleted"]) for v in sorted(vs, key=_start)]
            for k, vs in self.versions.items()
        }


def _start(v: Version) -> tuple[Any, ...]:
    return (v["valid_from"] is not None, v["valid_from"] or datetime.min, v["current"])
