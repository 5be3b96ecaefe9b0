"""Key choice on real tables created through vtgate: the VReplication documentation's cases.

Each case is a source and a target table in ``commerce`` (unsharded); both are introspected
through vtgate and ``choose_key`` must pick the documented columns or refuse with a clear error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy

from airflow_provider_vitess.exceptions import KeyChoiceError, UnknownTableError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.keys import Column, Index, KeyOverrides, choose_key, table_shape
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

# case -> (source DDL body, target DDL body)
CASES = {
    "same_pk": (
        "id INT NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
        "id INT NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
    ),
    "subset_pk": (  # the target key is a subset of the source's
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id, uuid)",
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
    ),
    "superset_pk": (  # the target key is a superset of the source's
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id, uuid)",
    ),
    "different_pks": (
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (uuid)",
        "id INT NOT NULL, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
    ),
    "mixed_keys": (  # no PK on the source; the target has a PK and a UNIQUE KEY
        "uuid VARCHAR(40) NOT NULL, id INT NOT NULL, name VARCHAR(40), UNIQUE KEY uuid_idx (uuid)",
        "uuid VARCHAR(40) NOT NULL, id INT NOT NULL, name VARCHAR(40), PRIMARY KEY (id), "
        "UNIQUE KEY uuid_idx (uuid)",
    ),
    "ranked_uks": (  # no PK: the integer key wins over the character one and the wider int one
        "code CHAR(8) NOT NULL, big BIGINT NOT NULL, small SMALLINT UNSIGNED NOT NULL, note TEXT, "
        "UNIQUE KEY u_code (code), UNIQUE KEY u_big (big), UNIQUE KEY u_small (small)",
        "code CHAR(8) NOT NULL, big BIGINT NOT NULL, small SMALLINT UNSIGNED NOT NULL, note TEXT",
    ),
    "nullable": (  # invalid: the only unique key covers a NULLable column
        "id INT, name VARCHAR(40), UNIQUE KEY id_idx (id)",
        "id INT, name VARCHAR(40), UNIQUE KEY id_idx (id)",
    ),
    "missing_columns": (  # invalid: the target key column does not exist on the source
        "uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (uuid)",
        "id INT NOT NULL AUTO_INCREMENT, uuid VARCHAR(40) NOT NULL, name VARCHAR(40), PRIMARY KEY (id)",
    ),
    "renamed": (
        "id INT NOT NULL, region CHAR(2) NOT NULL, name VARCHAR(40), PRIMARY KEY (region, id)",
        "customer_id INT NOT NULL, region_code CHAR(2) NOT NULL, name VARCHAR(40), "
        "PRIMARY KEY (region_code, customer_id)",
    ),
}


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    """A hook on commerce with every case's source and target table, dropped afterwards."""
    name, value = connection_uri_env("vitess_keys", vitess)
    os.environ[name] = value
    hook = VitessHook("vitess_keys")
    tables = [
        (f"keys_{case}_{side}", body)
        for case, pair in CASES.items()
        for side, body in zip("st", pair, strict=True)
    ]
    with hook.connect_sql() as conn:
        for table, body in tables:  # DDL autocommits; commit() just ends SQLAlchemy's transaction
            conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{table}"))
            conn.execute(sqlalchemy.text(f"CREATE TABLE commerce.{table} ({body})"))
        conn.commit()
    yield hook
    with hook.connect_sql() as conn:
        for table, _ in tables:
            conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{table}"))
        conn.commit()
    hook.close()


def choose(hook: VitessHook, case: str, overrides: KeyOverrides | None = None) -> tuple[tuple[str, ...], ...]:
    source = table_shape(hook, "commerce", f"keys_{case}_s")
    target = table_shape(hook, "commerce", f"keys_{case}_t")
    choice = choose_key(source, overrides, target=target)
    assert choice.table == f"keys_{case}_s"
    return choice.source_columns, choice.target_columns, choice.target_from_source


