"""Column control without a database: the arguments' checks, the checks against a table and its
key, the recorded choice, the filter text, and the hashing of a column in both staging paths."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.capture.columns import (
    WINDOW_COLUMNS,
    ColumnChoice,
    TableColumns,
    parse,
    reconcile,
    resolve,
)
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from airflow_provider_vitess.decoding.events import Operation, RawRows
from airflow_provider_vitess.decoding.values import RowDecoder
from airflow_provider_vitess.exceptions import ColumnChoiceError, ColumnsChangedError, StagingError
from airflow_provider_vitess.keys import Column, Index, KeyChoice, KeyOverrides, TableShape, choose_key
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.staging.hashing import ColumnHasher
from airflow_provider_vitess.triggers.changes import VitessChangesTrigger
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.changes import watched_columns
from airflow_provider_vitess.vstream.request import StreamTarget, table_filter

T = query_pb2.Type
SHAPE = TableShape(
    "people",
    (
        Column("id", "bigint", "bigint", False),
        Column("Email", "varchar", "varchar(80)", True),
        Column("ssn", "varchar", "varchar(20)", True),
        Column("code", "int", "int", False),
        Column("note", "text", "text", True),
    ),
    (Index("PRIMARY", True, True, ("id",)), Index("uk_code", True, False, ("code",))),
    keyspace="ks",
)
KEY = choose_key(SHAPE)


# -- the arguments -----------------------------------------------------------------------------


def test_include_and_exclude_for_one_table_is_refused_naming_it() -> None:
    with pytest.raises(
        ColumnChoiceError, match=r"table 'people' has both include_columns and exclude_columns"
    ):
        parse(["people"], {"people": ["id"]}, {"people": ["ssn"]})


@pytest.mark.parametrize("arg", ["include_columns", "exclude_columns", "hash_columns"])
def test_a_table_not_in_the_sync_is_refused(arg: str) -> None:
    with pytest.raises(ColumnChoiceError, match=rf"{arg} names table\(s\) \['peeple'\]"):
        parse(["people"], **{arg: {"peeple": ["x"]}})


def test_a_hashed_column_that_is_not_read_is_refused() -> None:
    with pytest.raises(ColumnChoiceError, match=r"hash_columns \['ssn'\] are not read"):
        parse(["people"], exclude_columns={"people": ["ssn"]}, hash_columns={"people": ["ssn"]})
    with pytest.raises(ColumnChoiceError, match=r"hash_columns \['email'\] are not read"):
        parse(["people"], include_columns={"people": ["id"]}, hash_columns={"people": ["email"]})


def test_empty_and_repeated_lists_are_refused() -> None:
    with pytest.raises(ColumnChoiceError, match=r"include_columns\['people'\] is empty"):
        parse(["people"], include_columns={"people": []})
    with pytest.raises(ColumnChoiceError, match="names column\\(s\\) ssn more than once"):
        parse(["people"], exclude_columns={"people": ["ssn", "SSN"]})


def test_lists_come_as_lists_or_text_and_tables_without_control_are_left_out() -> None:
    got = parse(
        ["people", "other"], exclude_columns={"people": "ssn, note"}, hash_columns={"people": ["email"]}
    )
    assert got == {"people": TableColumns(None, ("ssn", "note"), ("email",))}


# -- against the table and its key -------------------------------------------------------------


def test_exclude_selects_the_other_columns_in_table_order_and_the_table_spelling() -> None:
    chosen = resolve(SHAPE, TableColumns(exclude=("SSN",), hash=("email",)), KEY)
    assert chosen.select == ("id", "Email", "code", "note")
    assert chosen.hashed == ("Email",)


def test_include_selects_those_columns_in_table_order() -> None:
    assert resolve(SHAPE, TableColumns(include=("note", "id", "code")), KEY).select == ("id", "code", "note")


def test_no_exclusion_selects_every_column() -> None:
    assert resolve(SHAPE, TableColumns(hash=("note",)), KEY).select is None


def test_an_unknown_column_is_refused_naming_table_column_and_the_columns() -> None:
    with pytest.raises(
        ColumnChoiceError, match=r"exclude_columns of table ks.people names column 'snn'.*ssn"
    ):
        resolve(SHAPE, TableColumns(exclude=("snn",)), KEY)


def test_the_key_cannot_be_excluded_left_out_or_hashed() -> None:
    with pytest.raises(
        ColumnChoiceError,
        match=r"exclude_columns names column 'id', a column of the key \['id'\].*Remove 'id'",
    ):
        resolve(SHAPE, TableColumns(exclude=("id",)), KEY)
    with pytest.raises(
        ColumnChoiceError, match=r"include_columns leaves out column 'id'.*Add 'id' to include_columns"
    ):
        resolve(SHAPE, TableColumns(include=("code", "note")), KEY)
    with pytest.raises(ColumnChoiceError, match=r"hash_columns names column 'id'.*never hashed"):
        resolve(SHAPE, TableColumns(hash=("id",)), KEY)


def test_the_primary_key_stays_in_clear_under_a_key_override() -> None:
    """The copy phase records the PRIMARY KEY's values in every checkpointed VGTID."""
    key = choose_key(SHAPE, KeyOverrides(source_unique_key_columns=("code",)))
    with pytest.raises(
        ColumnChoiceError, match=r"'id', a column of the table's PRIMARY KEY \(the copy phase"
    ):
        resolve(SHAPE, TableColumns(hash=("id",)), key)
    with pytest.raises(ColumnChoiceError, match=r"exclude_columns names column 'code', a column of the key"):
        resolve(SHAPE, TableColumns(exclude=("code",)), key)


