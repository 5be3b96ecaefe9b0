"""Which columns identify a row: the unique-key choice, following VReplication's rules.

Pure logic, no I/O: ``introspect.table_shape`` reads a table's columns and indexes, this module
decides. The rules (Vitess documentation, "Role of Table Keys in VReplication"):

* The PRIMARY KEY when there is one.
* Else the best UNIQUE KEY whose columns are all NOT NULL. A unique key covering a NULLable
  column is never eligible, whatever the data holds: MySQL lets several rows share NULL there,
  so it does not identify a row. Ranking: integer columns before character columns, smaller
  types before larger, fewer columns before more (then the index name, so the choice is stable).
* Else nothing: by default that is an error listing every key found and why it is ineligible.
  Identifying rows by all their columns is opt-in (``allow_all_columns_key=True``) and logs a
  warning, because duplicate rows then cannot be told apart and every change carries a wide key.

Overrides (``KeyOverrides``) name the key columns explicitly, on the source, on the target, and
how source key columns are renamed on the target. They are checked against both tables: every
named column must exist, and every target key column must be fed by a source column - changes
come from the source, so a target key the source cannot fill could never locate a row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess.exceptions import KeyChangedError, KeyChoiceError
from airflow_provider_vitess.utils.jsondoc import JsonDocument

log = logging.getLogger(__name__)

# Byte widths of the integer types; an integer key is the cheapest to compare, sort and store.
_INTEGER_BYTES = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "integer": 4, "bigint": 8}
# Fixed-width, non-text types: exact to compare, wider than integers or not integer-like.
_FIXED_BYTES = {
    "bit": 8, "year": 1, "date": 3, "time": 6, "datetime": 8, "timestamp": 7,
    "decimal": 16, "numeric": 16, "float": 4, "double": 8, "real": 8, "enum": 2, "set": 8,
}  # fmt: skip
_CHARACTER = {"char", "varchar", "binary", "varbinary"}
# Classes in preference order; the worst column of a key decides the key's class.
_INTEGER, _FIXED, _CHARACTER_CLASS, _LARGE = 0, 1, 2, 3
_LARGE_BYTES = 65_535
_LENGTH = re.compile(r"\((\d+)")


@dataclass(frozen=True)
class Column:
    """One column as information_schema describes it."""

    name: str
    data_type: str  # "int", "varchar", ... (information_schema.columns.data_type)
    column_type: str  # "int(11) unsigned", "varchar(64)", ... (carries the declared length)
    nullable: bool


@dataclass(frozen=True)
class Index:
    """One index; ``columns`` in index order."""

    name: str
    unique: bool
    primary: bool
    columns: tuple[str, ...]


@dataclass(frozen=True)
class TableShape:
    """A table's columns (ordinal order) and indexes. ``keyspace`` only makes messages precise."""

    table: str
    columns: tuple[Column, ...]
    indexes: tuple[Index, ...] = ()
    keyspace: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.keyspace}.{self.table}" if self.keyspace else self.table

    def column(self, name: str) -> Column | None:
        """The column called ``name``; MySQL column names are case-insensitive."""
        wanted = name.lower()
        return next((c for c in self.columns if c.name.lower() == wanted), None)

    def spelling(
        self, names: Sequence[str], what: str, error: type[Exception] = KeyChoiceError, remedy: str = ""
    ) -> tuple[str, ...]:
        """The table's own spelling of ``names``; a missing column raises ``error`` naming it,
        ``what`` named them and the table's columns (and ``remedy``)."""
        spelt = []
        for name in names:
            column = self.column(name)
            if column is None:
                raise error(
                    f"{what} names column {name!r}, which table {self.qualified_name} does not have "
                    f"(columns: {', '.join(c.name for c in self.columns)}){remedy}"
                )
            spelt.append(column.name)
        return tuple(spelt)


def _names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Accepts Vitess's comma-separated text as well as a list."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(p).strip() for p in parts if str(p).strip())


