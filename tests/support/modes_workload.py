"""A seeded workload for the target-mode tests that records every state it commits per key.

The same DML runs on each of the tables (one per mode), in the same transactions, so one record
is the oracle of all of them. Tables: ``customer.<name>`` (id BIGINT primary key, vid BIGINT the
hash vindex column, note, qty), so a key lives on the shard of its ``vid`` and a move between
shards is a DELETE and an INSERT with another ``vid`` in one transaction (vtgate refuses to
update a vindex column).

A *step* runs named changes (:data:`EVENTS`: inserts, updates, deletes, moves with either half
first, key changes, a delete and re-insert of one key in two transactions of one second, a key
written and then deleted by two transactions of one second, a large and a long transaction);
a *round* is the step of test_target_modes. A step touches a key at most once, except in those
same-second events; steps are a second and more apart, so two transactions of a key are never
in one commit second otherwise (history keeps one version per key per commit second:
docs/target-modes.md).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.local import LocalVitess, connection_uri_env

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
        self.step(
            ["insert"] * 3
            + ["update"] * 4
            + ["delete"] * 2
            + ["move"] * 2
            + ["key_change", "delete_reinsert"]
            + (["big"] if big else [])
        )

    def step(self, events: Sequence[str]) -> None:
        """``events`` (names of :data:`EVENTS`) in order, each key touched by one of them at
        most (the same-second events touch theirs twice on purpose); then a second passes, so
        the next step's transactions of a key are in a later second."""
        live = sorted(self.record.live())
        self.rng.shuffle(live)
        pick = iter(live)
        for event in events:
            getattr(self, "_ev_" + event)(pick)
        time.sleep(1.2)

    def _picked(self, pick: Iterator[int]) -> tuple[int, tuple[int, str, int]]:
        key = next(pick)
        old = self.record.now(key)
        assert old is not None
        return key, old

    def _ev_insert(self, pick: Iterator[int]) -> None:  # its own transaction
        key, state = self.next_id, self._state(self._vid())
        self.next_id += 1
        self._tx(lambda c: self._insert(c, key, state))
        self.record.commit(key, state, "insert")

    def _ev_update(self, pick: Iterator[int]) -> None:  # the row stays on its shard
        key, old = self._picked(pick)
        state = (
            old[0],
            self.rng.choice(["u", "v", "w"]) + str(self.rng.randint(0, 99)),
            self.rng.randint(-1000, 1000),
        )
        self._tx(lambda c: self._set(c, key, state))
        self.record.commit(key, state, "update")

    def _set(self, conn: sqlalchemy.Connection, key: int, s: tuple[int, str, int]) -> None:
        self._run(conn, "UPDATE {t} SET note = :n, qty = :q WHERE id = :i", {"i": key, "n": s[1], "q": s[2]})

    def _ev_delete(self, pick: Iterator[int]) -> None:
        key, _ = self._picked(pick)
        self._tx(lambda c: self._delete(c, key))
        self.record.commit(key, None, "delete")

    def _moved(self, pick: Iterator[int], insert_first: bool) -> None:
        """A move to another shard: DELETE + INSERT with another ``vid`` in one transaction; with
        ``insert_first`` the INSERT first (the DELETE then names the old ``vid``, so it routes to
        the old shard only)."""
        key, old = self._picked(pick)
        state = (self._vid(other_than=self.shard_of[old[0]]), old[1], old[2] + 1)

        def move(c: sqlalchemy.Connection) -> None:
            if insert_first:
                self._insert(c, key, state)
                self._run(c, "DELETE FROM {t} WHERE id = :i AND vid = :v", {"i": key, "v": old[0]})
            else:
                self._delete(c, key)
                self._insert(c, key, state)

        self._tx(move)
        self.record.commit(key, state, "move")

    def _ev_move(self, pick: Iterator[int]) -> None:
        self._moved(pick, insert_first=False)

    def _ev_move_insert_first(self, pick: Iterator[int]) -> None:
        self._moved(pick, insert_first=True)

    def _ev_key_change(self, pick: Iterator[int]) -> None:
        """The row's id changes (same shard): the old key deleted, the new inserted."""
        key, old = self._picked(pick)
        new_key = self.next_id
        self.next_id += 1
        self._tx(lambda c: self._run(c, "UPDATE {t} SET id = :n WHERE id = :i", {"i": key, "n": new_key}))
        self.record.commit(key, None, "delete")
        self.record.commit(new_key, old, "insert")

    def _ev_delete_reinsert(self, pick: Iterator[int]) -> None:
        """Deleted and inserted again, in two transactions of one second."""
        key, old = self._picked(pick)
        state = (old[0], "again", old[2])
        self._tx(lambda c: self._delete(c, key))
        self._tx(lambda c: self._insert(c, key, state))
        self.record.commit(key, None, "delete")
        self.record.commit(key, state, "insert")

    def _ev_write_then_delete(self, pick: Iterator[int]) -> None:
        """A new key inserted, and a live key updated, each then deleted by another transaction
        of the same second (issue 38 item 0's shape)."""
        new_key, state = self.next_id, self._state(self._vid())
        self.next_id += 1
        key, old = self._picked(pick)
        changed = (old[0], "doomed", old[2])

        def first(c: sqlalchemy.Connection) -> None:
            self._insert(c, new_key, state)
            self._set(c, key, changed)

        def then(c: sqlalchemy.Connection) -> None:
            self._delete(c, new_key)
            self._delete(c, key)

        self._tx(first)
        self._tx(then)
        for k, s in ((new_key, state), (key, changed)):
            self.record.commit(k, s, "insert" if k == new_key else "update")
            self.record.commit(k, None, "delete")

    def _ev_big(self, pick: Iterator[int]) -> None:
        """One transaction updating many keys (60 at most)."""
        keys = list(itertools.islice(pick, 60))

        def many(c: sqlalchemy.Connection) -> None:
            for k in keys:
                self._run(c, "UPDATE {t} SET qty = qty + 1000 WHERE id = :i", {"i": k})

        self._tx(many)
        for k in keys:
            old = self.record.now(k)
            assert old is not None
            self.record.commit(k, (old[0], old[1], old[2] + 1000), "update")

    def _ev_long_transaction(self, pick: Iterator[int]) -> None:
        """A transaction open for two seconds while other transactions commit changes of other
        keys: its changes come after theirs in the binlog (commit order), with an older start."""
        keys = list(itertools.islice(pick, 5))
        others = list(itertools.islice(pick, 3))
        with self.hook.connect_sql() as conn, conn.begin():
            for k in keys:
                self._run(conn, "UPDATE {t} SET note = 'long' WHERE id = :i", {"i": k})
            for k in others:
                self._ev_update(iter([k]))
            time.sleep(2)
        for k in keys:
            old = self.record.now(k)
            assert old is not None
            self.record.commit(k, (old[0], "long", old[2]), "update")

    def add_column(self, name: str) -> None:
        """``ALTER TABLE ... ADD COLUMN name VARCHAR(16)`` (NULL in every row) on each table."""
        with self.hook.connect_sql() as conn:
            for t in self.tables:
                conn.execute(sqlalchemy.text(f"ALTER TABLE customer.{q(t)} ADD COLUMN {q(name)} VARCHAR(16)"))
                conn.commit()

    def modify_column(self, column: str) -> None:
        """Widens ``column`` in place on each table (``MODIFY COLUMN``): ``qty`` INT -> BIGINT,
        then a live key takes a ``qty`` past INT's range; ``note`` VARCHAR(64) -> VARCHAR(128),
        then a live key takes a 100-character ``note``. A second passes before the next step."""
        sql = {"qty": "qty BIGINT", "note": "note VARCHAR(128)"}[column]
        with self.hook.connect_sql() as conn:
            for t in self.tables:
                conn.execute(sqlalchemy.text(f"ALTER TABLE customer.{q(t)} MODIFY COLUMN {sql}"))
                conn.commit()
        key = self.rng.choice(sorted(self.record.live()))
        old = self.record.now(key)
        assert old is not None
        if column == "qty":
            state = (old[0], old[1], 2**40 + self.rng.randint(0, 1000))
        else:
            state = (old[0], "w" * 99 + str(self.rng.randint(0, 9)), old[2])
        self._tx(lambda c: self._set(c, key, state))
        self.record.commit(key, state, "update")
        time.sleep(1.2)


# The events of ``ModesWorkload.step``.
EVENTS = (
    "insert",
    "update",
    "delete",
    "move",
    "move_insert_first",
    "key_change",
    "delete_reinsert",
    "write_then_delete",
    "big",
    "long_transaction",
)


@contextmanager
def modes_hook(vitess: LocalVitess, name: str, tables: Sequence[str]) -> Iterator[VitessHook]:
    """A hook on connection ``name`` to the local vtgate, with ``tables`` created afresh."""
    conn_name, value = connection_uri_env(name, vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(conn_name, value)
        hook = VitessHook(name)
        create_tables(hook, tables)
        yield hook
        hook.close()
