"""The seeded workload of the shard-group tests (``test_shard_groups``, ``test_groups_four_shards``):
moves between shards (one transaction, either half first; split by a window stop, both orders),
same-second deletes and re-inserts, key changes, updates and deletes, of a table keyed by
``order_id`` whose hash vindex column is ``customer_id`` (a move keeps its key)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook


def execute(hook: VitessHook, *statements: str) -> None:
    with hook.connect_sql() as conn:
        for sql in statements:
            conn.execute(sqlalchemy.text(sql))
        conn.commit()


def create_orders(hook: VitessHook, table: str, customers: Sequence[int]) -> None:
    """``table`` (keyspace-qualified) afresh: one order per customer, the key (order_id) leaving
    out the vindex column (customer_id), so a move between shards keeps its key."""
    execute(hook, f"DROP TABLE IF EXISTS {table}")
    execute(
        hook,
        f"CREATE TABLE {table} (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
        "note VARCHAR(64), PRIMARY KEY (order_id))",
    )
    try:  # the vschema outlives a dropped table
        execute(hook, f"ALTER VSCHEMA ON {table} ADD VINDEX hash(customer_id) USING hash")
    except sqlalchemy.exc.DBAPIError as exc:
        if "already" not in str(exc):
            raise
    values = ", ".join(f"({c}, {c}, 'initial {c}')" for c in customers)
    execute(hook, f"INSERT INTO {table} (order_id, customer_id, note) VALUES {values}")


def shards_of_customers(hook: VitessHook, table: str) -> dict[int, str]:
    """Each customer's shard in ``table`` (keyspace-qualified, of the 2-shard ``customer``), asked
    of each shard (``USE customer:<shard>``) through vtgate."""
    found: dict[int, str] = {}
    for shard in ("-80", "80-"):
        with hook.connect_sql() as conn:
            conn.execute(sqlalchemy.text(f"USE `customer:{shard}`"))
            rows = conn.execute(sqlalchemy.text(f"SELECT DISTINCT customer_id FROM {table}")).all()
            conn.execute(sqlalchemy.text("USE customer"))  # pooled: leave no shard target behind
        found.update({int(c): shard for (c,) in rows})
    return found


def insert_filler(
    hook: VitessHook, table: str, customers: Sequence[int], start: int, rows: int, note: str
) -> None:
    """``rows`` filler orders (ids from ``start``) spread over ``customers`` (every shard) inserted,
    then updated: hundreds of row events for each group to read."""
    values = ", ".join(f"({start + i}, {customers[i % len(customers)]}, '{note}')" for i in range(rows))
    execute(hook, f"INSERT INTO {table} (order_id, customer_id, note) VALUES {values}")
    execute(
        hook,
        f"UPDATE {table} SET note = '{note} updated' WHERE order_id >= {start} AND order_id < {start + rows}",
    )


class Workload:
    """Seeded changes; it knows each order's customer and each customer's shard."""

    def __init__(
        self,
        hook: VitessHook,
        seed: int,
        shard_of: dict[int, str],
        table: str,
        customers: Sequence[int],
    ) -> None:
        """``table``: ``keyspace.table`` (order_id key, customer_id the hash vindex column, note);
        its rows at the start: one order per customer, order_id = customer_id."""
        self.hook, self.rng, self.shard_of = hook, random.Random(seed), shard_of
        self.table, self.customers = table, list(customers)
        self.orders = {c: c for c in self.customers}  # order_id -> customer_id
        self.next_id = 1000
        self.touched: set[int] = set()
        self.later: list[str] = []  # second halves of moves split by a window stop
        # Keys of DELETE-first split moves: in no shard until ``later`` INSERTs them again.
        self.away: set[int] = set()

    def _other_shard_customer(self, order_id: int) -> int:
        here = self.shard_of[self.orders[order_id]]
        return self.rng.choice([c for c in self.customers if self.shard_of[c] != here])

    def _insert(self, order_id: int, customer: int, note: str) -> str:
        columns = "(order_id, customer_id, note)"
        return f"INSERT INTO {self.table} {columns} VALUES ({order_id}, {customer}, '{note}')"

    def _delete(self, order_id: int) -> str:
        # Aimed at its customer: the key alone would be routed to every shard.
        where = f"order_id = {order_id} AND customer_id = {self.orders[order_id]}"
        return f"DELETE FROM {self.table} WHERE {where}"

    def round(self, ops: int, tag: str) -> None:
        """The INSERTs of the last split moves, then ``ops`` seeded changes."""
        for pending in self.later:
            execute(self.hook, pending)
        self.later = []
        self.away = set()
        self.touched = set()
        for i in range(ops):
            note = f"{tag}-{i}"
            choice = self.rng.random()
            key = self.rng.choice(sorted(self.orders))
            if choice < 0.2 or len(self.orders) < 6:
                customer = self.rng.choice(self.customers)
                execute(self.hook, self._insert(self.next_id, customer, note))
                self.orders[self.next_id] = customer
                self.touched.add(self.next_id)
                self.next_id += 1
                continue
            self.touched.add(key)
            if choice < 0.4:
                execute(self.hook, f"UPDATE {self.table} SET note = '{note}' WHERE order_id = {key} "
                         f"AND customer_id = {self.orders[key]}")  # fmt: skip
            elif choice < 0.6:  # a move in one transaction, either half first
                to = self._other_shard_customer(key)
                halves = [self._delete(key), self._insert(key, to, note)]
                if self.rng.random() < 0.5:
                    halves.reverse()
                execute(self.hook, *halves)
                self.orders[key] = to
            elif choice < 0.75:  # deleted and inserted again in the same second, here or there
                to = self.orders[key] if self.rng.random() < 0.5 else self._other_shard_customer(key)
                execute(self.hook, self._delete(key))
                execute(self.hook, self._insert(key, to, note))
                self.orders[key] = to
            elif choice < 0.87:  # the key changes
                new = self.next_id
                self.next_id += 1
                execute(self.hook, f"UPDATE {self.table} SET order_id = {new}, note = '{note}' "
                         f"WHERE order_id = {key} AND customer_id = {self.orders[key]}")  # fmt: skip
                self.orders[new] = self.orders.pop(key)
                self.touched.add(new)
            else:
                execute(self.hook, self._delete(key))
                del self.orders[key]

    def split_moves(self, tag: str) -> Callable[[], None]:
        """Moves whose halves fall on both sides of the next window's stop, both directions, of
        keys this round left alone: DELETE-first ones now (their INSERT at the next round: the row
        is gone meanwhile, in the source as in Delta), INSERT-first ones now with the DELETE
        returned, to run right after the stop is taken (the source is whole again when Delta is
        compared)."""
        quiet = [k for k in sorted(self.orders) if k not in self.touched]
        by_shard: dict[str, list[int]] = {}
        for k in quiet:
            by_shard.setdefault(self.shard_of[self.orders[k]], []).append(k)
        deletes_after: list[str] = []
        for shard, keys in sorted(by_shard.items()):
            picked = self.rng.sample(keys, min(2, len(keys)))
            for n, key in enumerate(picked):
                to = self._other_shard_customer(key)
                if n == 0:  # DELETE first; the INSERT waits for the next round
                    execute(self.hook, self._delete(key))
                    self.later.append(self._insert(key, to, f"{tag}-late-{shard}"))
                    self.away.add(key)
                else:  # INSERT first; the DELETE right after the stop
                    deletes_after.append(self._delete(key))
                    execute(self.hook, self._insert(key, to, f"{tag}-early-{shard}"))
                self.orders[key] = to
        return lambda: execute(self.hook, *deletes_after) if deletes_after else None

    def movable(self) -> list[int]:
        """The keys a move can take now: every order but those of DELETE-first split moves,
        which are in no shard until the next round INSERTs them."""
        return sorted(k for k in self.orders if k not in self.away)

    def move_apart(self, key: int, insert_first: bool, gap: float) -> None:
        """``key`` moved to another shard as two transactions ``gap`` seconds apart (as vtgate's
        two shard commits are, slowly): a window stop can fall between them. Only a key of
        :meth:`movable`: moving a key that is away (its row deleted, its INSERT pending) would
        INSERT it on a shard other than the pending one and DELETE nothing; the pending INSERT
        would then make the source itself hold the key on two shards, a true duplicate the
        merge rightly refuses (KeyConflictError)."""
        if key in self.away:
            raise ValueError(f"order {key} is away (a split move's INSERT is pending): not movable")
        to = self._other_shard_customer(key)
        halves = [self._delete(key), self._insert(key, to, f"apart-{key}-{to}")]
        if insert_first:
            halves.reverse()
        execute(self.hook, halves[0])
        time.sleep(gap)
        execute(self.hook, halves[1])
        self.orders[key] = to
