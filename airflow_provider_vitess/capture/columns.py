"""Column control at the source: which columns of a table leave vtgate, and which are hashed.

Per table, ``include_columns`` (only these) or ``exclude_columns`` (all but these), never both;
``hash_columns`` are staged as a salted SHA-256 (:mod:`airflow_provider_vitess.staging.hashing`).
The chosen columns become the table's VStream filter rule (``select `a`, `b` from `t```,
:func:`airflow_provider_vitess.vstream.request.table_filter`): vttablet projects every row onto
them, in the copy phase and in the binlog phase alike, so an excluded column never leaves the
tablet and never reaches vtgate's client, a staged file or Delta.

Pure logic: :func:`parse` checks the operator arguments (a DAG with a wrong spelling fails at
import), :func:`resolve` checks them against the table as the source shows it now and against
its key, :func:`reconcile` against what the sync recorded. Why each rule (docs/column-control.md):

* The key cannot be excluded nor hashed: the merge identifies rows by it, and the copy phase
  records the table's PRIMARY KEY values in clear in every VGTID it checkpoints (vttablet's
  last-PK), which the checkpoint store and the staged manifests keep. So the table's PRIMARY KEY
  columns are key columns here too, even under a key override.
* ``include_columns`` lists columns: one added at the source later is not among them, so it is
  never read. ``exclude_columns`` lists the others as the table has them when a run starts: a
  column added at the source joins from the next run on (a schema change like any other).
* A table's column choice is recorded with the sync (and in every window's stats) like its key;
  a change of it is refused until the table is re-snapshotted (``resnapshot_tables``): a column
  hashed or excluded from now on would otherwise stay in clear in every Delta row the later
  windows do not touch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.checkpoints.states import WINDOW_COLUMNS, WINDOW_KEYS, Window, WindowState
from airflow_provider_vitess.exceptions import ColumnChoiceError, ColumnsChangedError
from airflow_provider_vitess.keys import KeyChoice, TableShape, best_key

__all__ = ["WINDOW_COLUMNS", "ColumnChoice", "TableColumns", "parse", "reconcile", "require_salt", "resolve"]


def require_salt(hashed: bool, hash_salt_conn_id: str | None, where: str) -> None:
    """Hashed columns need a salt: without ``hash_salt_conn_id`` a hash of a small domain (a
    phone number) is reversed by trying every value. ``where`` names the setting's owner."""
    if hashed and not hash_salt_conn_id:
        raise ColumnChoiceError(
            f"{where}: hash_columns need hash_salt_conn_id, an Airflow "
            "connection whose password is the salt (a long random secret)"
        )


def _names(value: Any, what: str) -> tuple[str, ...]:
    """A list of column names (or comma-separated text, as a template renders it)."""
    if isinstance(value, str):
        parts: Iterable[Any] = value.split(",")
    elif isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
        parts = value
    else:
        raise ColumnChoiceError(f"{what} must be a list of column names, got {value!r}")
    names = tuple(str(p).strip() for p in parts if str(p).strip())
    lowered = [n.lower() for n in names]
    dupes = sorted({n for n in lowered if lowered.count(n) > 1})
    if dupes:
        raise ColumnChoiceError(f"{what} names column(s) {', '.join(dupes)} more than once")
    return names


@dataclass(frozen=True)
class TableColumns:
    """One table's column control as the DAG gives it (names as spelt there)."""

    include: tuple[str, ...] | None = None  # None: every column (less ``exclude``)
    exclude: tuple[str, ...] = ()
    hash: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """What the sync records (names lower-cased: MySQL column names ignore case)."""
        return {
            "include": None if self.include is None else sorted(n.lower() for n in self.include),
            "exclude": sorted(n.lower() for n in self.exclude),
            "hash": sorted(n.lower() for n in self.hash),
        }

    def describe(self) -> str:
        parts = []
        if self.include is not None:
            parts.append(f"include_columns {list(self.include)}")
        if self.exclude:
            parts.append(f"exclude_columns {list(self.exclude)}")
        if self.hash:
            parts.append(f"hash_columns {list(self.hash)}")
        return ", ".join(parts) or "every column, none hashed"