@dataclass(frozen=True)
class KeyOverrides:
    """Per-table key overrides, named like VReplication's.

    ``source_unique_key_target_columns`` renames the source key columns on the target,
    positionally: the i-th source key column is called the i-th name there.
    """

    source_unique_key_columns: tuple[str, ...] = ()
    target_unique_key_columns: tuple[str, ...] = ()
    source_unique_key_target_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for attr in (
            "source_unique_key_columns",
            "target_unique_key_columns",
            "source_unique_key_target_columns",
        ):
            names = _names(getattr(self, attr))
            object.__setattr__(self, attr, names)  # normalise lists / "a,b" text to a tuple
            lowered = [n.lower() for n in names]
            dupes = sorted({n for n in lowered if lowered.count(n) > 1})
            if dupes:
                raise KeyChoiceError(f"{attr} names column(s) {', '.join(dupes)} more than once")
        src, renamed = self.source_unique_key_columns, self.source_unique_key_target_columns
        if src and renamed and len(src) != len(renamed):
            raise KeyChoiceError(
                f"source_unique_key_target_columns has {len(renamed)} column(s) but "
                f"source_unique_key_columns has {len(src)}: they pair up positionally"
            )

    @classmethod
    def from_mapping(cls, value: Mapping[str, Any] | None) -> KeyOverrides | None:
        """From a DAG's per-table dict; unknown keys are refused so a typo is not ignored."""
        if not value:
            return None
        known = {
            "source_unique_key_columns",
            "target_unique_key_columns",
            "source_unique_key_target_columns",
        }
        unknown = sorted(set(value) - known)
        if unknown:
            raise KeyChoiceError(f"unknown key override(s) {', '.join(unknown)}; known: {sorted(known)}")
        return cls(**{k: _names(v) for k, v in value.items()})

    def __bool__(self) -> bool:
        return bool(
            self.source_unique_key_columns
            or self.target_unique_key_columns
            or self.source_unique_key_target_columns
        )


