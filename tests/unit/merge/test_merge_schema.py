"""Staged column -> Delta type, window schema unification and Delta schema evolution decisions."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.merge.job.schema import (
    Conversion,
    MergeSchemaError,
    can_widen,
    evolve,
    needs_column_mapping,
    target_column,
    window_columns,
    write_types,
)
from airflow_provider_vitess.merge.plan import TableTarget
from airflow_provider_vitess.staging.manifest import ColumnSchema, PartInfo, TableManifest, TableSchema

Q = query_pb2.Type
UNSIGNED = 32
TEXT_CHARSET = 255  # utf8mb4
BINARY_CHARSET = 63


def field(
    name: str, type_: query_pb2.Type, column_type: str, *, charset: int = 0, flags: int = 0
) -> query_pb2.Field:
    return query_pb2.Field(name=name, type=type_, column_type=column_type, charset=charset, flags=flags)


def column(name: str, type_: query_pb2.Type, column_type: str, **kw: int) -> ColumnSchema:
    return ColumnSchema.from_field(field(name, type_, column_type, **kw))


@pytest.mark.parametrize(
    ("type_", "column_type", "kw", "expected"),
    [
        (Q.INT8, "tinyint(4)", {}, T.ByteType()),
        (Q.UINT8, "tinyint(3) unsigned", {"flags": UNSIGNED}, T.ShortType()),
        (Q.INT16, "smallint(6)", {}, T.ShortType()),
        (Q.UINT16, "smallint unsigned", {"flags": UNSIGNED}, T.IntegerType()),
        (Q.INT24, "mediumint", {}, T.IntegerType()),
        (Q.UINT24, "mediumint unsigned", {"flags": UNSIGNED}, T.LongType()),
        (Q.INT32, "int(11)", {}, T.IntegerType()),
        (Q.UINT32, "int unsigned", {"flags": UNSIGNED}, T.LongType()),
        (Q.INT64, "bigint(20)", {}, T.LongType()),
        (Q.UINT64, "bigint(20) unsigned", {"flags": UNSIGNED}, T.DecimalType(20, 0)),
        (Q.YEAR, "year(4)", {}, T.ShortType()),
        (Q.DECIMAL, "decimal(12,2)", {}, T.DecimalType(12, 2)),
        (Q.DECIMAL, "decimal(38,10)", {}, T.DecimalType(38, 10)),
        (Q.FLOAT32, "float", {}, T.DoubleType()),
        (Q.FLOAT64, "double", {}, T.DoubleType()),
        (Q.DATE, "date", {}, T.DateType()),
        (Q.DATETIME, "datetime(6)", {}, T.TimestampNTZType()),
        (Q.TIMESTAMP, "timestamp(6)", {}, T.TimestampType()),
        (Q.TIME, "time(6)", {}, T.LongType()),
        (Q.VARCHAR, "varchar(64)", {"charset": TEXT_CHARSET}, T.StringType()),
        (Q.TEXT, "text", {"charset": TEXT_CHARSET}, T.StringType()),
        (Q.JSON, "json", {}, T.StringType()),
        (Q.ENUM, "enum('a','b')", {}, T.StringType()),
        (Q.SET, "set('x','y')", {}, T.StringType()),
        (Q.BLOB, "longtext", {"charset": TEXT_CHARSET}, T.StringType()),  # MariaDB JSON, _bin text
        (Q.VARBINARY, "varbinary(16)", {"charset": BINARY_CHARSET}, T.BinaryType()),
        (Q.BLOB, "blob", {"charset": BINARY_CHARSET}, T.BinaryType()),
        (Q.BIT, "bit(64)", {}, T.BinaryType()),
    ],
)
def test_delta_type_of_each_staged_type(
    type_: query_pb2.Type, column_type: str, kw: dict[str, int], expected: T.DataType
) -> None:
    c = target_column("t", column("c", type_, column_type, **kw))
    assert c.type == expected
    assert c.read_type == expected  # Spark reads the staged Parquet column with the Delta type itself
    assert c.conversion is Conversion.NONE


def test_wide_decimal_becomes_exact_text_read_from_the_raw_bytes() -> None:
    c = target_column("t", column("d", Q.DECIMAL, "decimal(65,30)"))
    assert (c.type, c.read_type, c.conversion, c.scale) == (
        T.StringType(),
        T.BinaryType(),
        Conversion.DECIMAL_TEXT,
        30,
    )
    assert "decimal(65,30)" in c.comment


def test_time_and_bit_carry_a_comment_saying_how_to_read_them() -> None:
    assert "signed microseconds" in target_column("t", column("t", Q.TIME, "time(6)")).comment
    assert "big-endian bytes" in target_column("t", column("b", Q.BIT, "bit(1)")).comment
    assert target_column("t", column("t", Q.TIME, "time")).struct_field().metadata["comment"]


def test_renames_apply_to_the_target_name() -> None:
    target = TableTarget("t", "/x", ("id",), ("id",), {"old": "new"})
    c = target_column("t", column("old", Q.INT32, "int"), target)
    assert (c.name, c.source) == ("new", "old")


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        (T.IntegerType(), T.LongType(), True),
        (T.ByteType(), T.ShortType(), True),
        (T.ShortType(), T.LongType(), True),
        (T.LongType(), T.IntegerType(), False),
        (T.LongType(), T.DecimalType(20, 0), True),  # BIGINT -> BIGINT UNSIGNED
        (T.LongType(), T.DecimalType(19, 0), False),
        (T.IntegerType(), T.DecimalType(12, 2), True),
        (T.IntegerType(), T.DoubleType(), True),
        (T.LongType(), T.DoubleType(), False),
        (T.DecimalType(10, 2), T.DecimalType(12, 2), True),
        (T.DecimalType(10, 2), T.DecimalType(12, 4), True),
        (T.DecimalType(10, 2), T.DecimalType(12, 1), False),
        (T.DecimalType(10, 2), T.DecimalType(11, 4), False),  # loses an integer digit
        (T.StringType(), T.IntegerType(), False),
        (T.IntegerType(), T.StringType(), False),
        (T.TimestampNTZType(), T.TimestampType(), False),
        (T.DateType(), T.TimestampNTZType(), False),  # not supported by Delta 4.4's ALTER
        (T.DecimalType(30, 2), T.StringType(), False),  # DECIMAL(30,2) -> DECIMAL(40,2) (text)
        (T.StringType(), T.StringType(), True),
    ],
)
def test_widening_follows_delta(old: T.DataType, new: T.DataType, ok: bool) -> None:
    assert can_widen(old, new) is ok


def schema(*cols: ColumnSchema, keys: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(tuple(cols), keys)


def manifest_of(*schemas: TableSchema, table: str = "t") -> TableManifest:
    parts = tuple(
        PartInfo(table, f"{table}/part-{i:05d}.parquet", 1, 1, "0" * 64, s.to_json())
        for i, s in enumerate(schemas)
    )
    return TableManifest(table, ("ks",), schemas[-1].key_columns, schemas, parts, {})


ID = column("id", Q.INT32, "int(11)", flags=1)
ID64 = column("id", Q.INT64, "bigint(20)", flags=1)
NAME = column("name", Q.VARCHAR, "varchar(10)", charset=TEXT_CHARSET)
NAME_INT = column("name", Q.INT32, "int(11)")
QTY = column("qty", Q.INT32, "int(11)")
TARGET = TableTarget("t", "/x", ("id",), ("id",))


def test_window_columns_unify_versions_first_seen_order_widest_type() -> None:
    wc = window_columns(manifest_of(schema(ID, NAME), schema(ID64, NAME, QTY)), TARGET)
    assert [(c.name, c.type) for c in wc.columns] == [
        ("id", T.LongType()),
        ("name", T.StringType()),
        ("qty", T.IntegerType()),
    ]
    assert wc.versions[0]["id"].type == T.IntegerType()  # read as staged, cast to the unified type
    assert "qty" not in wc.versions[0]
    assert wc.key_sources == ("id",)


def test_incompatible_change_inside_a_window_names_table_and_column() -> None:
    with pytest.raises(
        MergeSchemaError,
        match=r"table 't' column 'name': the staged type int \(source type int\(11\)\) cannot be written",
    ):
        window_columns(manifest_of(schema(ID, NAME), schema(ID, NAME_INT)), TARGET)


def test_key_must_be_staged_with_its_before_image() -> None:
    with pytest.raises(MergeSchemaError, match=r"before image is not staged"):
        window_columns(manifest_of(schema(ID, NAME, keys=("name",))), TARGET)
    with pytest.raises(MergeSchemaError, match=r"does not have"):
        window_columns(manifest_of(schema(ID)), TableTarget("t", "/x", ("code",), ("code",)))
    with pytest.raises(MergeSchemaError, match=r"add the rename 'id' -> 'key'"):
        window_columns(manifest_of(schema(ID)), TableTarget("t", "/x", ("key",), ("id",)))


def current(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in fields])


def test_evolve_adds_and_widens_and_keeps_wider_columns() -> None:
    wc = window_columns(manifest_of(schema(ID64, NAME, QTY)), TARGET)
    ev = evolve("t", current(("id", T.IntegerType()), ("name", T.StringType())), wc)
    assert [f.name for f in ev.add] == ["qty"]
    assert ev.widen == (("id", T.IntegerType(), T.LongType()),)
    assert ev.result.fieldNames() == ["id", "name", "qty"]
    assert ev.result["id"].dataType == T.LongType()
    assert ev.changes == ["add column qty int", "widen column id int -> bigint"]
    # A narrower incoming type is written into the wider column: no change.
    narrow = window_columns(manifest_of(schema(ID, NAME)), TARGET)
    ev2 = evolve("t", current(("id", T.LongType()), ("name", T.StringType())), narrow)
    assert ev2.empty
    assert write_types(narrow, ev2.result) == {"id": T.LongType(), "name": T.StringType()}


GONE = column("gone", Q.INT64, "bigint(20)")


def test_evolve_drops_delta_columns_no_staged_column_feeds() -> None:
    wc = window_columns(manifest_of(schema(ID, NAME)), TARGET)
    delta = current(("id", T.IntegerType()), ("gone", T.LongType()), ("name", T.StringType()))
    ev = evolve("t", delta, wc)
    assert ev.drop == ("gone",)
    assert ev.add == () and ev.widen == ()
    assert ev.result.fieldNames() == ["id", "name"]
    # No column mapping turned on for a drop (a reader feature Polars refuses): the table is
    # rewritten without the column instead.
    assert not ev.column_mapping and not ev.drop_in_place
    assert ev.changes == ["drop column gone"]
    assert not ev.empty
    # A table that maps its columns by name already drops it in place.
    again = evolve("t", delta, wc, column_mapping_enabled=True)
    assert (again.drop, again.column_mapping, again.drop_in_place) == (("gone",), False, True)
    assert again.changes == ["drop column gone"]
    # Once dropped (a rerun after the drop's commit, or any later window): nothing more to do.
    done = evolve("t", ev.result, wc, column_mapping_enabled=True)
    assert done.empty and done.result == ev.result


def test_a_rename_is_a_drop_of_the_old_name_and_an_add_of_the_new() -> None:
    renamed = column("label", Q.INT64, "bigint(20)")
    wc = window_columns(manifest_of(schema(ID, NAME, renamed)), TARGET)
    ev = evolve("t", current(("id", T.IntegerType()), ("name", T.StringType()), ("gone", T.LongType())), wc)
    assert ev.drop == ("gone",)
    assert [(f.name, f.dataType) for f in ev.add] == [("label", T.LongType())]
    assert ev.result.fieldNames() == ["id", "name", "label"]
    assert ev.changes == ["drop column gone", "add column label bigint"] and not ev.drop_in_place
    # A new name that needs column mapping turns it on, and the drop is then done in place.
    spaced = column("my label", Q.INT64, "bigint(20)")
    wc2 = window_columns(manifest_of(schema(ID, NAME, spaced)), TARGET)
    ev2 = evolve("t", current(("id", T.IntegerType()), ("name", T.StringType()), ("gone", T.LongType())), wc2)
    assert ev2.column_mapping and ev2.drop_in_place
    assert ev2.changes == ["map columns by name", "drop column gone", "add column my label bigint"]


def test_a_column_some_version_of_the_window_stages_is_kept_and_renames_feed_their_target() -> None:
    # Rows staged before the DROP in the same window still carry it: kept until a window without it.
    wc = window_columns(manifest_of(schema(ID, NAME, GONE), schema(ID, NAME)), TARGET)
    ev = evolve("t", current(("id", T.IntegerType()), ("name", T.StringType()), ("gone", T.LongType())), wc)
    assert ev.drop == () and ev.empty
    # A configured rename (source "name" -> target "title") feeds "title": not a dropped column.
    target = TableTarget("t", "/x", ("id",), ("id",), {"name": "title"})
    wc2 = window_columns(manifest_of(schema(ID, NAME)), target)
    ev2 = evolve("t", current(("id", T.IntegerType()), ("title", T.StringType())), wc2)
    assert ev2.empty


def test_a_dropped_column_that_comes_back_is_a_new_column_of_its_new_type() -> None:
    back = column("gone", Q.VARCHAR, "varchar(5)", charset=TEXT_CHARSET)
    wc = window_columns(manifest_of(schema(ID, back)), TARGET)
    ev = evolve("t", current(("id", T.IntegerType())), wc, column_mapping_enabled=True)
    assert [(f.name, f.dataType) for f in ev.add] == [("gone", T.StringType())] and ev.drop == ()


def test_evolve_refuses_an_incompatible_change_naming_table_and_column() -> None:
    wc = window_columns(manifest_of(schema(ID, NAME_INT)), TARGET)
    with pytest.raises(MergeSchemaError) as err:
        evolve("orders", current(("id", T.IntegerType()), ("name", T.StringType())), wc)
    message = str(err.value)
    assert "table 'orders' column 'name'" in message
    assert "int(11)" in message and "string" in message and "nothing was written" in message


def test_evolve_refuses_names_differing_only_in_case() -> None:
    wc = window_columns(
        manifest_of(schema(ID, column("Name", Q.VARCHAR, "varchar(3)", charset=TEXT_CHARSET))), TARGET
    )
    with pytest.raises(MergeSchemaError, match="differs only in case"):
        evolve("t", current(("id", T.IntegerType()), ("name", T.StringType())), wc)


def test_names_delta_refuses_need_column_mapping() -> None:
    assert needs_column_mapping(["ok", "has space"])
    assert not needs_column_mapping(["ok", "snake_case", "ünï"])
    spaced = column("my col", Q.INT32, "int")
    ev = evolve(
        "t", current(("id", T.IntegerType())), window_columns(manifest_of(schema(ID, spaced)), TARGET)
    )
    assert ev.column_mapping and ev.changes[0] == "map columns by name"
    ev2 = evolve(
        "t",
        current(("id", T.IntegerType())),
        window_columns(manifest_of(schema(ID, spaced)), TARGET),
        column_mapping_enabled=True,
    )
    assert not ev2.column_mapping
