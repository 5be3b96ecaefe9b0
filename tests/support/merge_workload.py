"""A seeded workload on our own tables, captured into real staged windows, and the oracle that
compares a Delta table with ``SELECT *`` through vtgate value for value.

Tables (created here, dropped and recreated on each run):

* ``customer.merge_orders`` — sharded by hash(customer_id): inserts, updates, deletes, primary
  key changes, moves between shards (DELETE + INSERT with another customer_id in one transaction,
  as vtgate refuses to update a vindex column) and one 100,000-row transaction;
* ``commerce.merge_types`` — a column for every MySQL type family (the type matrix's columns and
  rows), updated, deleted and re-keyed;
* ``commerce.merge_lines`` — a composite (CHAR, INT) primary key, with key changes.
"""

from __future__ import annotations

import calendar
import datetime
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore, WindowKind
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.modes import TargetShape
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.staging import Manifest, read_table
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.window import capture_stop_position
from tests.support.local import LocalVitess, connection_uri_env
from tests.support.type_matrix import COLUMNS as TYPE_COLUMNS
from tests.support.type_matrix import ROWS as TYPE_ROWS

ORDERS = "merge_orders"
TYPES = "merge_types"
LINES = "merge_lines"
BIG_BASE = 5_000_000
BIG_ROWS = 100_000
Rows = dict[tuple[Any, ...], tuple[Any, ...]]


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def hook_for(vitess: LocalVitess, conn_id: str = "vitess_merge") -> VitessHook:
    name, value = connection_uri_env(conn_id, vitess)
    os.environ[name] = value
    return VitessHook(conn_id)


def execute(hook: VitessHook, *statements: str) -> None:
    """Each statement in its own transaction (DDL commits by itself anyway)."""
    with hook.connect_sql() as conn:
        for sql in statements:
            conn.execute(sqlalchemy.text(sql))
            conn.commit()


def create_sharded_table(hook: VitessHook, table: str, columns: str, vindex_column: str) -> None:
    """``customer.<table>`` dropped and created with ``columns`` (the DDL between the parentheses
    and after them), sharded by ``hash(vindex_column)``. The vschema outlives a dropped table: a
    rerun finds the vindex there already."""
    execute(hook, f"DROP TABLE IF EXISTS customer.{table}", f"CREATE TABLE customer.{table} {columns}")
    try:
        execute(hook, f"ALTER VSCHEMA ON customer.{table} ADD VINDEX hash({vindex_column}) USING hash")
    except sqlalchemy.exc.DBAPIError as exc:
        if "already" not in str(exc):
            raise


def create_tables(hook: VitessHook) -> None:
    type_cols = ",\n".join(f"{q(n)} {t}" for n, t in TYPE_COLUMNS.items())
    execute(
        hook,
        f"DROP TABLE IF EXISTS customer.{ORDERS}",
        f"CREATE TABLE customer.{ORDERS} (order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
        "note VARCHAR(64), qty INT, amount DECIMAL(12,2), updated DATETIME(6), PRIMARY KEY (order_id))",
        f"DROP TABLE IF EXISTS commerce.{TYPES}",
        f"CREATE TABLE commerce.{TYPES} (id INT NOT NULL PRIMARY KEY,\n{type_cols}) DEFAULT CHARSET=utf8mb4",
        f"DROP TABLE IF EXISTS commerce.{LINES}",
        f"CREATE TABLE commerce.{LINES} (region CHAR(2) NOT NULL, line_id INT NOT NULL, qty INT, "
        "label VARCHAR(32), PRIMARY KEY (region, line_id)) DEFAULT CHARSET=utf8mb4",
    )
    try:  # the vschema outlives a dropped table: a rerun finds the vindex there already
        execute(hook, f"ALTER VSCHEMA ON customer.{ORDERS} ADD VINDEX hash(customer_id) USING hash")
    except sqlalchemy.exc.OperationalError as exc:
        if "already defined" not in str(exc):
            raise


