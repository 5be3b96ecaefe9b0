"""Column control at the source, through the real vtgate, the capture path, Spark and Delta.

Tables of their own (DDL through vtgate): ``customer.colctl_residents`` (sharded by hash(region),
a column that is no key column and is excluded too) with an excluded column (``ssn``) and a
hashed one (``email``), and ``commerce.colctl_items`` with
``include_columns`` and a column added at the source mid-sync. Both go through the copy phase
(snapshot) and the streaming phase (a catch-up window), are merged into Delta, and then:

* the excluded and the not-included columns are in no staged schema, Parquet file or Delta table;
* no clear value of them, nor of the hashed column, is anywhere under the staging and Delta
  directories or in the checkpoint store, byte for byte and in the decoded Parquet values;
* Delta holds exactly ``sha256(salt + value)`` for the hashed column (NULL for NULL) and equals
  the source's ``SELECT <chosen columns>`` otherwise;
* a changed column choice is refused until the table is re-snapshotted with it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy

from airflow_provider_vitess.capture.columns import WINDOW_COLUMNS, TableColumns
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import ColumnChoiceError, ColumnsChangedError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge
from airflow_provider_vitess.staging import read_table
from spark_jobs.merge_cdc import merge
from tests.support import merge_workload as wl
from tests.support.airflow_env import assert_succeeded, make_airflow_env
from tests.support.delta_check import spark_session
from tests.support.local import LocalVitess
from tests.support.readers import assert_readers_see_what_spark_sees, reader_types

pytestmark = pytest.mark.integration

PEOPLE = "colctl_residents"  # customer keyspace, sharded by hash(region): not a key column
ITEMS = "colctl_items"  # commerce keyspace, unsharded
PEOPLE_COLUMNS = ("id", "name", "email", "note")  # ssn (and region, the vindex) excluded
ITEMS_COLUMNS = ("id", "label", "price")  # secret (and the later "extra") not included


def sha(salt: str, value: str | None) -> str | None:
    return None if value is None else hashlib.sha256((salt + value).encode()).hexdigest()


def insert(table: str, row: Mapping[str, Any]) -> str:
    """An INSERT with a column list (vtgate needs one for a table without authoritative columns)."""
    values = ", ".join("NULL" if v is None else repr(v) for v in row.values())
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({values})"


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots for p in sorted(root.rglob("*")) if p.is_file()]


def leaks(clear: Sequence[str], *roots: Path, extra_files: Sequence[Path] = ()) -> list[str]:
    """Every clear value found in a file under ``roots`` (or in ``extra_files``): in its bytes,
    and, for a Parquet file, in its decoded values (compression could hide a value's bytes)."""
    found = []
    needles = [c.encode() for c in clear]
    for path in [*files_under(*roots), *extra_files]:
        data = path.read_bytes()
        found += [f"{path}: {n.decode()}" for n in needles if n in data]
        if path.suffix == ".parquet":
            text = repr(pq.read_table(path).to_pylist())
            found += [f"{path} (decoded): {c}" for c in clear if c in text]
    return found


def select(hook: VitessHook, keyspace: str, table: str, columns: Sequence[str]) -> dict[Any, tuple[Any, ...]]:
    listed = ", ".join(wl.q(c) for c in columns)
    with hook.connect_sql() as conn:
        rows = conn.execute(sqlalchemy.text(f"SELECT {listed} FROM {wl.q(keyspace)}.{wl.q(table)}"))
        return {r[0]: tuple(r) for r in rows}


def delta(path: Path) -> tuple[list[str], dict[Any, tuple[Any, ...]]]:
    df = spark_session().read.format("delta").load(str(path))
    return df.schema.fieldNames(), {r[0]: tuple(r) for r in df.collect()}


class Fixture:
    """The two tables, their clear values, two syncs (one per keyspace) and their windows."""

    def __init__(self, vitess: LocalVitess, root: Path) -> None:
        self.token = uuid.uuid4().hex[:10]
        self.salt = f"salt-{uuid.uuid4().hex}"
        self.root = root
        self.hook = wl.hook_for(vitess, "vitess_column_control")
        self.store = CheckpointStore(f"sqlite:///{root}/store.db")
        self.clear: list[str] = []  # every value that must never reach a file

    def value(self, kind: str, i: int) -> str:
        text = f"{kind}{self.token}x{i:04d}"
        self.clear.append(text)
        return text

    def email(self, i: int) -> str:
        text = f"mail{self.token}x{i:04d}@example.test"
        self.clear.append(text)
        return text

    def runner(self, keyspace: str, table: str, columns: TableColumns, sync_id: str) -> CaptureRunner:
        spec = SyncSpec(
            sync_id,
            keyspace,
            (table,),
            str(self.root / "stage"),
            columns={table: columns},
            hash_salt=self.salt if columns.hash else None,
        )
        return CaptureRunner(self.hook, self.store, spec, holder="test-column-control")


@pytest.fixture(scope="module")
def fx(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    fx = Fixture(vitess, tmp_path_factory.mktemp("colctl"))
    wl.execute(
        fx.hook,
        f"DROP TABLE IF EXISTS customer.{PEOPLE}",
        f"CREATE TABLE customer.{PEOPLE} (id BIGINT NOT NULL PRIMARY KEY, region BIGINT NOT NULL, "
        "name VARCHAR(40), email VARCHAR(80), ssn VARCHAR(40), note VARCHAR(40)) DEFAULT CHARSET=utf8mb4",
        f"DROP TABLE IF EXISTS commerce.{ITEMS}",
        f"CREATE TABLE commerce.{ITEMS} (id INT NOT NULL PRIMARY KEY, label VARCHAR(40), price INT, "
        "secret VARCHAR(40)) DEFAULT CHARSET=utf8mb4",
    )
    try:  # the vschema outlives a dropped table: a rerun finds the vindex there already
        wl.execute(fx.hook, f"ALTER VSCHEMA ON customer.{PEOPLE} ADD VINDEX hash(region) USING hash")
    except sqlalchemy.exc.OperationalError as exc:
        if "already defined" not in str(exc):
            raise
    yield fx
    wl.execute(fx.hook, f"DROP TABLE IF EXISTS customer.{PEOPLE}", f"DROP TABLE IF EXISTS commerce.{ITEMS}")


def test_excluded_and_hashed_columns_never_reach_staging_or_delta_in_the_copy_and_the_stream(
    fx: Fixture,
) -> None:
    # The vindex column is no key column: the filter (a projection) needs it not, so it can go.
    people = TableColumns(exclude=("ssn", "region"), hash=("email",))
    items = TableColumns(include=("id", "label", "price"))
    people_table, items_table = f"customer.{PEOPLE}", f"commerce.{ITEMS}"

    def person(i: int, note: str) -> str:
        row = {"id": i, "region": i * 7919, "name": f"n{i}", "email": fx.email(i), "ssn": fx.value("SSN", i)}
        return insert(people_table, {**row, "note": note})

    inserts = [person(i, f"note{i}") for i in range(1, 21)]
    inserts.append(
        insert(people_table, {"id": 21, "region": 3, "name": "n21", "email": None, "ssn": None, "note": "x"})
    )
    inserts += [
        insert(items_table, {"id": i, "label": f"l{i}", "price": i * 100, "secret": fx.value("SECRET", i)})
        for i in range(1, 11)
    ]
    wl.execute(fx.hook, *inserts)

    people_sync = wl.Sync(
        f"colctl-p-{fx.token}",
        "customer",
        (PEOPLE,),
        fx.runner("customer", PEOPLE, people, f"colctl-p-{fx.token}"),
        fx.store,
    )
    items_sync = wl.Sync(
        f"colctl-i-{fx.token}",
        "commerce",
        (ITEMS,),
        fx.runner("commerce", ITEMS, items, f"colctl-i-{fx.token}"),
        fx.store,
    )
    # The copy phase.
    people_sync.capture(snapshot=True)
    items_sync.capture(snapshot=True)

    # The streaming phase: changes of every column, a column added at the source mid-sync (the
    # include_columns table must not get it), changes of the excluded column alone.
    wl.execute(
        fx.hook,
        *[person(i, "new") for i in range(22, 27)],
        *[
            f"UPDATE {people_table} SET email = '{fx.email(100 + i)}', "
            f"ssn = '{fx.value('SSN', 100 + i)}', name = 'renamed{i}' WHERE id = {i}"
            for i in range(1, 6)
        ],
        *[
            f"UPDATE customer.{PEOPLE} SET ssn = '{fx.value('SSN', 200 + i)}' WHERE id = {i}"
            for i in range(6, 9)
        ],
        f"UPDATE customer.{PEOPLE} SET email = '{fx.email(9)}' WHERE id = 10",  # equal values hash equal
        f"DELETE FROM customer.{PEOPLE} WHERE id IN (11, 12)",
        # Logged before the ALTER, read after it: vttablet projects it onto the listed columns too.
        f"UPDATE commerce.{ITEMS} SET price = price + 1, secret = '{fx.value('SECRET', 104)}' WHERE id = 4",
        f"ALTER TABLE commerce.{ITEMS} ADD COLUMN extra VARCHAR(40)",
        *[
            insert(
                items_table,
                {
                    "id": i,
                    "label": f"l{i}",
                    "price": i,
                    "secret": fx.value("SECRET", i),
                    "extra": fx.value("EXTRA", i),
                },
            )
            for i in range(11, 13)
        ],
        *[
            f"UPDATE commerce.{ITEMS} SET label = 'L{i}', extra = '{fx.value('EXTRA', i)}', "
            f"secret = '{fx.value('SECRET', 100 + i)}' WHERE id = {i}"
            for i in range(1, 4)
        ],
        f"DELETE FROM commerce.{ITEMS} WHERE id = 10",
    )
    people_window = people_sync.capture()
    items_window = items_sync.capture()
    assert people_window.tables[PEOPLE].op_counts == {"delete": 2, "insert": 5, "update": 9}
    assert items_window.tables[ITEMS].op_counts == {"delete": 1, "insert": 2, "update": 4}

    # Staged: only the chosen columns, in both phases; the hashed column as a string.
    for sync, table, chosen in ((people_sync, PEOPLE, PEOPLE_COLUMNS), (items_sync, ITEMS, ITEMS_COLUMNS)):
        for manifest in sync.manifests:
            assert [s.names for s in manifest.tables[table].schemas] == [chosen], manifest.window_seq
            staged = read_table(manifest, table)
            assert [c for c in staged.column_names if not c.startswith("_")] == list(chosen)
            assert manifest.stats[WINDOW_COLUMNS][table]["select"] == list(chosen)
    # Both shards copied and streamed (the vindex column itself excluded).
    for manifest in people_sync.manifests:
        assert set(read_table(manifest, PEOPLE).column("_shard").to_pylist()) == {"-80", "80-"}
    email_schema = people_sync.manifests[0].tables[PEOPLE].schemas[0].columns[2]
    assert (email_schema.type, email_schema.arrow) == ("VARCHAR", "string")

    # Merged into Delta: the chosen columns, equal to the source's SELECT of them, the hashed
    # column exactly sha256(salt + value).
    spark = spark_session()
    target = fx.root / "delta"
    for sync in (people_sync, items_sync):
        merge(spark, sync.plan(target))
    names, got = delta(target / PEOPLE)
    assert names == list(PEOPLE_COLUMNS)
    want = {
        k: (v[0], v[1], sha(fx.salt, v[2]), v[3])
        for k, v in select(fx.hook, "customer", PEOPLE, PEOPLE_COLUMNS).items()
    }
    assert got == want
    assert got[21][2] is None and got[10][2] == got[9][2] == sha(fx.salt, fx.email(9))
    names, got = delta(target / ITEMS)
    assert names == list(ITEMS_COLUMNS)
    assert got == select(fx.hook, "commerce", ITEMS, ITEMS_COLUMNS)
    assert sorted(got) == [*range(1, 10), 11, 12]
    # delta-rs and Polars read them as Spark does: the hashed column as its hex string.
    assert reader_types(target / PEOPLE)["email"] == ("string", "String")
    for table in (PEOPLE, ITEMS):
        assert_readers_see_what_spark_sees(table, target / table, spark)

    # No clear value of an excluded, a not included or a hashed column in any file.
    assert len(fx.clear) > 60
    found = leaks(fx.clear, fx.root / "stage", target, extra_files=[fx.root / "store.db"])
    assert not found, found[:10]


def some_items(fx: Fixture) -> None:
    """A row for a snapshot to copy, whichever tests ran before."""
    table = f"commerce.{ITEMS}"
    wl.execute(
        fx.hook, f"DELETE FROM {table} WHERE id = 1000", insert(table, {"id": 1000, "label": "x", "price": 1})
    )


def test_a_changed_column_choice_is_refused_until_the_table_is_resnapshotted(fx: Fixture) -> None:
    some_items(fx)
    sync_id = f"colctl-change-{fx.token}"
    before = fx.runner("commerce", ITEMS, TableColumns(include=("id", "label")), sync_id)
    outcome = before.snapshot()
    fx.store.mark_merged(sync_id, outcome.seq)
    fx.store.commit(sync_id, outcome.seq)

    changed = fx.runner("commerce", ITEMS, TableColumns(include=("id", "label", "price")), sync_id)
    with pytest.raises(ColumnsChangedError) as refused:
        changed.catch_up()
    message = str(refused.value)
    assert (
        "include_columns ['id', 'label', 'price']" in message and "include_columns ['id', 'label']" in message
    )
    assert f'"resnapshot_tables": ["{ITEMS}"]' in message
    assert fx.store.open_window(sync_id) is None, "a refused run planned a window"

    # The re-snapshot takes the new choice; catch-ups follow it from then on.
    again = changed.snapshot(tables=[ITEMS])
    assert again.manifest.tables[ITEMS].schemas[0].names == ("id", "label", "price")
    fx.store.mark_merged(sync_id, again.seq)
    fx.store.commit(sync_id, again.seq)
    wl.execute(fx.hook, f"UPDATE commerce.{ITEMS} SET price = price + 7 WHERE id = 1000")
    window = changed.catch_up()
    assert [s.names for s in window.manifest.tables[ITEMS].schemas] == [("id", "label", "price")]
    config: Mapping[str, Any] = fx.store.sync_config(sync_id)
    assert config[WINDOW_COLUMNS][ITEMS]["include"] == ["id", "label", "price"]


def test_a_changed_choice_replaces_an_unmerged_snapshot(fx: Fixture) -> None:
    """A snapshot staged (or being read) with one choice and not merged yet is replaced by one
    read with the new choice: its files hold the first choice's columns, so it is discarded
    (FAILED, files deleted) rather than merged or resumed; nothing of it was committed. Before,
    the run was refused until the old snapshot was merged: a staged snapshot whose merge failed
    could then never be left without a hand edit."""
    some_items(fx)
    sync_id = f"colctl-unfinished-{fx.token}"
    first = fx.runner("commerce", ITEMS, TableColumns(include=("id", "label")), sync_id).snapshot()
    assert fx.store.window(sync_id, first.seq).state.value == "STAGED"
    wider = fx.runner("commerce", ITEMS, TableColumns(include=("id", "label", "price")), sync_id)
    again = wider.snapshot()
    assert again.seq == first.seq + 1
    assert again.manifest.tables[ITEMS].schemas[0].names == ("id", "label", "price")
    replaced = fx.store.window(sync_id, first.seq)
    assert replaced.state.value == "FAILED" and "column choice is now include_columns" in str(replaced.error)
    assert not Path(first.manifest.path).exists()
    config: Mapping[str, Any] = fx.store.sync_config(sync_id)
    assert config[WINDOW_COLUMNS][ITEMS]["include"] == ["id", "label", "price"]


def test_a_column_dropped_at_the_source_before_unread_rows_fails_clearly_and_a_full_resnapshot_heals(
    fx: Fixture,
) -> None:
    """vttablet without schema history (this cluster's: --track_schema_versions off) cannot put
    rows logged before a DROP COLUMN onto a column list; the read fails naming the remedy, and a
    re-snapshot of every table of the sync restarts the stream past the DDL."""
    table = "commerce.colctl_drop"
    wl.execute(
        fx.hook,
        f"DROP TABLE IF EXISTS {table}",
        f"CREATE TABLE {table} (id INT NOT NULL PRIMARY KEY, a INT, note VARCHAR(10), ssn VARCHAR(40))",
        insert(table, {"id": 1, "a": 1, "note": "n", "ssn": fx.value("SSN", 901)}),
        insert(table, {"id": 2, "a": 2, "note": "n", "ssn": fx.value("SSN", 902)}),
    )
    sync_id = f"colctl-drop-{fx.token}"
    runner = fx.runner("commerce", "colctl_drop", TableColumns(exclude=("ssn",)), sync_id)
    sync = wl.Sync(sync_id, "commerce", ("colctl_drop",), runner, fx.store)
    sync.capture(snapshot=True)
    wl.execute(
        fx.hook,
        f"UPDATE {table} SET a = 11 WHERE id = 1",  # logged with 4 columns, read after the DROP
        f"ALTER TABLE {table} DROP COLUMN note",
        f"UPDATE {table} SET a = 20 WHERE id = 2",
    )
    with pytest.raises(ColumnChoiceError) as failed:
        sync.capture()
    message = str(failed.value)
    assert "--track_schema_versions" in message and "re-snapshot every table of the sync" in message
    assert "cannot determine table columns" in message
    open_window = fx.store.open_window(sync_id)
    assert open_window is not None and open_window.state.value == "PLANNED"  # rerun reads it again

    sync.capture(snapshot=True)  # every table of the sync: the stream restarts past the DROP
    wl.execute(fx.hook, f"UPDATE {table} SET a = 30 WHERE id = 2")
    window = sync.capture()
    assert [s.names for s in window.tables["colctl_drop"].schemas] == [("id", "a")]
    assert read_table(window, "colctl_drop").column("a").to_pylist() == [30]
    resnapshot = sync.manifests[-2]
    windows = (
        WindowToMerge(resnapshot.window_seq, resnapshot.path, ("colctl_drop",)),
        WindowToMerge(window.window_seq, window.path, ()),
    )
    merge(spark_session(), MergePlan(sync_id, windows, sync.targets(fx.root / "delta-drop")))
    assert delta(fx.root / "delta-drop" / "colctl_drop")[1] == select(
        fx.hook, "commerce", "colctl_drop", ("id", "a")
    )
    wl.execute(fx.hook, f"DROP TABLE IF EXISTS {table}")


# -- through Airflow: the DAG factory, dag.test() ------------------------------------------------

DAG_PEOPLE = "colctl_dag_people"  # customer keyspace, sharded by hash(id)
DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

colctl_dag = vitess_sync_dag(
    "colctl_dag",
    keyspace="customer",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    exclude_columns={{"{table}": ["ssn"]}},
    hash_columns={{"{table}": ["email"]}},
    hash_salt_conn_id="colctl_salt",
    schedule=None,
    sensor_timeout=20,
    default_args={{"retries": 0}},
    spark_conf={{"spark.jars.ivy": os.environ["VITESS_SPARK_IVY"], "spark.sql.shuffle.partitions": "2"}},
    merge_kwargs={{"spark_binary": os.environ.get("VITESS_TEST_SPARK_SUBMIT") or None}},
)
"""


def test_the_dag_factory_keeps_clear_values_out_of_staging_delta_logs_xcom_and_rendered_fields(
    fx: Fixture, vitess: LocalVitess, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    airflow = make_airflow_env(tmp_path / "af", vitess)
    airflow.write_dag("colctl_dag", DAG_FILE.format(lake=lake, table=DAG_PEOPLE))
    airflow.env["AIRFLOW_CONN_COLCTL_SALT"] = json.dumps({"conn_type": "generic", "password": fx.salt})
    table = f"customer.{DAG_PEOPLE}"
    wl.execute(
        fx.hook,
        f"DROP TABLE IF EXISTS {table}",
        f"CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(40), email VARCHAR(80), "
        "ssn VARCHAR(40), note VARCHAR(40)) DEFAULT CHARSET=utf8mb4",
    )
    try:
        wl.execute(fx.hook, f"ALTER VSCHEMA ON {table} ADD VINDEX hash(id) USING hash")
    except sqlalchemy.exc.OperationalError as exc:
        if "already defined" not in str(exc):
            raise
    clear: list[str] = []

    def person(i: int) -> str:
        email, ssn = f"dagmail{fx.token}x{i}@example.test", f"DAGSSN{fx.token}x{i}"
        clear.extend((email, ssn))
        return insert(table, {"id": i, "name": f"n{i}", "email": email, "ssn": ssn, "note": f"note{i}"})

    wl.execute(fx.hook, *[person(i) for i in range(1, 16)])
    first = airflow.run_dag("colctl_dag")  # the copy phase
    assert_succeeded(first, "snapshot", "merge_snapshot")

    ssn = f"DAGSSN{fx.token}xU"
    clear.append(ssn)
    wl.execute(
        fx.hook,
        *[person(i) for i in range(16, 21)],
        f"UPDATE {table} SET ssn = '{ssn}' WHERE id = 1",
        f"UPDATE {table} SET email = NULL, note = 'no mail' WHERE id = 2",
        f"DELETE FROM {table} WHERE id = 3",
    )
    second = airflow.run_dag("colctl_dag")  # the streaming phase
    assert_succeeded(second, "wait_for_changes", "catch_up", "merge")

    names, got = delta(lake / "delta" / DAG_PEOPLE)
    assert names == list(PEOPLE_COLUMNS)
    want = {
        k: (v[0], v[1], sha(fx.salt, v[2]), v[3])
        for k, v in select(fx.hook, "customer", DAG_PEOPLE, PEOPLE_COLUMNS).items()
    }
    assert got == want and len(got) == 19 and got[2][2] is None

    # The XCom values and the rendered fields are in the metadata database (checked to be there),
    # the task logs in the run's output and under the logs folder.
    db = airflow.home / "airflow.db"
    with sqlite3.connect(db) as conn:
        xcoms = conn.execute("SELECT task_id, value FROM xcom WHERE dag_id = 'colctl_dag'").fetchall()
        rendered = conn.execute(
            "SELECT task_id, rendered_fields FROM rendered_task_instance_fields WHERE dag_id = 'colctl_dag'"
        ).fetchall()
    assert {"snapshot", "catch_up"} <= {t for t, _ in xcoms}, xcoms
    assert any("exclude_columns" in str(fields) for t, fields in rendered if t == "catch_up"), rendered
    log = tmp_path / "run.log"
    log.write_text(first["log"] + second["log"])
    found = leaks([*clear, fx.salt], lake, airflow.home, extra_files=[log])
    assert not found, found[:10]
    wl.execute(fx.hook, f"DROP TABLE IF EXISTS {table}")