def test_an_all_columns_key_leaves_nothing_to_exclude() -> None:
    bare = TableShape("t", SHAPE.columns, (), keyspace="ks")
    key = choose_key(bare, allow_all_columns_key=True)
    with pytest.raises(ColumnChoiceError, match="column 'ssn', a column of the key"):
        resolve(bare, TableColumns(exclude=("ssn",)), key)


# -- the recorded choice -----------------------------------------------------------------------


def _chosen(columns: TableColumns) -> dict[str, ColumnChoice]:
    return {"people": resolve(SHAPE, columns, KEY)}


def test_a_changed_choice_of_a_built_table_is_refused_with_the_remedy() -> None:
    before = {"people": TableColumns(exclude=("ssn",)).record()}
    with pytest.raises(ColumnsChangedError) as refused:
        reconcile(
            "s", before, {"people"}, _chosen(TableColumns(exclude=("ssn",), hash=("email",))), ["people"]
        )
    assert "hash_columns ['email']" in str(refused.value)
    assert '{"resnapshot_tables": ["people"]}' in str(refused.value)


def test_a_built_table_without_a_record_was_built_with_every_column() -> None:
    with pytest.raises(ColumnsChangedError, match=r"built .*with every column"):
        reconcile("s", {}, {"people"}, _chosen(TableColumns(exclude=("ssn",))), ["people"])
    assert reconcile("s", {}, {"people"}, {}, ["people"]) == {"people": TableColumns().record()}


def test_a_resnapshot_or_a_new_table_takes_the_choice_given_now() -> None:
    now = TableColumns(exclude=("ssn",))
    before = {"people": TableColumns().record()}
    chosen = _chosen(now)
    assert reconcile("s", before, {"people"}, chosen, ["people"], snapshot_of=["people"]) == {
        "people": now.record()
    }
    assert reconcile("s", before, set(), chosen, ["people"]) == {"people": now.record()}
    # Names are compared as MySQL compares them: case-insensitively.
    assert reconcile(
        "s", {"people": now.record()}, {"people"}, _chosen(TableColumns(exclude=("SSN",))), ["people"]
    )


# -- the filter --------------------------------------------------------------------------------


def test_the_filter_lists_the_chosen_columns_quoted_and_every_column_otherwise() -> None:
    rules = table_filter(["people", "odd`t"], {"people": ("id", "we`ird")}).rules
    assert [(r.match, r.filter) for r in rules] == [
        ("people", "select `id`, `we``ird` from `people`"),
        ("odd`t", "select * from `odd``t`"),
    ]
    with pytest.raises(ValueError, match="empty column list"):
        table_filter(["people"], {"people": ()})


# -- hashing -----------------------------------------------------------------------------------

FIELDS = [
    query_pb2.Field(name="id", type=T.INT64, column_type="bigint", flags=1),
    query_pb2.Field(name="email", type=T.VARCHAR, column_type="varchar(80)", charset=255),
    query_pb2.Field(name="born", type=T.DATE, column_type="date"),
]


Image = tuple[bytes | None, ...]
POSITION = Vgtid.from_json('[{"keyspace":"ks","shard":"-","gtid":"MariaDB/0-1-5"}]')


def _row(values: Image) -> query_pb2.Row:
    lengths = [-1 if v is None else len(v) for v in values]
    return query_pb2.Row(lengths=lengths, values=b"".join(v or b"" for v in values))