def select_all(hook: VitessHook, keyspace: str, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``SELECT *`` through vtgate with the plain pymysql cursor (OLAP: no 10,000-row cap)."""
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET workload = 'olap'")
        cur.execute(f"SELECT * FROM {q(keyspace)}.{q(table)}")
        return [d[0] for d in cur.description], [tuple(r) for r in cur.fetchall()]
    finally:
        raw.close()


# -- the workload ----------------------------------------------------------------------------------


class Workload:
    """Seeded DML, run in rounds between captured windows; it tracks what it has written."""

    def __init__(self, hook: VitessHook, seed: int) -> None:
        self.hook, self.rng = hook, random.Random(seed)
        self.orders: dict[int, int] = {}  # order_id -> customer_id
        self.lines: set[tuple[str, int]] = set()
        self.next_order = 1
        self.moves = 0
        self.key_changes = 0
        self.type_ids = [int(r["id"]) for r in TYPE_ROWS]

    def _order_values(self, oid: int, cid: int) -> dict[str, Any]:
        r = self.rng
        return {
            "o": oid,
            "c": cid,
            "n": r.choice(["", None, "x", "ünï 😀", "a" * 64]),
            "q": r.randint(-(2**31), 2**31 - 1),
            "a": Decimal(r.randint(-(10**12) + 1, 10**12 - 1)) / 100,
            "u": datetime.datetime(2026, 1, 1) + datetime.timedelta(microseconds=r.randint(0, 10**13)),
        }

    def _insert_order(self, conn: sqlalchemy.Connection, oid: int, cid: int) -> None:
        conn.execute(
            sqlalchemy.text(
                f"INSERT INTO customer.{ORDERS} (order_id, customer_id, note, qty, amount, updated) "
                "VALUES (:o, :c, :n, :q, :a, :u)"
            ),
            self._order_values(oid, cid),
        )
        self.orders[oid] = cid

    def initial(self, orders: int = 300, lines: int = 60) -> None:
        with self.hook.connect_sql() as conn, conn.begin():
            for _ in range(orders):
                self._insert_order(conn, self.next_order, self.rng.randint(1, 10_000))
                self.next_order += 1
            for i in range(lines):
                self._insert_line(conn, (self.rng.choice(["eu", "us", "ap"]), i))
        insert_types(self.hook, TYPE_ROWS)

    def _insert_line(self, conn: sqlalchemy.Connection, key: tuple[str, int]) -> None:
        conn.execute(
            sqlalchemy.text(f"INSERT INTO commerce.{LINES} VALUES (:r, :l, :q, :b)"),
            {"r": key[0], "l": key[1], "q": self.rng.randint(0, 9), "b": f"line {key}"},
        )
        self.lines.add(key)

    def round(self, transactions: int = 40) -> None:
        for _ in range(transactions):
            with self.hook.connect_sql() as conn, conn.begin():
                for _ in range(self.rng.randint(1, 4)):
                    self._order_op(conn)
                if self.rng.random() < 0.5:
                    self._line_op(conn)

    def move(self, conn: sqlalchemy.Connection, oid: int, cid: int) -> None:
        """vtgate refuses to update a vindex column: a move is DELETE + INSERT (new values)."""
        conn.execute(sqlalchemy.text(f"DELETE FROM customer.{ORDERS} WHERE order_id = :o"), {"o": oid})
        self._insert_order(conn, oid, cid)
        self.moves += 1

    def _order_op(self, conn: sqlalchemy.Connection) -> None:
        r = self.rng
        p = r.random()
        if p < 0.25 or not self.orders:
            self._insert_order(conn, self.next_order, r.randint(1, 10_000))
            self.next_order += 1
            return
        oid = r.choice(sorted(self.orders))
        if p < 0.4:
            conn.execute(sqlalchemy.text(f"DELETE FROM customer.{ORDERS} WHERE order_id = :o"), {"o": oid})
            del self.orders[oid]
        elif p < 0.55:  # move to another shard (most of the time): same key, other customer_id
            self.move(conn, oid, r.randint(10_001, 20_000))
        elif p < 0.65:  # primary key change
            new = self.next_order
            self.next_order += 1
            conn.execute(
                sqlalchemy.text(
                    f"UPDATE customer.{ORDERS} SET order_id = :n, qty = qty DIV 2 WHERE order_id = :o"
                ),
                {"n": new, "o": oid},
            )
            self.orders[new] = self.orders.pop(oid)
            self.key_changes += 1
        else:
            v = self._order_values(oid, self.orders[oid])
            conn.execute(
                sqlalchemy.text(
                    f"UPDATE customer.{ORDERS} SET note = :n, qty = :q, amount = :a, updated = :u "
                    "WHERE order_id = :o"
                ),
                v,
            )

    def _line_op(self, conn: sqlalchemy.Connection) -> None:
        r = self.rng
        key = r.choice(sorted(self.lines))
        p = r.random()
        if p < 0.3:
            conn.execute(
                sqlalchemy.text(f"DELETE FROM commerce.{LINES} WHERE region = :r AND line_id = :l"),
                {"r": key[0], "l": key[1]},
            )
            self.lines.discard(key)
        elif p < 0.6:
            new = (r.choice(["eu", "us", "ap", "zz"]), key[1] + 1000 * r.randint(1, 9))
            if new not in self.lines:
                conn.execute(
                    sqlalchemy.text(
                        f"UPDATE commerce.{LINES} SET region = :nr, line_id = :nl "
                        "WHERE region = :r AND line_id = :l"
                    ),
                    {"nr": new[0], "nl": new[1], "r": key[0], "l": key[1]},
                )
                self.lines.discard(key)
                self.lines.add(new)
        elif p < 0.8:
            self._insert_line(conn, (r.choice(["eu", "us"]), 100_000 + r.randint(0, 10**6)))
        else:
            conn.execute(
                sqlalchemy.text(
                    f"UPDATE commerce.{LINES} SET qty = qty + 1 WHERE region = :r AND line_id = :l"
                ),
                {"r": key[0], "l": key[1]},
            )

    def big_transaction(self) -> None:
        """100,000 orders in one transaction over both shards (1,000-row statements)."""
        sql = sqlalchemy.text(
            f"INSERT INTO customer.{ORDERS} (order_id, customer_id, note, qty, amount, updated) "
            "VALUES (:o, :c, :n, :q, :a, :u)"
        )  # placeholders only: pymysql then sends each 1,000-row batch as one statement
        fixed = {"n": "big", "a": Decimal("1.25"), "u": datetime.datetime(2026, 2, 3, 4, 5, 6, 7)}
        with self.hook.connect_sql() as conn, conn.begin():
            for chunk in range(BIG_ROWS // 1000):
                rows = [{"o": BIG_BASE + chunk * 1000 + i, "c": i, "q": chunk, **fixed} for i in range(1000)]
                conn.execute(sql, rows)
        self.orders.update({BIG_BASE + i: i % 1000 for i in range(BIG_ROWS)})

    def touch_big(self, n: int = 500) -> None:
        """Update and delete some of the big transaction's rows (a merge into a 100k-row table)."""
        ids = self.rng.sample(range(BIG_BASE, BIG_BASE + BIG_ROWS), 2 * n)
        with self.hook.connect_sql() as conn, conn.begin():
            conn.execute(
                sqlalchemy.text(
                    f"UPDATE customer.{ORDERS} SET note = 'touched' WHERE order_id IN :ids"
                ).bindparams(sqlalchemy.bindparam("ids", expanding=True)),
                {"ids": ids[:n]},
            )
            conn.execute(
                sqlalchemy.text(f"DELETE FROM customer.{ORDERS} WHERE order_id IN :ids").bindparams(
                    sqlalchemy.bindparam("ids", expanding=True)
                ),
                {"ids": ids[n:]},
            )
        for oid in ids[n:]:
            self.orders.pop(oid, None)

    def types_round(self, k: int) -> None:
        """Type-matrix rows rewritten with another row's values, re-keyed, inserted, deleted."""
        r = self.rng
        names = list(TYPE_COLUMNS)
        sets = ", ".join(f"{q(n)} = :{n}" for n in names)
        donor = TYPE_ROWS[k % len(TYPE_ROWS)]
        with self.hook.connect_sql() as conn, conn.begin():
            conn.execute(
                sqlalchemy.text(f"UPDATE commerce.{TYPES} SET {sets} WHERE id = :id"),
                {**{n: donor[n] for n in names}, "id": r.choice(self.type_ids)},
            )
            old, new = r.choice(self.type_ids), 100 + k
            conn.execute(
                sqlalchemy.text(f"UPDATE commerce.{TYPES} SET id = :n WHERE id = :o"), {"n": new, "o": old}
            )
            self.type_ids[self.type_ids.index(old)] = new
        insert_types(self.hook, [{**TYPE_ROWS[(k + 2) % len(TYPE_ROWS)], "id": 200 + k}])
        self.type_ids.append(200 + k)
        if k == 1:
            victim = r.choice(self.type_ids)
            execute(self.hook, f"DELETE FROM commerce.{TYPES} WHERE id = {int(victim)}")
            self.type_ids.remove(victim)


def insert_types(hook: VitessHook, rows: Sequence[dict[str, Any]]) -> None:
    names = ["id", *TYPE_COLUMNS]
    sql = sqlalchemy.text(
        f"INSERT INTO commerce.{TYPES} ({', '.join(q(n) for n in names)}) "
        f"VALUES ({', '.join(f':{n}' for n in names)})"
    )
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sql, [dict(r) for r in rows])


