"""Unique-key choice (keys.rules) and information_schema row parsing, without a database."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_vitess.exceptions import KeyChoiceError, UnknownTableError
from airflow_provider_vitess.keys import (
    Column,
    Index,
    KeyChoice,
    KeyOverrides,
    TableShape,
    choose_key,
    shape_from_rows,
)


def col(name: str, column_type: str, nullable: bool = False) -> Column:
    return Column(name, column_type.split("(")[0].split()[0], column_type, nullable)


def shape(columns: list[Column], *indexes: Index, table: str = "t") -> TableShape:
    return TableShape(table, tuple(columns), tuple(indexes), keyspace="ks")


def pk(*cols: str) -> Index:
    return Index("PRIMARY", True, True, cols)


def uk(name: str, *cols: str) -> Index:
    return Index(name, True, False, cols)


COLS = [
    col("id", "bigint"),
    col("small", "smallint"),
    col("a", "int"),
    col("b", "int"),
    col("code", "char(4)"),
    col("email", "varchar(255)"),
    col("maybe", "int", nullable=True),
    col("body", "text"),
    col("price", "decimal(10,2)"),
]


@pytest.mark.parametrize(
    ("indexes", "expected_cols", "expected_index"),
    [
        pytest.param([uk("u_small", "small"), pk("email")], ("email",), "PRIMARY", id="pk-beats-better-uk"),
        pytest.param([uk("u_email", "email"), uk("u_id", "id")], ("id",), "u_id", id="integer-before-char"),
        pytest.param(
            [uk("u_code", "code"), uk("u_email", "email")], ("code",), "u_code", id="short-char-first"
        ),
        pytest.param([uk("u_id", "id"), uk("u_small", "small")], ("small",), "u_small", id="smaller-int"),
        pytest.param([uk("u_ab", "a", "b"), uk("u_id", "id")], ("id",), "u_id", id="fewer-columns-on-tie"),
        pytest.param([uk("u_a_code", "a", "code"), uk("u_ab", "a", "b")], ("a", "b"), "u_ab", id="all-int"),
        pytest.param([uk("u_price", "price"), uk("u_body", "body")], ("price",), "u_price", id="text-last"),
        pytest.param(
            [uk("u_maybe", "maybe"), uk("u_email", "email")], ("email",), "u_email", id="null-skipped"
        ),
        pytest.param([Index("k_id", False, False, ("id",)), uk("u_b", "b")], ("b",), "u_b", id="plain-key"),
        pytest.param([uk("z", "a"), uk("y", "b")], ("b",), "y", id="name-breaks-ties"),
    ],
)
def test_ranking(indexes: list[Index], expected_cols: tuple[str, ...], expected_index: str) -> None:
    choice = choose_key(shape(COLS, *indexes))
    assert (choice.source_columns, choice.source_index) == (expected_cols, expected_index)
    assert choice.target_columns == expected_cols
    assert choice.target_from_source == expected_cols


def test_reason_is_recorded_and_round_trips() -> None:
    choice = choose_key(shape(COLS, uk("u_id", "id")))
    assert choice.reason == "best non-NULLable UNIQUE KEY u_id; same key on the target"
    assert choice.to_dict()["source_columns"] == ["id"]
    assert KeyChoice.from_dict(choice.to_dict()) == choice


def test_no_eligible_key_lists_each_key_and_why() -> None:
    s = shape(COLS, uk("u_maybe", "maybe"), uk("u_mix", "id", "maybe"), Index("k_a", False, False, ("a",)))
    with pytest.raises(KeyChoiceError) as err:
        choose_key(s)
    assert str(err.value).startswith(
        "table ks.t has no eligible unique key: no PRIMARY KEY; "
        "UNIQUE KEY u_maybe (maybe): column(s) maybe NULLable (several rows may hold NULL); "
        "UNIQUE KEY u_mix (id, maybe): column(s) maybe NULLable (several rows may hold NULL). "
        "Set source_unique_key_columns"
    )
    assert "allow_all_columns_key=True" in str(err.value)


def test_no_key_at_all() -> None:
    with pytest.raises(KeyChoiceError, match=r"^table ks\.t has no PRIMARY KEY and no UNIQUE KEY\. "):
        choose_key(shape(COLS))


def test_all_columns_fallback_is_opt_in_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    s = shape(COLS[:3], table="t")
    with caplog.at_level(logging.WARNING, logger="airflow_provider_vitess.keys.rules"):
        choice = choose_key(s, allow_all_columns_key=True)
    assert choice.source_columns == ("id", "small", "a")
    assert choice.source_index is None
    assert choice.reason.startswith("all columns")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "table ks.t has no PRIMARY KEY and no UNIQUE KEY; identifying its rows by ALL columns "
        "(allow_all_columns_key): identical rows cannot be told apart and every change carries "
        "every column as its key"
    ]


def test_source_override_wins_and_uses_table_spelling() -> None:
    choice = choose_key(shape(COLS, pk("id")), KeyOverrides(source_unique_key_columns=("EMAIL", "a")))
    assert choice.source_columns == ("email", "a")
    assert choice.source_index is None
    assert choice.reason == "source_unique_key_columns override; same key on the target"


def test_override_from_mapping_accepts_vitess_text() -> None:
    ov = KeyOverrides.from_mapping(
        {"source_unique_key_columns": "id, a", "source_unique_key_target_columns": ["tid", "ta"]}
    )
    assert ov == KeyOverrides(("id", "a"), (), ("tid", "ta"))
    assert KeyOverrides.from_mapping({}) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source_unique_key_column": "id"}, "unknown key override(s) source_unique_key_column"),
        (
            {"source_unique_key_columns": "id,ID"},
            "source_unique_key_columns names column(s) id more than once",
        ),
        (
            {"source_unique_key_columns": "id,a", "source_unique_key_target_columns": "x"},
            "source_unique_key_target_columns has 1 column(s) but source_unique_key_columns has 2",
        ),
    ],
)
def test_override_shape_errors(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(KeyChoiceError) as err:
        KeyOverrides.from_mapping(overrides)
    assert message in str(err.value)


def test_override_naming_missing_source_column() -> None:
    with pytest.raises(KeyChoiceError) as err:
        choose_key(shape(COLS, pk("id")), KeyOverrides(source_unique_key_columns=("id", "nope")))
    assert str(err.value).startswith(
        "source_unique_key_columns names column 'nope', which table ks.t does not have (columns: id, small"
    )


def test_override_naming_missing_target_column() -> None:
    target = shape([col("id", "bigint"), col("a", "int")], pk("id"), table="t2")
    with pytest.raises(KeyChoiceError) as err:
        choose_key(shape(COLS, pk("id")), KeyOverrides(target_unique_key_columns=("ghost",)), target=target)
    assert str(err.value) == (
        "target_unique_key_columns names column 'ghost', which table ks.t2 does not have (columns: id, a)"
    )


def test_target_override_not_covered_by_source() -> None:
    with pytest.raises(KeyChoiceError) as err:
        choose_key(shape(COLS, pk("id")), KeyOverrides(target_unique_key_columns=("row_uuid",)))
    assert "target_unique_key_columns includes column 'row_uuid', which no source column feeds" in str(
        err.value
    )


def test_rename_maps_source_key_positionally() -> None:
    src = shape([col("id", "int"), col("region", "char(2)"), col("v", "text", True)], pk("region", "id"))
    tgt = shape(
        [col("customer_id", "int"), col("REGION_CODE", "char(2)"), col("v", "text", True)], table="t2"
    )
    ov = KeyOverrides(source_unique_key_target_columns=("region_code", "customer_id"))
    choice = choose_key(src, ov, target=tgt)
    assert choice.source_columns == ("region", "id")
    assert choice.target_columns == ("REGION_CODE", "customer_id")
    assert choice.target_from_source == ("region", "id")
    assert choice.reason == "PRIMARY KEY PRIMARY; source key, renamed on the target"


def test_rename_length_must_match_chosen_key() -> None:
    ov = KeyOverrides(source_unique_key_target_columns=("x", "y"))
    with pytest.raises(KeyChoiceError, match=r"has 2 column\(s\) but the source key \(id\) has 1"):
        choose_key(shape(COLS, pk("id")), ov)


def test_renamed_away_column_does_not_feed_its_old_name() -> None:
    src = shape([col("id", "int"), col("tid", "int")], pk("id"))
    ov = KeyOverrides(source_unique_key_target_columns=("tid",), target_unique_key_columns=("id",))
    with pytest.raises(
        KeyChoiceError, match="target_unique_key_columns includes column 'id', which no source"
    ):
        choose_key(src, ov)


def test_target_key_skips_target_only_column_for_covered_unique_key() -> None:
    src = shape([col("uuid", "varchar(40)"), col("n", "int")], pk("uuid"))
    tgt = shape([col("id", "bigint"), col("uuid", "varchar(40)"), col("n", "int")], pk("id"), uk("u", "uuid"))
    choice = choose_key(src, target=tgt)
    assert (choice.source_columns, choice.target_columns) == (("uuid",), ("uuid",))
    assert choice.reason == "PRIMARY KEY PRIMARY; target UNIQUE KEY u"


def test_shape_from_rows_keeps_one_shard_and_parses() -> None:
    columns = [
        ("vt_c_-80", "id", "INT", "int(11)", "NO"),
        ("vt_c_-80", "e", "varchar", "varchar(9)", "YES"),
        ("vt_c_80-", "id", "int", "int(11)", "NO"),
    ]
    indexes = [
        # vtgate may answer this query from another shard than the columns query
        ("vt_c_80-", "PRIMARY", 0, "id"),
        ("vt_c_80-", "k_e", 1, "e"),
        ("vt_c_80-", "u_ie", 0, "id"),
        ("vt_c_80-", "u_ie", 0, "e"),
        ("vt_c_-80", "PRIMARY", 0, "id"),
    ]
    s = shape_from_rows("c", "t", columns, indexes)
    assert s.columns == (Column("id", "int", "int(11)", False), Column("e", "varchar", "varchar(9)", True))
    assert s.indexes == (
        Index("PRIMARY", True, True, ("id",)),
        Index("k_e", False, False, ("e",)),
        Index("u_ie", True, False, ("id", "e")),
    )


def test_shape_from_rows_unknown_table() -> None:
    with pytest.raises(UnknownTableError, match=r"table c\.nope does not exist"):
        shape_from_rows("c", "nope", [], [])
