"""The one ``MERGE INTO`` builder every target mode's statement comes from.

A statement is the target table (``t``, as the table format names it in SQL: Delta's
``delta.`path```), a temporary view of the window's rows (``s``),
a join condition and its ``WHEN`` clauses, every identifier quoted (:func:`.delta_sql.q`): a
column name is data, never SQL. Pure strings, no session: the same statement runs on a classic
session and over Spark Connect (:func:`.apply.run_merge` runs it as one commit carrying the
window's transaction id).

:func:`keyed` is the statement of a table with one row per key (a mirror, with or without
metadata columns, and ``soft_delete``); ``history``'s is its own (:func:`.history.statement`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import partial
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.window_rows import DELETE, OP


class Then(str, enum.Enum):
    DELETE = "DELETE"
    UPDATE = "UPDATE SET"
    INSERT = "INSERT"


@dataclass(frozen=True)
class When:
    """One ``WHEN [NOT] MATCHED [AND condition] THEN ...`` clause. ``values``: (target column,
    SQL expression over ``s`` and ``t``) for an UPDATE SET or an INSERT, in order."""

    matched: bool
    then: Then
    condition: str | None = None
    values: Sequence[tuple[str, str]] = ()

    def render(self) -> str:
        head = "WHEN MATCHED" if self.matched else "WHEN NOT MATCHED"
        if self.condition is not None:
            head += f" AND {self.condition}"
        if self.then is Then.DELETE:
            return f"{head} THEN DELETE"
        if self.then is Then.UPDATE:
            return f"{head} THEN UPDATE SET " + ", ".join(f"t.{q(n)} = {v}" for n, v in self.values)
        names = ", ".join(q(n) for n, _ in self.values)
        return f"{head} THEN INSERT ({names}) VALUES ({', '.join(v for _, v in self.values)})"


def merge_into(target: str, view: str, on: str, clauses: Sequence[When]) -> str:
    """``MERGE INTO`` the table ``target`` (its reference in SQL, the format's) from the view
    ``view`` on ``on``."""
    head = f"MERGE INTO {target} AS t USING {q(view)} AS s ON {on}"
    return " ".join([head, *(c.render() for c in clauses)])


def keys_match(keys: Sequence[str]) -> str:
    """The join on the key columns; ``<=>``: a NULL key part matches a NULL (a nullable unique key)."""
    return " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in keys)


def pruned(on: str, prune: str | None) -> str:
    """``on`` and the key ranges of the window (:func:`.apply.prune_condition`), if any."""
    return on if prune is None else f"({on}) AND ({prune})"


def casts(schema: T.StructType) -> dict[str, str]:
    """Each column of ``schema`` as the source's value cast to the table's type."""
    return {f.name: f"CAST(s.{q(f.name)} AS {f.dataType.simpleString()})" for f in schema.fields}


def keyed(
    target: str,
    view: str,
    keys: Sequence[str],
    schema: T.StructType,
    meta: Sequence[str],
    keep: Sequence[str],
    prune: str | None,
    table: str,
    soft_delete: bool = False,
) -> str:
    """One row per key: a delete deletes the key's row (``soft_delete``: flags it, the data kept,
    and a key the table lacks becomes a flagged row with its key), an upsert updates or inserts
    it. ``schema``: the table's data columns after the window's evolution; ``meta``: the
    metadata columns (none for a plain mirror), set from the source as they are; ``keep``: the
    columns a partial row image left out (:mod:`.partial`)."""
    typed = {f.name: f.dataType.simpleString() for f in schema.fields}
    values = casts(schema)
    is_delete = f"s.{q(OP)} = '{DELETE}'"
    set_meta = [(m, f"s.{q(m)}") for m in meta]
    update = [*((n, partial.set_value(n, v, keep)) for n, v in values.items()), *set_meta]
    insert = [*((n, partial.insert_value(n, v, typed[n], keep, table)) for n, v in values.items()), *set_meta]
    clauses = [
        When(True, Then.UPDATE, is_delete, set_meta) if soft_delete else When(True, Then.DELETE, is_delete),
        When(True, Then.UPDATE, f"NOT ({is_delete})", update),
        When(False, Then.INSERT, f"NOT ({is_delete})", insert),
    ]
    if soft_delete:  # a key Delta does not hold, deleted: a flagged row with its key
        clauses.append(When(False, Then.INSERT, is_delete, [*values.items(), *set_meta]))
    return merge_into(target, view, pruned(keys_match(keys), prune), clauses)