ALL_COLUMNS = TableColumns()


def parse(
    tables: Sequence[str],
    include_columns: Mapping[str, Any] | None = None,
    exclude_columns: Mapping[str, Any] | None = None,
    hash_columns: Mapping[str, Any] | None = None,
) -> dict[str, TableColumns]:
    """Each table's :class:`TableColumns` from the operator arguments (dicts table -> names);
    a table without any keeps every column. Checks what needs no source: known tables, not
    include and exclude for one table, a hashed column not left out."""
    given = {
        "include_columns": dict(include_columns or {}),
        "exclude_columns": dict(exclude_columns or {}),
        "hash_columns": dict(hash_columns or {}),
    }
    for what, per_table in given.items():
        unknown = sorted(set(per_table) - set(tables))
        if unknown:
            raise ColumnChoiceError(
                f"{what} names table(s) {unknown}, not among the sync's tables {sorted(tables)}"
            )
    out: dict[str, TableColumns] = {}
    for table in tables:
        include = given["include_columns"].get(table)
        exclude = given["exclude_columns"].get(table)
        if include is not None and exclude is not None:
            raise ColumnChoiceError(
                f"table {table!r} has both include_columns and exclude_columns: give one of them "
                "(include_columns: only those columns; exclude_columns: all but those)"
            )
        inc = None if include is None else _names(include, f"include_columns[{table!r}]")
        if inc is not None and not inc:
            raise ColumnChoiceError(
                f"include_columns[{table!r}] is empty: name the columns to read, or leave the table "
                "out of include_columns to read every column"
            )
        exc = () if exclude is None else _names(exclude, f"exclude_columns[{table!r}]")
        hashed = _names(given["hash_columns"].get(table, ()), f"hash_columns[{table!r}]")
        left_out = [
            h
            for h in hashed
            if h.lower() in {e.lower() for e in exc}
            or (inc is not None and h.lower() not in {i.lower() for i in inc})
        ]
        if left_out:
            raise ColumnChoiceError(
                f"table {table!r}: hash_columns {left_out} are not read (excluded, or not in "
                "include_columns): a column is either left out or hashed; name it in one list only"
            )
        choice = TableColumns(inc, exc, hashed)
        if choice != ALL_COLUMNS:
            out[table] = choice
    return out


@dataclass(frozen=True)
class ColumnChoice:
    """One table's columns resolved against the source now: what its filter selects (``None``:
    every column, ``select *``) and which of them are hashed (the table's own spelling)."""

    table: str
    select: tuple[str, ...] | None
    hashed: tuple[str, ...]
    given: TableColumns
    existing: frozenset[str] = frozenset()  # the table's columns now, lower-cased

    def same_effect(self, record: Mapping[str, Any]) -> bool:
        """``record`` (an earlier choice) chooses what the given choice does, once the names of
        columns the table no longer has are left out of it: a column dropped at the source may
        leave the lists without a re-snapshot."""
        now = self.given.record()

        def kept(names: Any) -> Any:
            return None if names is None else [n for n in names if n in self.existing]

        return all(kept(record.get(k)) == kept(now.get(k)) for k in ("include", "exclude", "hash"))

    def stats(self) -> dict[str, Any]:
        """The window's record of it: the choice given and what was selected."""
        return {**self.given.record(), "select": None if self.select is None else list(self.select)}


# What a wrong name in a column list is, and what to do about it.
_UNKNOWN_COLUMN = (
    "; fix the name in the DAG (a column dropped at the source: take it out of the list, no "
    "re-snapshot needed)"
)


def _spelt(shape: TableShape, names: Sequence[str], what: str) -> tuple[str, ...]:
    return shape.spelling(names, what, ColumnChoiceError, _UNKNOWN_COLUMN)