# -- capture ---------------------------------------------------------------------------------------


@dataclass
class Sync:
    """A sync's staged windows, in order (the first a snapshot)."""

    sync_id: str
    keyspace: str
    tables: tuple[str, ...]
    runner: CaptureRunner
    store: CheckpointStore
    manifests: list[Manifest] = field(default_factory=list)

    def capture(self, snapshot: bool = False) -> Manifest:
        outcome = self.runner.snapshot() if snapshot else self.runner.catch_up()
        # The windows are merged by the tests later, several per plan; the capture side only needs
        # the previous window committed to read the next one.
        self.store.mark_merged(self.sync_id, outcome.seq)
        self.store.commit(self.sync_id, outcome.seq)
        self.manifests.append(outcome.manifest)
        return outcome.manifest

    def capture_split(self, act: Callable[[], None], early_shard: str) -> Manifest:
        """Runs ``act`` (moves between shards), then stages a catch-up window whose stop is
        ``early_shard``'s position before ``act`` and the other shards' position after it: each
        move's half on ``early_shard`` falls in the next window."""
        before = capture_stop_position(self.runner._open, self.keyspace)
        act()
        after = capture_stop_position(self.runner._open, self.keyspace)
        stop = Vgtid(
            tuple(
                (before if sg.shard == early_shard else after).shard(sg.keyspace, sg.shard) or sg
                for sg in after.shard_gtids
            )
        )
        committed, _ = self.store.committed(self.sync_id)
        assert committed is not None
        self.store.plan_window(self.sync_id, WindowKind.CATCHUP, committed, stop)
        return self.capture()  # resumes the planned window: reads up to that stop

    def targets(self, root: Path, shape: TargetShape | None = None) -> dict[str, TableTarget]:
        """Every table's target under ``root``; with ``shape``, every table in that shape."""
        keys = self.manifests[0].tables
        return {
            t: TableTarget(
                t, str(root / t), keys[t].key_columns, keys[t].key_columns, shape=shape or TargetShape()
            )
            for t in self.tables
        }

    def plan(
        self, root: Path, first: int = 0, last: int | None = None, shape: TargetShape | None = None
    ) -> MergePlan:
        chosen = self.manifests[first:last]
        windows = tuple(
            WindowToMerge(m.window_seq, m.path, self.tables if m is self.manifests[0] else ()) for m in chosen
        )
        return MergePlan(self.sync_id, windows, self.targets(root, shape))