def _row_event(changes: list[tuple[Image | None, Image]]) -> bytes:
    """A ROW event of (before, after) images."""
    out = [
        binlogdata_pb2.RowChange(before=_row(before), after=_row(after))
        if before is not None
        else binlogdata_pb2.RowChange(after=_row(after))
        for before, after in changes
    ]
    return binlogdata_pb2.RowEvent(table_name="people", row_changes=out).SerializeToString()


def test_a_hasher_never_shows_its_salt_and_refuses_an_empty_one() -> None:
    assert "s3cret" not in repr(ColumnHasher("s3cret", {"people": ["email"]}))
    with pytest.raises(ColumnChoiceError, match="salt"):
        ColumnHasher("", {"people": ["email"]})


@pytest.mark.parametrize("mixed", [False, True], ids=["columnar", "per-row decoder"])
def test_hashed_values_are_sha256_of_salt_and_value_and_null_stays_null(tmp_path: Path, mixed: bool) -> None:
    """Inserts only: the columnar path. An update among them: the layout proof refuses mixed
    operations, and the per-row decoder stages the event; both hash."""
    third: Image = (b"3", b"ann@example.test", b"0000-00-00")
    changes: list[tuple[Image | None, Image]] = [
        (None, (b"1", b"ann@example.test", b"2020-01-31")),
        (None, (b"2", None, None)),
        ((b"3", b"bob@example.test", None) if mixed else None, third),
    ]
    stager = WindowStager(
        str(tmp_path),
        "s",
        1,
        key_columns={"people": ("id",)},
        hashing=ColumnHasher("pepper", {"people": ["EMAIL"]}),
    )
    stager.set_schema("ks", "people", FIELDS)
    rows = RawRows(_row_event(changes), len(changes), RowDecoder(FIELDS, "people"))
    stager.add_rows("ks", "people", "-", 100, 1, rows)
    manifest = stager.finish(POSITION, None, POSITION)
    staged = read_table(manifest, "people")
    digest = hashlib.sha256(b"pepperann@example.test").hexdigest()
    assert staged.column("email").to_pylist() == [digest, None, digest]
    assert staged.column("_op").to_pylist() == ["insert", "insert", "update" if mixed else "insert"]
    schema = manifest.tables["people"].schemas[0]
    assert [(c.name, c.column_type) for c in schema.columns] == [
        ("id", "bigint"),
        ("email", "char(64)"),
        ("born", "date"),
    ]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"@example" not in path.read_bytes(), path
            if path.suffix == ".parquet":
                assert "@example" not in repr(pq.read_table(path).to_pylist())


def test_decoded_rows_of_a_hashed_table_are_refused(tmp_path: Path) -> None:
    stager = WindowStager(str(tmp_path), "s", 1, hashing=ColumnHasher("pepper", {"people": ["email"]}))
    stager.set_schema("ks", "people", FIELDS)
    with pytest.raises(StagingError, match="hash_columns"):
        stager.add_change("ks", "people", "-", Operation.INSERT, 1, 1, None, (1, "clear", None))


# -- the operators and the DAG factory ---------------------------------------------------------


def test_the_factory_refuses_bad_column_control_at_import() -> None:
    base: dict[str, Any] = {
        "keyspace": "k",
        "tables": ["people"],
        "staging_location": "/s",
        "target_location": "/t",
    }
    with pytest.raises(ColumnChoiceError, match="both include_columns and exclude_columns"):
        vitess_sync_dag("d1", include_columns={"people": ["id"]}, exclude_columns={"people": ["ssn"]}, **base)
    with pytest.raises(ColumnChoiceError, match="hash_columns need hash_salt_conn_id"):
        vitess_sync_dag("d2", hash_columns={"people": ["email"]}, **base)


def test_the_factory_passes_column_control_to_both_capture_tasks_and_no_salt() -> None:
    dag = vitess_sync_dag(
        "d3",
        keyspace="k",
        tables=["people"],
        staging_location="/s",
        target_location="/t",
        exclude_columns={"people": ["ssn"]},
        hash_columns={"people": ["email"]},
        hash_salt_conn_id="salt_conn",
    )
    for task_id in ("snapshot", "catch_up"):
        task = dag.get_task(task_id)
        assert isinstance(task, VitessSnapshotOperator | VitessCatchUpOperator)
        assert task.exclude_columns == {"people": ["ssn"]}
        assert task.hash_columns == {"people": ["email"]}
        assert task.hash_salt_conn_id == "salt_conn"


def test_a_key_choice_fixture_is_the_primary_key() -> None:
    assert isinstance(KEY, KeyChoice) and KEY.source_columns == ("id",)


# -- the changes sensor ------------------------------------------------------------------------