def key_columns(shape: TableShape, key: KeyChoice) -> dict[str, str]:
    """Lower-cased name -> why the column cannot be left out or hashed."""
    out = {c.lower(): f"a column of the key {key.describe()} ({key.reason})" for c in key.source_columns}
    for c in key.target_from_source:
        out.setdefault(c.lower(), f"it feeds the target key {list(key.target_columns)}")
    primary = next((i for i in shape.indexes if i.primary), None) or best_key(shape)
    for c in primary.columns if primary is not None else ():
        out.setdefault(
            c.lower(),
            f"a column of the table's {'PRIMARY KEY' if primary and primary.primary else 'unique key'} "
            "(the copy phase records its values in clear in every checkpointed VGTID)",
        )
    return out


def resolve(shape: TableShape, given: TableColumns, key: KeyChoice) -> ColumnChoice:
    """``given`` against the table as the source shows it now and its key: every named column
    exists, no key column is excluded or hashed. Raises :class:`ColumnChoiceError` naming the
    table, the column and the remedy."""
    where = f"table {shape.qualified_name}"
    include = None if given.include is None else _spelt(shape, given.include, f"include_columns of {where}")
    exclude = _spelt(shape, given.exclude, f"exclude_columns of {where}")
    hashed = _spelt(shape, given.hash, f"hash_columns of {where}")
    keys = key_columns(shape, key)
    if include is not None:
        chosen = {c.lower() for c in include}
        select: tuple[str, ...] | None = tuple(c.name for c in shape.columns if c.name.lower() in chosen)
        missing = [c for c in keys if c not in chosen]
        if missing:
            column = shape.column(missing[0]).name  # type: ignore[union-attr]
            raise ColumnChoiceError(
                f"{where}: include_columns leaves out column {column!r}, {keys[missing[0]]}; a key "
                f"column is always read. Add {column!r} to include_columns[{shape.table!r}], or "
                "choose another key with key_overrides (source_unique_key_columns)"
            )
    else:
        dropped = {c.lower() for c in exclude}
        select = tuple(c.name for c in shape.columns if c.name.lower() not in dropped) if exclude else None
        for name in exclude:
            if name.lower() in keys:
                raise ColumnChoiceError(
                    f"{where}: exclude_columns names column {name!r}, {keys[name.lower()]}; a key "
                    f"column is always read. Remove {name!r} from exclude_columns[{shape.table!r}], "
                    "or choose another key with key_overrides (source_unique_key_columns)"
                )
        if select is not None and not select:
            raise ColumnChoiceError(f"{where}: exclude_columns leaves no column to read")
    for name in hashed:
        if name.lower() in keys:
            raise ColumnChoiceError(
                f"{where}: hash_columns names column {name!r}, {keys[name.lower()]}; a key column "
                f"is never hashed (its clear values identify rows and reach the checkpoints). "
                f"Remove {name!r} from hash_columns[{shape.table!r}], or exclude the column from a "
                "key chosen with key_overrides (source_unique_key_columns) if the table has another"
            )
    return ColumnChoice(shape.table, select, hashed, given, frozenset(c.name.lower() for c in shape.columns))


