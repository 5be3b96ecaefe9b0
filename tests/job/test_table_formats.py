"""The table-format contract (``merge/job/formats``): the same assertions over every implementation.

Each test takes ``each``, one :class:`TableFormat` on its own kind of session: Delta on a classic
local session, Delta over Spark Connect (a server started by the ``spark_connect`` fixture,
``dev/spark_connect.sh``), and Apache Iceberg on the classic session where the installed Spark
line has an Iceberg runtime (``versions.SparkLine.iceberg``: Spark 4.1, ``make test-iceberg``;
skipped with the reason elsewhere). What the merge relies on: a
replace creates the table, every write is one commit marked with (app id, window seq) and a
window the table holds is not written again (``applied``, and the write answers None), an append,
a schema change, and a read at an earlier version (the consistent cut). Small tables, no Vitess.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from sqlalchemy.engine import make_url

from airflow_provider_vitess.exceptions import TargetIntegrityError
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.merge.job import (
    connect,
    connect_tables,
    formats,
    iceberg_log,
    iceberg_sql,
    merge_sql,
    tables,
)
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.formats import Statement, TableFormat
from airflow_provider_vitess.merge.job.formats.delta import DeltaFormat
from airflow_provider_vitess.merge.job.formats.iceberg import IcebergFormat, metadata_log
from airflow_provider_vitess.merge.job.merge_sql import Then, When
from airflow_provider_vitess.merge.job.schema import Evolution
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.spark_conf import installed_spark_line
from airflow_provider_vitess.versions import UnsupportedSparkVersionError, iceberg_runtime
from tests.support.databases import start_postgres
from tests.support.delta_check import spark_session

APP = "sync-contract"
FIRST = [(1, "a"), (2, "b"), (3, "c")]


@dataclass(frozen=True)
class Each:
    kind: str
    spark: SparkSession
    fmt: TableFormat


@pytest.fixture(
    scope="module",
    params=["delta classic", "delta connect", "iceberg classic", "iceberg jdbc", "iceberg connect"],
)
def each(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Each]:
    """A format on its session (module scope: pytest runs one parameter's tests, then the next;
    a Connect block holds the process's Connect mark, so the classic ones run outside it).
    ``iceberg jdbc``: Iceberg's tables in a JDBC catalog on a throwaway PostgreSQL; ``iceberg
    connect``: on a Spark Connect server with Iceberg."""
    if request.param.startswith("iceberg"):
        try:
            iceberg_runtime(installed_spark_line())
        except UnsupportedSparkVersionError as exc:
            pytest.skip(f"no Iceberg here: {exc}")
        if request.param == "iceberg connect":
            with connect.remote_sessions(request.getfixturevalue("spark_connect_iceberg")) as new_session:
                spark = new_session()
                assert spark.version == pyspark.__version__, "the server runs this process's Spark line"
                yield Each(request.param, spark, formats.for_session(spark, "iceberg"))
            return
        spark = spark_session()
        if request.param == "iceberg classic":
            yield Each(request.param, spark, formats.for_session(spark, "iceberg"))
            return
        server = start_postgres()
        try:
            url = make_url(server.create_database())
            catalog = IcebergCatalog.from_connection(
                conn_id="contract_catalog", conn_type="postgres", host=url.host, port=url.port,
                schema=url.database, login=url.username, password="unchecked-by-trust-auth",
                # A warehouse elsewhere: each table is still made at its own location.
                extra={"catalog": "lake", "warehouse": str(tmp_path_factory.mktemp("warehouse"))},
            )  # fmt: skip
            yield Each(request.param, spark, formats.for_session(spark, "iceberg", catalog))
        finally:
            server.stop()
        return
    if request.param == "delta classic":
        spark = spark_session()
        yield Each(request.param, spark, formats.for_session(spark))
        return
    url = request.getfixturevalue("spark_connect")
    with connect.remote_sessions(url) as new_session:
        spark = new_session()
        yield Each(request.param, spark, formats.for_session(spark))


def _rows(spark: SparkSession, data: Sequence[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(list(data), "id BIGINT, v STRING")


def _at(each: Each, path: str, version: int) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in each.fmt.read_at(each.spark, path, version).collect())


def _upsert() -> Statement:
    """A MERGE by ``id`` that updates or inserts every source column (the merge's builder), into
    the table as the format names it."""

    def statement(target: str, view: str, columns: Sequence[str], prune: str | None) -> str:
        on = merge_sql.pruned(merge_sql.keys_match(["id"]), prune)
        values = [(c, f"s.{q(c)}") for c in columns]
        clauses = [When(True, Then.UPDATE, values=values), When(False, Then.INSERT, values=values)]
        return merge_sql.merge_into(target, view, on, clauses)

    return statement


def _create(each: Each, path: str) -> None:
    commit = each.fmt.replace(
        _rows(each.spark, FIRST), path, ["id"], APP, 1, files=1, column_mapping=False, properties=None
    )
    assert commit is not None and commit.version == 0


def _merge(each: Each, path: str, seq: int, data: Sequence[tuple[Any, ...]]) -> formats.Commit | None:
    return each.fmt.merge(
        each.spark,
        _rows(each.spark, data),
        path,
        _upsert(),
        APP,
        seq,
        table="contract",
        key="id",
        key_type=T.LongType(),
        size=None,  # asked of the table
        view_prefix="contract_",
    )


def test_the_format_is_the_one_asked_for_and_reads_state_the_way_its_session_can(each: Each) -> None:
    """Delta's classic/Connect choice is made inside the format, from the session."""
    if each.fmt.name == "iceberg":
        assert isinstance(each.fmt, IcebergFormat) and each.fmt.name == "iceberg"
        return
    assert isinstance(each.fmt, DeltaFormat) and each.fmt.name == "delta"
    assert each.fmt.access is (connect_tables if each.kind == "delta connect" else tables)


def test_a_replace_creates_the_table_as_one_commit_marked_with_its_window(each: Each, tmp_path: Path) -> None:
    path = str(tmp_path / "replaced")
    assert each.fmt.state(each.spark, path, APP, None).exists is False
    assert each.fmt.applied(each.spark, path, APP, 1) is False

    commit = each.fmt.replace(
        _rows(each.spark, FIRST), path, ["id"], APP, 1, files=1, column_mapping=False, properties=None
    )
    assert commit is not None and (commit.version, commit.rows_written) == (0, 3)
    state = each.fmt.state(each.spark, path, APP, None)
    assert (state.exists, state.version, state.txn_version, state.schema.names) == (True, 0, 1, ["id", "v"])
    assert each.fmt.applied(each.spark, path, APP, 1) is True
    assert each.fmt.applied(each.spark, path, APP, 2) is False
    size = each.fmt.size(each.spark, path)
    assert size.files == 1 and size.bytes > 0
    assert _at(each, path, 0) == FIRST
    # The same window again: nothing written.
    again = each.fmt.replace(
        _rows(each.spark, [(9, "z")]), path, ["id"], APP, 1, files=1, column_mapping=False, properties=None
    )
    assert again is None
    assert each.fmt.state(each.spark, path, APP, None).version == 0 and _at(each, path, 0) == FIRST


def test_a_catalogs_table_is_at_the_syncs_location_and_one_elsewhere_is_refused(
    each: Each, tmp_path: Path
) -> None:
    """A JDBC catalog (its warehouse elsewhere) registers the sync's table at the sync's location;
    a table of the same name the catalog has at another location is not the sync's: refused."""
    if each.kind != "iceberg jdbc":
        pytest.skip("a JDBC catalog's")
    assert isinstance(each.fmt, IcebergFormat) and each.fmt.jdbc is not None
    path = tmp_path / "ns" / "placed"
    each.fmt.replace(
        _rows(each.spark, FIRST), str(path), ["id"], APP, 1, files=1, column_mapping=False, properties=None
    )
    assert (path / "metadata").is_dir() and any((path / "data").iterdir())
    assert each.spark.sql("SHOW TABLES IN lake.ns").collect()[0]["tableName"] == "placed"
    elsewhere = tmp_path / "other" / "ns" / "placed"  # same namespace and name: the same catalog table
    with pytest.raises(
        TargetIntegrityError, match=r"has a table ns.placed at .*, not at the sync's location .*other"
    ):
        each.fmt.state(each.spark, str(elsewhere), APP, None)
    with pytest.raises(TargetIntegrityError, match=r"Remedy: give the sync's table another path"):
        each.fmt.applied(each.spark, str(elsewhere), APP, 1)


def test_a_merged_window_is_applied_once(each: Each, tmp_path: Path) -> None:
    path = str(tmp_path / "merged")
    _create(each, path)
    assert each.fmt.applied(each.spark, path, APP, 2) is False

    commit = _merge(each, path, 2, [(2, "b2"), (4, "d")])
    assert commit is not None and commit.version == 1
    if each.fmt.name == "iceberg":  # Iceberg counts the rows a MERGE wrote, not what each was
        assert (commit.rows_written, commit.rows_inserted) == (2, 0)
    else:
        assert (commit.rows_inserted, commit.rows_updated, commit.rows_deleted) == (1, 1, 0)
    assert each.fmt.applied(each.spark, path, APP, 2) is True
    merged = [(1, "a"), (2, "b2"), (3, "c"), (4, "d")]
    assert _at(each, path, 1) == merged

    assert _merge(each, path, 2, [(2, "other"), (5, "e")]) is None  # the same window: skipped
    state = each.fmt.state(each.spark, path, APP, None)
    assert (state.version, state.txn_version) == (1, 2)
    assert _at(each, path, 1) == merged


def test_the_commits_of_a_marked_block_carry_the_mark_which_the_state_reads_back(
    each: Each, tmp_path: Path
) -> None:
    """A window's commits carry its mark (``merge/job/marks.py``); the state reads the marks of
    the commits after the version the sync last recorded (``restores_after``), and none before it.
    A write outside the block carries none, and a skipped write commits nothing."""
    path = str(tmp_path / "marked")
    _create(each, path)  # version 0, unmarked
    two = '{"vitess_window":2,"read":"r2"}'
    with each.fmt.marked(each.spark, two):
        assert _merge(each, path, 2, [(2, "b2")]) is not None  # version 1
        assert _merge(each, path, 2, [(2, "again")]) is None  # skipped: no commit
    with each.fmt.marked(each.spark, '{"vitess_window":3,"read":"r3"}'):
        assert _merge(each, path, 3, [(4, "d")]) is not None  # version 2
    assert _merge(each, path, 4, [(5, "e")]) is not None  # version 3, unmarked
    assert each.fmt.state(each.spark, path, APP, 0).marks == {2: "r2", 3: "r3"}
    assert each.fmt.state(each.spark, path, APP, 1).marks == {3: "r3"}
    assert each.fmt.state(each.spark, path, APP, 3).marks == {}
    assert each.fmt.state(each.spark, path, APP, None).marks == {}  # nothing recorded: not read


def test_an_append_creates_the_table_then_adds_each_window_once(each: Each, tmp_path: Path) -> None:
    path = str(tmp_path / "appended")
    first = each.fmt.append(_rows(each.spark, FIRST[:2]), path, APP, 1, create={}, column_mapping=False)
    assert first is not None and (first.version, first.rows_written) == (0, 2)
    second = each.fmt.append(_rows(each.spark, FIRST[2:]), path, APP, 2, create=None, column_mapping=False)
    assert second is not None and (second.version, second.rows_written) == (1, 1)
    assert (
        each.fmt.append(_rows(each.spark, FIRST[2:]), path, APP, 2, create=None, column_mapping=False) is None
    )
    state = each.fmt.state(each.spark, path, APP, None)
    assert (state.version, state.txn_version) == (1, 2)
    assert _at(each, path, 1) == FIRST


def test_evolve_adds_a_column_the_next_window_writes(each: Each, tmp_path: Path) -> None:
    path = str(tmp_path / "evolved")
    _create(each, path)
    wide = T.StructField("w", T.LongType())
    each.fmt.evolve(each.spark, path, Evolution("contract", add=(wide,)), widen_in_place=False)
    state = each.fmt.state(each.spark, path, APP, None)
    assert state.schema.names == ["id", "v", "w"] and state.txn_version == 1
    rows = each.spark.createDataFrame([(4, "d", 40)], "id BIGINT, v STRING, w BIGINT")
    commit = each.fmt.merge(
        each.spark,
        rows,
        path,
        _upsert(),
        APP,
        2,
        table="contract",
        key="id",
        key_type=T.LongType(),
        size=None,
        view_prefix="contract_",
    )
    assert commit is not None
    assert (commit.rows_written if each.fmt.name == "iceberg" else commit.rows_inserted) == 1
    assert _at(each, path, commit.version) == [(1, "a", None), (2, "b", None), (3, "c", None), (4, "d", 40)]


def test_a_read_at_an_earlier_version_gives_that_versions_rows(each: Each, tmp_path: Path) -> None:
    """Time travel, as the consistent cut reads each table: by the format's read and by its SQL."""
    path = str(tmp_path / "travel")
    _create(each, path)
    later = _merge(each, path, 2, [(1, "a2")])
    assert later is not None and later.version == 1
    assert _at(each, path, 0) == FIRST
    if each.fmt.name == "delta":  # an Iceberg table's SQL at a version names a snapshot id
        assert sorted(tuple(r) for r in each.spark.sql(each.fmt.sql_at(path, 0)).collect()) == FIRST
        assert sorted(tuple(r) for r in each.spark.sql(formats.sql_at(path, 0)).collect()) == FIRST
    assert _at(each, path, 1) == [(1, "a2"), (2, "b"), (3, "c")]


def _roll_back(each: Each, path: str, version: int) -> None:
    """Another program rolls the table back to ``version``: Delta's RESTORE, Iceberg's
    rollback_to_snapshot procedure (the snapshot current at that version)."""
    if each.fmt.name == "delta":
        each.spark.sql(f"RESTORE TABLE delta.{q(path)} TO VERSION AS OF {version}")
        return
    assert isinstance(each.fmt, IcebergFormat)
    table = iceberg_sql.register(each.spark, iceberg_sql.at(path, each.fmt.jdbc))
    snapshot = iceberg_log.snapshot_at(metadata_log(each.spark, table), version)
    each.spark.sql(
        f"CALL {q(table.catalog)}.system.rollback_to_snapshot('{table.namespace}.{table.name}', {snapshot})"
    )


def test_a_table_rolled_back_under_the_sync_shows_it_in_its_state(each: Each, tmp_path: Path) -> None:
    """What the integrity check reads (``merge/job/integrity.py``): a rollback past the sync's
    last window is seen after the version the sync recorded. Delta's RESTORE keeps the table's
    transaction ids, so the window rolled away still counts as held there: the RESTORE in
    ``restores`` is what tells (the check refuses it). Iceberg's rollback makes an older
    snapshot current, whose line holds only the windows before it, at its older version."""
    path = str(tmp_path / "rolled")
    _create(each, path)  # window 1, version 0
    assert _merge(each, path, 2, [(4, "d")]) is not None  # version 1
    assert _merge(each, path, 3, [(5, "e")]) is not None  # version 2
    _roll_back(each, path, 1)
    state = each.fmt.state(each.spark, path, APP, 2)  # the sync recorded version 2
    assert sorted(tuple(r) for r in each.fmt.read(each.spark, path).collect()) == [*FIRST, (4, "d")]
    if each.fmt.name == "delta":
        assert (state.version, state.txn_version, state.restores) == (3, 3, (3,))
        assert each.fmt.applied(each.spark, path, APP, 3) is True
    else:
        assert (state.version, state.txn_version, state.restores) == (1, 2, (1,))
        assert each.fmt.applied(each.spark, path, APP, 3) is False
    # The check before a run writes refuses the table, naming the rollback or the lost window.
    target = TableTarget("contract", path, ("id",), ("id",), last_merged_seq=3, last_delta_version=2)
    plan = MergePlan(
        APP, (WindowToMerge(4, "/staging/w4/_manifest.json"),), {"contract": target}, each.fmt.name
    )
    with pytest.raises(TargetIntegrityError) as refused:
        each.fmt.check(plan, {"contract": state}, {})
    if each.fmt.name == "delta":
        assert "the Delta table at" in str(refused.value) and "RESTORE at Delta version 3" in str(
            refused.value
        )
    else:
        assert "the Iceberg table at" in str(refused.value)
        assert "holds this sync's windows only up to 2, but window 3 was merged" in str(refused.value)
        assert "rolled back (rollback_to_snapshot)" in str(refused.value)


def test_evolve_widens_and_drops_columns_keeping_every_value_and_the_windows_held(
    each: Each, tmp_path: Path
) -> None:
    """A widening the format does in place (Iceberg: INT to BIGINT) and one it cannot (INT to
    DECIMAL(20,0): Iceberg replaces the table with its rows cast; Delta without type widening
    rewrites for both), and a dropped column: every value survives, and the table still holds
    the windows it held (a replace that rewrites carries the marker of the snapshot it replaces)."""
    path = str(tmp_path / "widened")
    rows = each.spark.createDataFrame(
        [(1, "a", 10, 20), (2, "b", 11, 21)], "id BIGINT, v STRING, n INT, m INT"
    )
    commit = each.fmt.replace(rows, path, ["id"], APP, 1, files=1, column_mapping=False, properties=None)
    assert commit is not None
    wide = T.DecimalType(20, 0)
    ev = Evolution(
        "contract", widen=(("n", T.IntegerType(), T.LongType()), ("m", T.IntegerType(), wide)), drop=("v",)
    )
    each.fmt.evolve(each.spark, path, ev, widen_in_place=False)
    state = each.fmt.state(each.spark, path, APP, None)
    assert [(f.name, f.dataType) for f in state.schema.fields] == [
        ("id", T.LongType()),
        ("n", T.LongType()),
        ("m", wide),
    ]
    assert state.txn_version == 1 and each.fmt.applied(each.spark, path, APP, 1) is True
    got = sorted(tuple(r) for r in each.fmt.read(each.spark, path).collect())
    assert [(i, n, int(m)) for i, n, m in got] == [(1, 10, 20), (2, 11, 21)]
