"""A small pure-Python applier of staged changes, standing in for the Spark merge in tests.

It applies the documented rule with complete knowledge: for every key it remembers, per shard,
whether that shard holds the row after the shard's last event for it (events of one shard are in
binlog order, ``seq`` within a window, windows in order). An UPDATE that changes the key is a
delete at the old key and an upsert at the new one. A key lives on one shard at a time, so the
row exists if any shard holds it; when two do (a window's stop can fall between the DELETE and
the INSERT of a row moved between shards), the latest upsert gives the row. The Spark job reaches
the same result from a window plus a few seconds of earlier windows (``merge/job/lookback.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.decoding.events import Operation
from airflow_provider_vitess.keyrange import successors

Key = tuple[Any, ...]
Row = tuple[Any, ...]


@dataclass(frozen=True)
class StagedChange:
    keyspace: str
    table: str
    shard: str
    op: Operation
    commit_ts: int
    seq: int
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None


class Replay:
    """One table's state after the windows applied so far (in window order)."""

    def __init__(self, key_index: Sequence[int]) -> None:
        self._key_index = tuple(key_index)
        self._windows = 0
        # key -> shard -> (order of the shard's last event, the row it holds or None)
        self._holders: dict[Key, dict[str, tuple[tuple[int, int], Row | None]]] = {}

    def _key(self, image: Row) -> Key:
        return tuple(image[i] for i in self._key_index)

    def apply(self, changes: Iterable[StagedChange], live_shards: Sequence[str] | None = None) -> Replay:
        """Applies one window's changes (any order given; staged order is ``seq``).

        ``live_shards`` (the window's end position): a shard not among them was retired by a
        reshard, and an event of a shard that took its keys supersedes what it held.
        """
        self._windows += 1
        changes = sorted(changes, key=lambda c: c.seq)
        retired: dict[str, tuple[str, ...]] = {}
        if live_shards is not None:
            seen = {s for holders in self._holders.values() for s in holders} | {c.shard for c in changes}
            retired = dict(successors(sorted(seen), live_shards))
        for change in changes:
            order = (self._windows, change.seq)
            for image in (change.before, change.after):
                if image is not None:
                    holders = self._holders.get(self._key(image), {})
                    for gone in [s for s in holders if change.shard in retired.get(s, ())]:
                        del holders[gone]
            if change.before is not None:
                old = self._key(change.before)
                if change.op is Operation.DELETE or change.after is None or self._key(change.after) != old:
                    self._holders.setdefault(old, {})[change.shard] = (order, None)
            if change.after is not None and change.op is not Operation.DELETE:
                self._holders.setdefault(self._key(change.after), {})[change.shard] = (order, change.after)
        return self

    def rows(self) -> dict[Key, Row]:
        out = {}
        for key, shards in self._holders.items():
            held = [(order, row) for order, row in shards.values() if row is not None]
            if held:
                out[key] = max(held, key=lambda p: p[0])[1]
        return out


def replay(changes: Iterable[StagedChange], key_index: Sequence[int]) -> dict[Key, Row]:
    """The table made of one batch of changes (a snapshot, or windows read from the start)."""
    return Replay(key_index).apply(changes).rows()


class ListStager:
    """Collects what a read stages, in memory (for tests that check the read itself)."""

    def __init__(self) -> None:
        self.changes: list[StagedChange] = []
        self.schemas: dict[tuple[str, str], list[str]] = {}
        self.ddls: list[str] = []

    def set_schema(self, keyspace: str, table: str, fields: Sequence[Any], shard: str = "") -> None:
        self.schemas[(keyspace, table)] = [f.name for f in fields]

    def add_change(
        self,
        keyspace: str,
        table: str,
        shard: str,
        op: Any,
        commit_ts: int,
        seq: int,
        before: tuple[Any, ...] | None,
        after: tuple[Any, ...] | None,
    ) -> None:
        self.changes.append(StagedChange(keyspace, table, shard, op, commit_ts, seq, before, after))

    def add_rows(
        self,
        keyspace: str,
        table: str,
        shard: str,
        commit_ts: int,
        first_seq: int,
        changes: Sequence[Any],
    ) -> None:
        for seq, c in enumerate(changes, first_seq):
            self.add_change(keyspace, table, shard, c.operation, commit_ts, seq, c.before, c.after)

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None:
        self.ddls.append(statement)