def test_introspection_reads_columns_and_indexes(hook: VitessHook) -> None:
    shape = table_shape(hook, "commerce", "keys_ranked_uks_s")
    assert shape.qualified_name == "commerce.keys_ranked_uks_s"
    assert shape.columns == (
        Column("code", "char", "char(8)", False),
        Column("big", "bigint", "bigint(20)", False),
        Column("small", "smallint", "smallint(5) unsigned", False),
        Column("note", "text", "text", True),
    )
    assert sorted(shape.indexes, key=lambda i: i.name) == [
        Index("u_big", True, False, ("big",)),
        Index("u_code", True, False, ("code",)),
        Index("u_small", True, False, ("small",)),
    ]


def test_sharded_keyspace(hook: VitessHook) -> None:
    """customer is sharded: vtgate may answer the two information_schema queries from different
    shards, which must not lose the indexes."""
    shape = table_shape(hook, "customer", "customer")
    assert [c.name for c in shape.columns] == ["customer_id", "email"]
    assert shape.indexes == (Index("PRIMARY", True, True, ("customer_id",)),)
    assert choose_key(shape).source_columns == ("customer_id",)


def test_unknown_table(hook: VitessHook) -> None:
    with pytest.raises(UnknownTableError, match=r"table commerce\.keys_nope does not exist"):
        table_shape(hook, "commerce", "keys_nope")


@pytest.mark.parametrize(
    ("case", "source", "target"),
    [
        ("same_pk", ("id",), ("id",)),
        ("subset_pk", ("id", "uuid"), ("id",)),
        ("superset_pk", ("id",), ("id", "uuid")),
        ("different_pks", ("uuid",), ("id",)),
        ("mixed_keys", ("uuid",), ("id",)),
        ("ranked_uks", ("small",), ("small",)),
    ],
)
def test_documented_valid_cases(
    hook: VitessHook, case: str, source: tuple[str, ...], target: tuple[str, ...]
) -> None:
    assert choose(hook, case) == (source, target, target)


def test_mixed_keys_target_unique_key_override(hook: VitessHook) -> None:
    overrides = KeyOverrides(target_unique_key_columns=("uuid",))
    assert choose(hook, "mixed_keys", overrides) == (("uuid",), ("uuid",), ("uuid",))


def test_nullable_unique_key_is_not_eligible(hook: VitessHook) -> None:
    with pytest.raises(KeyChoiceError) as err:
        choose(hook, "nullable")
    assert str(err.value).startswith(
        "table commerce.keys_nullable_s has no eligible unique key: no PRIMARY KEY; "
        "UNIQUE KEY id_idx (id): column(s) id NULLable (several rows may hold NULL). "
    )


def test_nullable_all_columns_opt_in(hook: VitessHook) -> None:
    source = table_shape(hook, "commerce", "keys_nullable_s")
    target = table_shape(hook, "commerce", "keys_nullable_t")
    choice = choose_key(source, target=target, allow_all_columns_key=True)
    # the target's own key is NULLable too, so the target is matched on the same columns
    assert (choice.source_columns, choice.target_columns) == (("id", "name"), ("id", "name"))


def test_missing_target_key_column_on_source(hook: VitessHook) -> None:
    with pytest.raises(KeyChoiceError) as err:
        choose(hook, "missing_columns")
    assert str(err.value).startswith(
        "table commerce.keys_missing_columns_s: target PRIMARY KEY PRIMARY (id) includes column 'id', "
        "which no source column feeds (source columns: uuid, name)"
    )


def test_renamed_key_columns(hook: VitessHook) -> None:
    overrides = KeyOverrides(source_unique_key_target_columns=("region_code", "customer_id"))
    assert choose(hook, "renamed", overrides) == (
        ("region", "id"),
        ("region_code", "customer_id"),
        ("region", "id"),
    )


def test_renamed_without_override_is_refused(hook: VitessHook) -> None:
    with pytest.raises(KeyChoiceError, match="includes column 'region_code', which no source column feeds"):
        choose(hook, "renamed")


def test_override_naming_missing_column(hook: VitessHook) -> None:
    with pytest.raises(KeyChoiceError) as err:
        choose(hook, "same_pk", KeyOverrides(source_unique_key_columns=("id", "nope")))
    assert str(err.value) == (
        "source_unique_key_columns names column 'nope', which table commerce.keys_same_pk_s does not "
        "have (columns: id, name)"
    )
