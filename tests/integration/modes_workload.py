"""A seeded workload for the target-mode tests that records every state it commits per key.

The same DML runs on each of the tables (one per mode), in the same transactions, so one record
is the oracle of all of them. Tables: ``customer.<name>`` (id BIGINT primary key, vid BIGINT the
hash vindex column, note, qty), so a key lives on the shard of its ``vid`` and a move between
shards is a DELETE and an INSERT with another ``vid`` in one transaction (vtgate refuses to
update a vindex column).

Each *round* touches a key at most once, except a delete and re-insert of one key in two
transactions of the same second; rounds are a second and more apart, so two transactions of a
key are never in one commit second otherwise (history keeps one version per key per commit
second: docs/target-modes.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook

State = tuple[int, str, int] | None  # (vid, note, qty); None: no row


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def create_tables(hook: VitessHook, tables: Sequence[str]) -> None:
    with hook.connect_sql() as conn:
        for t in tables:
            for sql in (
                f"DROP TABLE IF EXISTS customer.{q(t)}",
                f"CREATE TABLE customer.{q(t)} (id BIGINT NOT NULL PRIMARY KEY, vid BIGINT NOT NULL, "
                "note VARCHAR(64), qty INT)",
            ):
                conn.execute(sqlalchemy.text(sql))
                conn.commit()
            try:  # the vschema outlives a dropped table
                conn.execute(
                    sqlalchemy.text(f"ALTER VSCHEMA ON customer.{q(t)} ADD VINDEX hash(vid) USING hash")
                )
                conn.commit()
            except sqlalchemy.exc.OperationalError as exc:
                if "already defined" not in str(exc):
                    raise


def shards_of(hook: VitessHook, vids: Sequence[int]) -> dict[int, str]:
    """The shard each ``vid`` routes to (vtgate's vindex function table)."""
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text("USE customer"))
        rows = conn.execute(
            sqlalchemy.text(
                f"SELECT id, shard FROM hash WHERE id IN ({', '.join(str(int(v)) for v in vids)})"
            )
        ).fetchall()
        conn.execute(sqlalchemy.text("USE commerce"))
    return {int(r[0]): r[1].decode() if isinstance(r[1], bytes) else str(r[1]) for r in rows}


@dataclass
class Change:
    op: str  # insert, update, delete, move
    after: State


@dataclass
class Record:
    """Per key: its states in commit order (the first: at the snapshot) and its changes since."""

    states: dict[int, list[State]] = field(default_factory=dict)
    changes: dict[int, list[Change]] = field(default_factory=dict)

    def now(self, key: int) -> State:
        return self.states.get(key, [None])[-1]

    def commit(self, key: int, state: State, op: str) -> None:
        self.states.setdefault(key, [None]).append(state)
        self.changes.setdefault(key, []).append(Change(op, state))

    def live(self) -> dict[int, State]:
        return {k: s[-1] for k, s in self.states.items() if s[-1] is not None}


