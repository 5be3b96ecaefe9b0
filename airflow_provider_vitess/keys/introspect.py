"""Reads a table's columns and indexes through vtgate, for ``rules.choose_key``.

vtgate routes ``information_schema`` queries filtered on ``table_schema = '<keyspace>'`` to one
shard of that keyspace and hands back the underlying MySQL database name (``vt_commerce_0``,
``vt_customer_-80``) in ``table_schema``. So the keyspace is bound as the filter, and the
returned schema name only serves to keep the rows of a single database per query: every shard
has the same schema, and two queries may well be answered by different shards. A reply that
says the keyspace name itself (older or future vtgates) works the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy

from airflow_provider_vitess.exceptions import UnknownTableError
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.keys.rules import Column, Index, TableShape

_COLUMNS = sqlalchemy.text(
    "SELECT table_schema, column_name, data_type, column_type, is_nullable "
    "FROM information_schema.columns "
    "WHERE table_schema = :keyspace AND table_name = :table "
    "ORDER BY table_schema, ordinal_position"
)
_INDEXES = sqlalchemy.text(
    "SELECT table_schema, index_name, non_unique, column_name "
    "FROM information_schema.statistics "
    "WHERE table_schema = :keyspace AND table_name = :table "
    "ORDER BY table_schema, index_name, seq_in_index"
)


def table_shape(hook: VitessClient, keyspace: str, table: str) -> TableShape:
    """Columns (ordinal order) and indexes of ``keyspace.table``, read through vtgate."""
    params = {"keyspace": keyspace, "table": table}
    with hook.connect_sql() as conn:
        column_rows = [tuple(r) for r in conn.execute(_COLUMNS, params)]
        index_rows = [tuple(r) for r in conn.execute(_INDEXES, params)]
        conn.rollback()  # read-only; do not leave a transaction open on vtgate
    return shape_from_rows(keyspace, table, column_rows, index_rows)


def shape_from_rows(
    keyspace: str,
    table: str,
    column_rows: Sequence[Sequence[Any]],
    index_rows: Sequence[Sequence[Any]],
) -> TableShape:
    """Builds the shape from information_schema rows (split out so it is testable without I/O)."""
    if not column_rows:
        raise UnknownTableError(f"table {keyspace}.{table} does not exist (no columns in information_schema)")
    # Several shards may answer: keep one database's rows so nothing appears twice. Each query is
    # routed on its own - in a sharded keyspace the columns may come from shard -80 and the
    # indexes from 80- - so each result keeps its own first database, not a shared one.
    schema = column_rows[0][0]
    index_schema = index_rows[0][0] if index_rows else None
    columns = tuple(
        Column(
            name=str(name),
            data_type=str(data_type).lower(),
            column_type=str(column_type).lower(),
            nullable=str(is_nullable).upper() == "YES",
        )
        for row_schema, name, data_type, column_type, is_nullable in column_rows
        if row_schema == schema
    )
    index_columns: dict[str, list[str]] = defaultdict(list)
    unique: dict[str, bool] = {}
    for row_schema, index_name, non_unique, column_name in index_rows:
        if row_schema != index_schema or column_name is None:  # functional key parts have no column
            continue
        index_columns[str(index_name)].append(str(column_name))
        unique[str(index_name)] = int(non_unique) == 0
    indexes = tuple(
        Index(name=name, unique=unique[name], primary=name.upper() == "PRIMARY", columns=tuple(cols))
        for name, cols in index_columns.items()
    )
    return TableShape(table=table, columns=columns, indexes=indexes, keyspace=keyspace)