def test_the_sensor_streams_only_the_key_of_a_table_under_column_control() -> None:
    key = {"source_columns": ["id"]}
    config = {
        "keys": {"people": key, "plain": {"source_columns": ["k"]}, "hashed": key},
        WINDOW_COLUMNS: {
            "people": TableColumns(exclude=("ssn",)).record(),
            "plain": TableColumns().record(),
            "hashed": TableColumns(hash=("email",)).record(),
        },
    }
    assert watched_columns(config) == {"people": ["id"], "hashed": ["id"]}
    assert watched_columns({"keys": config["keys"]}) == {}  # a sync recorded before column control


def test_the_trigger_keeps_the_watched_columns_across_serialization_and_puts_them_in_its_filter() -> None:
    trigger = VitessChangesTrigger(
        vitess_conn_id="c",
        keyspace="ks",
        tables=["people", "plain"],
        start_vgtid=POSITION.to_json(),
        columns={"people": ["id"]},
    )
    _, kwargs = trigger.serialize()
    rebuilt = VitessChangesTrigger(**kwargs)
    request = rebuilt._request(StreamTarget(), POSITION)
    assert [(r.match, r.filter) for r in request.filter.rules] == [
        ("people", "select `id` from `people`"),
        ("plain", "select * from `plain`"),
    ]


def test_a_column_dropped_at_the_source_may_leave_the_lists_without_a_resnapshot() -> None:
    before = {"people": TableColumns(exclude=("ssn", "gone"), hash=("email", "gone2")).record()}
    now = _chosen(TableColumns(exclude=("ssn",), hash=("email",)))  # "gone", "gone2" not in SHAPE
    assert reconcile("s", before, {"people"}, now, ["people"]) == {"people": now["people"].given.record()}
    # ...but a column the table still has is a change.
    before = {"people": TableColumns(exclude=("ssn", "note")).record()}
    with pytest.raises(ColumnsChangedError):
        reconcile("s", before, {"people"}, _chosen(TableColumns(exclude=("ssn",))), ["people"])
    with pytest.raises(ColumnChoiceError, match="column dropped at the source: take it out of the list"):
        resolve(SHAPE, TableColumns(exclude=("gone",)), KEY)


def test_lineage_marks_a_hashed_column_as_masked_and_the_others_as_identity() -> None:
    pytest.importorskip("airflow.providers.openlineage")
    from airflow_provider_vitess.lineage.openlineage import _column_lineage
    from airflow_provider_vitess.lineage.uris import DatasetName
    from airflow_provider_vitess.staging.manifest import TableSchema

    schema = TableSchema.from_fields("people", FIELDS, ("id",))
    facet = _column_lineage(DatasetName("vitess://vtgate:15991", "ks.people"), {}, schema, {"email"})
    kinds = {
        name: (f.transformationType, f.inputFields[0].transformations[0].masking)
        for name, f in facet.fields.items()
    }
    assert kinds == {"id": ("IDENTITY", None), "email": ("MASKED", True), "born": ("IDENTITY", None)}


def test_a_hashed_text_column_left_out_of_a_partial_image_stays_absent_not_hashed(tmp_path: Path) -> None:
    """binlog_row_image=NOBLOB: an UPDATE that does not set a TEXT column leaves it out; hashed,
    the column stays a TEXT column, so the stager records it absent (the merge keeps the Delta
    row's hash) instead of hashing a NULL that is not one or refusing the image."""
    fields = [
        query_pb2.Field(name="id", type=T.INT64, column_type="bigint", flags=1),
        query_pb2.Field(name="bio", type=T.TEXT, column_type="text", charset=255),
    ]
    change = binlogdata_pb2.RowChange(before=_row((b"1", b"old bio")), after=_row((b"1", None)))
    change.data_columns.CopyFrom(binlogdata_pb2.RowChange.Bitmap(count=2, cols=bytes([0b01])))
    data = binlogdata_pb2.RowEvent(table_name="people", row_changes=[change]).SerializeToString()
    stager = WindowStager(
        str(tmp_path),
        "s",
        1,
        key_columns={"people": ("id",)},
        hashing=ColumnHasher("pepper", {"people": ["bio"]}),
    )
    stager.set_schema("ks", "people", fields)
    stager.add_rows("ks", "people", "-", 1, 1, RawRows(data, 1, RowDecoder(fields, "people")))
    staged = read_table(stager.finish(POSITION, None, POSITION), "people")
    assert staged.column("bio").to_pylist() == [None]
    assert staged.column("_absent").to_pylist() == [["bio"]]
    assert str(staged.schema.field("bio").type) == "string"
    assert "old bio" not in repr(staged.to_pylist())