@dataclass(frozen=True)
class KeyChoice(JsonDocument):
    """The recorded key of one table.

    ``source_columns`` identify (and order) rows on the source. ``target_columns`` identify rows
    on the target, in target names; ``target_from_source[i]`` is the source column that feeds
    ``target_columns[i]``. ``source_index`` is the source index used, or None (override or all
    columns). ``reason`` says in words why, for the logs and the recorded state.
    """

    table: str
    source_columns: tuple[str, ...]
    target_columns: tuple[str, ...]
    source_index: str | None
    reason: str
    target_from_source: tuple[str, ...] = field(default=())

    def columns(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """What identifies rows (source, target, and what feeds the target): two choices with
        the same columns are the same key, whatever index or reason named them."""
        return self.source_columns, self.target_columns, self.target_from_source or self.source_columns

    def describe(self) -> str:
        if self.target_columns == self.source_columns:
            return str(list(self.source_columns))
        return f"{list(self.source_columns)} (target {list(self.target_columns)})"


def reconcile_keys(
    sync_id: str,
    recorded: Mapping[str, KeyChoice],
    chosen: Mapping[str, KeyChoice],
    snapshot_of: Collection[str] = (),
) -> dict[str, KeyChoice]:
    """The key of each table for the next window: the key its Delta table was built with.

    A table being (re-)snapshotted, or not recorded yet, takes the key chosen now. Any other
    table keeps its recorded key, and a chosen key that differs from it (a new override, a new
    primary key at the source) raises :class:`KeyChangedError`: merging by another key than the
    Delta table was built with would duplicate or lose rows.
    """
    keys: dict[str, KeyChoice] = {}
    for table, choice in chosen.items():
        before = recorded.get(table)
        if before is None or table in snapshot_of:
            keys[table] = choice
        elif before.columns() != choice.columns():
            raise KeyChangedError(
                f"sync {sync_id!r} table {table!r}: its key is now {choice.describe()} ({choice.reason}), "
                f"but its Delta table was built with key {before.describe()} ({before.reason}); "
                f"re-snapshot the table to rebuild it with the new key (trigger the DAG with "
                f'{{"resnapshot_tables": ["{table}"]}}), or restore the old key'
            )
        else:
            keys[table] = before
    return keys


# ----- ranking ----------------------------------------------------------------------------------


def _column_rank(column: Column) -> tuple[int, int]:
    """(class, bytes): integers first, then other fixed-width, then character, then text/blob."""
    data_type = column.data_type.lower()
    if data_type in _INTEGER_BYTES:
        return _INTEGER, _INTEGER_BYTES[data_type]
    if data_type in _FIXED_BYTES:
        return _FIXED, _FIXED_BYTES[data_type]
    if data_type in _CHARACTER:
        match = _LENGTH.search(column.column_type)
        return _CHARACTER_CLASS, int(match.group(1)) if match else _LARGE_BYTES
    return _LARGE, _LARGE_BYTES  # text, blob, json, geometry...: slowest to compare


def _ineligibility(shape: TableShape, index: Index) -> str | None:
    """Why ``index`` cannot identify rows, or None when it can."""
    if not index.unique and not index.primary:
        return "not unique"
    missing = [c for c in index.columns if shape.column(c) is None]
    if missing:  # only a corrupt or racing introspection can produce this
        return f"covers unknown column(s) {', '.join(missing)}"
    if index.primary:
        return None
    nullable = [c for c in index.columns if shape.column(c).nullable]  # type: ignore[union-attr]
    if nullable:
        return f"column(s) {', '.join(nullable)} NULLable (several rows may hold NULL)"
    return None


def _index_rank(shape: TableShape, index: Index) -> tuple[int, int, int, int, str]:
    ranks = [_column_rank(shape.column(c)) for c in index.columns]  # type: ignore[arg-type]
    return (
        0 if index.primary else 1,
        max(r[0] for r in ranks),
        sum(r[1] for r in ranks),
        len(ranks),
        index.name.lower(),
    )


def _describe(index: Index) -> str:
    kind = "PRIMARY KEY" if index.primary else "UNIQUE KEY" if index.unique else "KEY"
    return f"{kind} {index.name} ({', '.join(index.columns)})"


def _ranked_keys(shape: TableShape) -> list[Index]:
    """Eligible keys, best first: the PRIMARY KEY, then non-NULLable UNIQUE KEYs by rank."""
    eligible = [i for i in shape.indexes if _ineligibility(shape, i) is None]
    return sorted(eligible, key=lambda i: _index_rank(shape, i))


def best_key(shape: TableShape) -> Index | None:
    """The PRIMARY KEY, else the best-ranked non-NULLable UNIQUE KEY, else None."""
    ranked = _ranked_keys(shape)
    return ranked[0] if ranked else None


def explain_no_key(shape: TableShape) -> str:
    """Every key found on the table and why it cannot identify rows."""
    found = [i for i in shape.indexes if i.unique or i.primary]
    if not found:
        return f"table {shape.qualified_name} has no PRIMARY KEY and no UNIQUE KEY"
    details = "; ".join(f"{_describe(i)}: {_ineligibility(shape, i)}" for i in found)
    primary = "" if any(i.primary for i in found) else "no PRIMARY KEY; "
    return f"table {shape.qualified_name} has no eligible unique key: {primary}{details}"


# ----- the choice -------------------------------------------------------------------------------


def _source_key(
    shape: TableShape, overrides: KeyOverrides, allow_all_columns_key: bool
) -> tuple[tuple[str, ...], str | None, str]:
    if overrides.source_unique_key_columns:
        cols = shape.spelling(overrides.source_unique_key_columns, "source_unique_key_columns")
        nullable = [c for c in cols if shape.column(c).nullable]  # type: ignore[union-attr]
        if nullable:  # the user's call, but say it: rows with NULL there cannot be told apart
            log.warning(
                "table %s: source_unique_key_columns includes NULLable column(s) %s",
                shape.qualified_name,
                ", ".join(nullable),
            )
        return cols, None, "source_unique_key_columns override"
    index = best_key(shape)
    if index is not None:
        cols = shape.spelling(index.columns, f"index {index.name}")
        kind = "PRIMARY KEY" if index.primary else "best non-NULLable UNIQUE KEY"
        return cols, index.name, f"{kind} {index.name}"
    why = explain_no_key(shape)
    if not allow_all_columns_key:
        raise KeyChoiceError(
            f"{why}. Set source_unique_key_columns for this table, add a PRIMARY KEY or a "
            "UNIQUE KEY on NOT NULL columns, or pass allow_all_columns_key=True to identify rows "
            "by all their columns"
        )
    log.warning(
        "%s; identifying its rows by ALL columns (allow_all_columns_key): identical rows cannot "
        "be told apart and every change carries every column as its key",
        why,
    )
    return tuple(c.name for c in shape.columns), None, "all columns (no eligible unique key)"


def choose_key(
    shape: TableShape,
    overrides: KeyOverrides | None = None,
    *,
    target: TableShape | None = None,
    allow_all_columns_key: bool = False,
) -> KeyChoice:
    """The key of ``shape`` (the source), and of ``target`` when the target table is known.

    Without ``target`` the target key is the source key, renamed by
    ``source_unique_key_target_columns`` or replaced by ``target_unique_key_columns``. With it,
    the target key is the override, else the target's own PRIMARY KEY / best UNIQUE KEY, else
    the (renamed) source key; every target column named anywhere must exist on the target.
    """
    ov = overrides or KeyOverrides()
    source_cols, source_index, reason = _source_key(shape, ov, allow_all_columns_key)

    renamed = ov.source_unique_key_target_columns
    if renamed and len(renamed) != len(source_cols):
        raise KeyChoiceError(
            f"table {shape.qualified_name}: source_unique_key_target_columns has {len(renamed)} "
            f"column(s) but the source key ({', '.join(source_cols)}) has {len(source_cols)}"
        )
    if target is not None and renamed:
        renamed = target.spelling(renamed, "source_unique_key_target_columns")
    # target name (lower) -> source column, for the key columns the user renamed
    feeds = {t.lower(): s for s, t in zip(source_cols, renamed, strict=False)}
    renamed_away = {s.lower() for s in feeds.values()} - set(feeds)
    source_key_on_target = tuple(renamed) if renamed else source_cols

    def fed_by(name: str) -> str | None:
        """The source column feeding target column ``name``: a renamed key column, or the source
        column of the same name (unless that one was itself renamed to something else)."""
        if name.lower() in feeds:
            return feeds[name.lower()]
        column = None if name.lower() in renamed_away else shape.column(name)
        return column.name if column is not None else None

    if ov.target_unique_key_columns:
        what = "target_unique_key_columns"
        target_cols = ov.target_unique_key_columns
        if target is not None:
            target_cols = target.spelling(target_cols, what)
        target_reason = "target_unique_key_columns override"
    elif target is not None and (candidates := _ranked_keys(target)):
        # The target's best key that the source can fill; a target-only column (an AUTO_INCREMENT
        # id, say) in the best key must not hide a usable UNIQUE KEY behind it.
        covered = [i for i in candidates if all(fed_by(c) for c in i.columns)]
        target_index = covered[0] if covered else candidates[0]
        what = f"target {_describe(target_index)}"
        target_cols = target.spelling(target_index.columns, what)
        kind = "PRIMARY KEY" if target_index.primary else "UNIQUE KEY"
        target_reason = f"target {kind} {target_index.name}"
    else:
        what = "the source key on the target"
        target_cols = source_key_on_target
        if target is not None:
            target_cols = target.spelling(target_cols, what)
        target_reason = "same key on the target" if not renamed else "source key, renamed on the target"

    from_source = []
    for name in target_cols:
        source_name = fed_by(name)
        if source_name is None:
            raise KeyChoiceError(
                f"table {shape.qualified_name}: {what} includes column {name!r}, which no source "
                f"column feeds (source columns: {', '.join(c.name for c in shape.columns)}); the "
                "target key must be covered by source columns - rename with "
                "source_unique_key_target_columns or choose target_unique_key_columns"
            )
        from_source.append(source_name)

    choice = KeyChoice(
        table=shape.table,
        source_columns=source_cols,
        target_columns=tuple(target_cols),
        source_index=source_index,
        reason=f"{reason}; {target_reason}",
        target_from_source=tuple(from_source),
    )
    log.info(
        "table %s: key %s -> target %s (%s)",
        shape.qualified_name,
        ", ".join(choice.source_columns),
        ", ".join(choice.target_columns),
        choice.reason,
    )
    return choice