class ModesWorkload:
    def __init__(self, hook: VitessHook, tables: Sequence[str], seed: int) -> None:
        self.hook, self.tables, self.rng = hook, list(tables), random.Random(seed)
        vids = list(range(1, 400))
        shards = shards_of(hook, vids)
        self.by_shard: dict[str, list[int]] = {}
        for v, s in shards.items():
            self.by_shard.setdefault(s, []).append(v)
        self.shard_of = shards
        self.record = Record()
        self.next_id = 1

    def _vid(self, other_than: str | None = None) -> int:
        shards = sorted(s for s in self.by_shard if s != other_than)
        return self.rng.choice(self.by_shard[self.rng.choice(shards)])

    def _state(self, vid: int) -> tuple[int, str, int]:
        return (vid, self.rng.choice(["a", "b", "ünï", "x" * 40]), self.rng.randint(-1000, 1000))

    def _run(self, conn: sqlalchemy.Connection, sql: str, params: dict[str, Any]) -> None:
        for t in self.tables:
            conn.execute(sqlalchemy.text(sql.format(t=f"customer.{q(t)}")), params)

    def _insert(self, conn: sqlalchemy.Connection, key: int, state: tuple[int, str, int]) -> None:
        self._run(
            conn,
            "INSERT INTO {t} (id, vid, note, qty) VALUES (:i, :v, :n, :q)",
            {"i": key, "v": state[0], "n": state[1], "q": state[2]},
        )

    def _delete(self, conn: sqlalchemy.Connection, key: int) -> None:
        self._run(conn, "DELETE FROM {t} WHERE id = :i", {"i": key})

    def initial(self, rows: int) -> None:
        """Rows before the snapshot: each key's first recorded state."""
        with self.hook.connect_sql() as conn, conn.begin():
            for _ in range(rows):
                key, state = self.next_id, self._state(self._vid())
                self.next_id += 1
                self._insert(conn, key, state)
                self.record.states[key] = [state]

    def _tx(self, work: Any) -> None:
        with self.hook.connect_sql() as conn, conn.begin():
            work(conn)

    def round(self, big: bool = False) -> None:
        """One round (module docstring): inserts, updates, deletes, a move between shards, a key
        change, a delete and re-insert in one second, and with ``big`` one large transaction."""
        rec, rng = self.record, self.rng
        live = sorted(rec.live())
        rng.shuffle(live)
        pick = iter(live)
        for _ in range(3):  # inserts, each its own transaction
            key, state = self.next_id, self._state(self._vid())
            self.next_id += 1
            self._tx(lambda c, k=key, s=state: self._insert(c, k, s))
            rec.commit(key, state, "insert")
        for _ in range(4):  # updates (the row stays on its shard)
            key = next(pick)
            old = rec.now(key)
            assert old is not None
            state = (old[0], rng.choice(["u", "v", "w"]) + str(rng.randint(0, 99)), rng.randint(-1000, 1000))
            self._tx(
                lambda c, k=key, s=state: self._run(
                    c, "UPDATE {t} SET note = :n, qty = :q WHERE id = :i", {"i": k, "n": s[1], "q": s[2]}
                )
            )
            rec.commit(key, state, "update")
        for _ in range(2):  # deletes
            key = next(pick)
            self._tx(lambda c, k=key: self._delete(c, k))
            rec.commit(key, None, "delete")
        for _ in range(2):  # moves to the other shard: DELETE + INSERT in one transaction
            key = next(pick)
            old = rec.now(key)
            assert old is not None
            state = (self._vid(other_than=self.shard_of[old[0]]), old[1], old[2] + 1)

            def move(c: sqlalchemy.Connection, k: int = key, s: tuple[int, str, int] = state) -> None:
                self._delete(c, k)
                self._insert(c, k, s)

            self._tx(move)
            rec.commit(key, state, "move")
        # A key change: the row's id changes (same shard): the old key deleted, the new inserted.
        key = next(pick)
        old = rec.now(key)
        new_key = self.next_id
        self.next_id += 1
        self._tx(
            lambda c, k=key, n=new_key: self._run(c, "UPDATE {t} SET id = :n WHERE id = :i", {"i": k, "n": n})
        )
        rec.commit(key, None, "delete")
        rec.commit(new_key, old, "insert")
        # Deleted and inserted again, in two transactions of one second.
        key = next(pick)
        old = rec.now(key)
        assert old is not None
        state = (old[0], "again", old[2])
        self._tx(lambda c, k=key: self._delete(c, k))
        self._tx(lambda c, k=key, s=state: self._insert(c, k, s))
        rec.commit(key, None, "delete")
        rec.commit(key, state, "insert")
        if big:  # one transaction updating many keys
            keys = [k for k in pick][:60]

            def many(c: sqlalchemy.Connection) -> None:
                for k in keys:
                    self._run(c, "UPDATE {t} SET qty = qty + 1000 WHERE id = :i", {"i": k})

            self._tx(many)
            for k in keys:
                old = rec.now(k)
                assert old is not None
                rec.commit(k, (old[0], old[1], old[2] + 1000), "update")
        time.sleep(1.2)  # the next round's transactions of a key are in a later second