def new_sync(
    hook: VitessHook, store: CheckpointStore, stage: Path, sync_id: str, keyspace: str, tables: Iterable[str]
) -> Sync:
    spec = SyncSpec(sync_id, keyspace, tuple(tables), str(stage))
    return Sync(
        sync_id, keyspace, tuple(tables), CaptureRunner(hook, store, spec, holder="test-merge"), store
    )


def cross_shard_ties(manifests: Iterable[Manifest], table: str, key: str) -> int:
    """Keys that have events from two shards in one commit second of one window."""
    ties = 0
    for m in manifests:
        if table not in m.tables:
            continue
        seen: dict[tuple[Any, int], set[str]] = {}
        for r in read_table(m, table).to_pylist():
            k = r[key] if r[key] is not None else r[f"_before_{key}"]
            seen.setdefault((k, r["_commit_ts"]), set()).add(r["_shard"])
        ties += sum(1 for shards in seen.values() if len(shards) > 1)
    return ties


# -- the oracle ------------------------------------------------------------------------------------


def canon(value: Any, dtype: T.DataType) -> Any:
    """A source value (pymysql) or a Delta value (PySpark) in one comparable form, per the Delta
    column type (see airflow_provider_vitess.merge.job.schema's mapping)."""
    if value is None:
        return None
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(dtype, T.DecimalType) and isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)  # BIGINT UNSIGNED
    if isinstance(dtype, T.StringType) and isinstance(value, Decimal):
        return format(value, "f")  # DECIMAL(p > 38) as MySQL prints it
    if isinstance(dtype, T.LongType) and isinstance(value, datetime.timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds  # TIME
    if isinstance(dtype, T.TimestampType) and isinstance(value, datetime.datetime):
        return calendar.timegm(value.timetuple()) * 1_000_000 + value.microsecond  # UTC session
    return value


def frame_rows(df: DataFrame, keys: Sequence[str]) -> tuple[Rows, int]:
    """A table's rows by key in the oracle's form, and how many rows share a key with another."""
    cols = [
        F.unix_micros(F.col(q(f.name))).alias(f.name)
        if isinstance(f.dataType, T.TimestampType)
        else F.col(q(f.name))
        for f in df.schema.fields
    ]
    out: Rows = {}
    collected = df.select(*cols).collect()
    for row in collected:
        values = tuple(canon(row[f.name], f.dataType) for f in df.schema.fields)
        out[tuple(row[k] for k in keys)] = values
    return out, len(collected) - len(out)


def delta_rows(spark: SparkSession, path: str, keys: Sequence[str]) -> tuple[T.StructType, Rows]:
    df = spark.read.format("delta").load(path)
    out, duplicates = frame_rows(df, keys)
    assert not duplicates, f"{path}: duplicate keys in Delta"
    return df.schema, out


def source_rows(
    hook: VitessHook, keyspace: str, table: str, schema: T.StructType, keys: Sequence[str]
) -> Rows:
    """``SELECT *`` through vtgate by key, each value in the form of ``schema``'s column type."""
    names, rows = select_all(hook, keyspace, table)
    assert schema.fieldNames() == names, f"{table}: target columns {schema.fieldNames()} != source {names}"
    types = [f.dataType for f in schema.fields]
    want = {}
    for r in rows:
        values = tuple(canon(v, t) for v, t in zip(r, types, strict=True))
        want[tuple(values[names.index(k)] for k in keys)] = values
    return want


def differing_rows(got: Rows, want: Rows) -> int:
    """Keys missing from or extra in the target, plus keys with a differing value (or type)."""

    def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        return all(x == y and type(x) is type(y) for x, y in zip(a, b, strict=True))

    return len(got.keys() ^ want.keys()) + sum(
        1 for k in got.keys() & want.keys() if not same(got[k], want[k])
    )


def assert_equal_to_source(
    spark: SparkSession, hook: VitessHook, keyspace: str, table: str, path: str, keys: Sequence[str]
) -> int:
    """Delta table == SELECT * through vtgate: same columns, same keys, equal values of equal types."""
    schema, got = delta_rows(spark, path, keys)
    want = source_rows(hook, keyspace, table, schema, keys)
    names = schema.fieldNames()
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    assert not missing and not extra, (
        f"{table}: {len(missing)} key(s) missing in Delta {sorted(missing)[:5]}, "
        f"{len(extra)} extra {sorted(extra)[:5]}"
    )
    for key, expected in want.items():
        actual = got[key]
        for name, a, e in zip(names, actual, expected, strict=True):
            assert a == e and type(a) is type(e), (
                f"{table} key {key} column {name!r}: Delta {a!r} != source {e!r}"
            )
    return len(want)
