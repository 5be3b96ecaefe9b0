"""A small pure-Python applier of staged changes, standing in for the Spark merge in tests.

It applies the documented rules: per key, events in staged order (``seq``); an UPDATE that
changes the key deletes the old key; and the cross-shard tie rule: when one key has events from
several shards in the same commit second (a row moved between shards by an update of its sharding
key arrives as DELETE on one shard and INSERT on the other), the row exists afterwards if any of
those shards' last events for it is an upsert. A key lives on one shard at a time, so at the end of
that second only the shard that holds it can end with an upsert.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.vstream.events import Operation


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


def replay(
    changes: Iterable[StagedChange],
    key_index: Sequence[int],
    initial: dict[tuple[Any, ...], tuple[Any, ...]] | None = None,
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Applies changes of one table to ``initial`` (key -> row) and returns the result."""
    table = dict(initial or {})

    def key_of(image: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(image[i] for i in key_index)

    # Group by key, keeping staged order.
    per_key: dict[tuple[Any, ...], list[tuple[StagedChange, bool]]] = {}
    for change in sorted(changes, key=lambda c: c.seq):
        if change.before is not None:
            per_key.setdefault(key_of(change.before), []).append((change, False))
        if change.after is not None and change.op is not Operation.DELETE:
            per_key.setdefault(key_of(change.after), []).append((change, True))
    for key, events in per_key.items():
        last_ts = max(c.commit_ts for c, _ in events)
        at_last = [(c, upsert) for c, upsert in events if c.commit_ts == last_ts]
        shards = {c.shard for c, _ in at_last}
        if len(shards) > 1:
            last_per_shard: dict[str, tuple[StagedChange, bool]] = {}
            for c, upsert in at_last:
                last_per_shard[c.shard] = (c, upsert)
            upserts = [(c, u) for c, u in last_per_shard.values() if u]
            final = (
                max(upserts, key=lambda p: p[0].seq)
                if upserts
                else max(last_per_shard.values(), key=lambda p: p[0].seq)
            )
        else:
            final = events[-1]
        change, upsert = final
        if upsert:
            assert change.after is not None
            table[key] = change.after
        else:
            table.pop(key, None)
    return table


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