def reconcile(
    sync_id: str,
    recorded: Mapping[str, Any],
    built: Collection[str],
    chosen: Mapping[str, ColumnChoice],
    tables: Sequence[str],
    snapshot_of: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """The column choice each table's Delta table is built with, for the next window: a table
    being (re-)snapshotted, or not built yet, takes the choice given now; any other keeps its
    recorded one, and a different choice raises :class:`ColumnsChangedError`.

    ``recorded``: the sync's record (table -> :meth:`TableColumns.record`); ``built``: the tables
    the sync recorded a key for (a table recorded before column control existed has no column
    record: it was built with every column)."""
    out: dict[str, dict[str, Any]] = {}
    for table in tables:
        choice = chosen.get(table)
        given = choice.given if choice is not None else ALL_COLUMNS
        now = given.record()
        if table in snapshot_of or table not in built:
            out[table] = now
            continue
        before = dict(recorded.get(table) or ALL_COLUMNS.record())
        if before != now and not (choice is not None and choice.same_effect(before)):
            raise ColumnsChangedError(
                f"sync {sync_id!r} table {table!r}: its column choice is now {given.describe()}, but "
                f"its Delta table was built (or its unfinished snapshot started) with "
                f"{_describe_record(before)}. A changed choice applies to a whole table or not at "
                "all (a column newly hashed or excluded would stay in clear in the rows later "
                "windows do not touch): re-snapshot the table (trigger the DAG with "
                f'{{"resnapshot_tables": ["{table}"]}}: it replaces an unfinished snapshot), '
                "or restore the previous choice"
            )
        out[table] = now
    return out


def changed_choice(
    window: Window,
    tables: Sequence[str],
    keys: Mapping[str, KeyChoice],
    chosen: Mapping[str, ColumnChoice],
    config: Mapping[str, Any],
) -> tuple[str, str] | None:
    """How the key or column choice of an unmerged snapshot window's ``tables`` differs from
    the one given now (``keys``, ``chosen``): ``("key" or "columns", what)``, or None. A STAGED
    window's choice is the one in its stats (the one its merge would use); a PLANNED one's is
    the sync's record (``config``), which a snapshot being read keeps until it is staged."""
    source = window.stats if window.state is WindowState.STAGED else {}
    key_record = dict(source.get(WINDOW_KEYS) or config.get("keys") or {})
    if window.state is WindowState.STAGED:
        # A window of a sync without column control records none: every column.
        column_record = dict(source.get(WINDOW_COLUMNS) or {})
    else:
        column_record = dict(config.get(WINDOW_COLUMNS) or {})
    for table in tables:
        before, now = key_record.get(table), keys.get(table)
        if before is not None and now is not None:
            was = KeyChoice.from_dict(before)
            if was.columns() != now.columns():
                return "key", f"table {table!r}'s key is now {now.describe()}, not {was.describe()}"
        choice = chosen.get(table)
        given = choice.given if choice is not None else ALL_COLUMNS
        record = dict(column_record.get(table) or ALL_COLUMNS.record())
        if given.record() != {k: record.get(k) for k in ("include", "exclude", "hash")} and not (
            choice is not None and choice.same_effect(record)
        ):
            old = _describe_record(record)
            return "columns", f"table {table!r}'s column choice is now {given.describe()}, not {old}"
    return None


def _describe_record(record: Mapping[str, Any]) -> str:
    parts = []
    if record.get("include") is not None:
        parts.append(f"include_columns {record['include']}")
    if record.get("exclude"):
        parts.append(f"exclude_columns {record['exclude']}")
    if record.get("hash"):
        parts.append(f"hash_columns {record['hash']}")
    return ", ".join(parts) or "every column, none hashed"


# vttablet's words when a binlog row does not match the table's schema as it knows it now.
UNPROJECTABLE = "cannot determine table columns"


def unprojectable(sync_id: str, tables: Collection[str], error: Exception) -> ColumnChoiceError:
    """The error of a read that vttablet refused because it could not put a table's rows onto
    the listed columns: rows logged before a DDL that dropped (or retyped) a column, read after
    it, by a vttablet without schema history. With ``select *`` such rows arrive with unnamed
    columns (``UnnamedColumnsError``); with a column list vttablet fails the stream itself, so
    skipping them is not possible and only a new start of the stream past the DDL helps."""
    return ColumnChoiceError(
        f"sync {sync_id!r}: vttablet cannot put rows of table(s) {sorted(tables)} (under column "
        "control) onto their listed columns: they were logged before a DDL that dropped or retyped "
        "a column, and vttablet keeps no schema history (--track_schema_versions is off). Nothing "
        "was staged. Remedy: turn on --track_schema_versions on the tablets and rerun the task, or "
        "re-snapshot every table of the sync (trigger the DAG with resnapshot_tables naming all of "
        f"them), which restarts the stream past the DDL. vttablet said: {error}"
    )
