"""The staged window's manifest: what a window holds, as a typed document, and its loading.

A window without a manifest does not exist (docs/design.md): the stager writes its Parquet parts
first and the manifest last, atomically, so a reader either finds no manifest (nothing to
merge) or a complete one. Every part is listed with its size, row count and sha256, so
:func:`~.parts_check.verify` can tell a complete window from a damaged one before anything is
merged.

The layout of a window's files is in :mod:`airflow_provider_vitess.staging.files`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import pyarrow as pa
from pydantic import AfterValidator, Field, PlainSerializer, PlainValidator

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.exceptions import CorruptStagedDataError, StagingError, UnnamedColumnsError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.files import MANIFEST_NAME, open_location, window_dir
from airflow_provider_vitess.utils.jsondoc import JsonDocument, adapter
from airflow_provider_vitess.vgtid import Vgtid

FORMAT_VERSION = 1
# A snapshot window's stats: its plan time, whole seconds since the epoch (:attr:`Manifest.copy_started_at`).
COPY_STARTED_AT = "copy_started_at"
# A snapshot window's stats: the tables it re-copies because their column choice changed.
COLUMN_CHOICE_CHANGED = "column_choice_changed"

# How vttablet names the columns of a binlog row it cannot match to the table's schema.
_POSITIONAL = re.compile(r"@\d+")


# -- schema records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSchema:
    """One source column as staged: enough of ``query.Field`` to rebuild its Arrow type."""

    name: str
    type: str  # query.Type name
    column_type: str
    nullable: bool
    arrow: str
    charset: int = 0
    decimals: int = 0
    column_length: int = 0

    @classmethod
    def from_field(cls, f: query_pb2.Field) -> ColumnSchema:
        return cls(
            name=f.name,
            type=arrow_types.type_name(f.type),
            column_type=f.column_type,
            nullable=arrow_types.is_nullable(f),
            arrow=str(arrow_types.arrow_type(f)),
            charset=f.charset,
            decimals=f.decimals,
            column_length=f.column_length,
        )

    def to_field(self) -> query_pb2.Field:
        return query_pb2.Field(
            name=self.name,
            type=self.type,  # the enum accepts its value names
            column_type=self.column_type,
            charset=self.charset,
            decimals=self.decimals,
            column_length=self.column_length,
            flags=0 if self.nullable else arrow_types.NOT_NULL_FLAG,
        )


@dataclass(frozen=True)
class TableSchema(JsonDocument):
    """A table version: its columns and the key columns whose before image is staged."""

    columns: tuple[ColumnSchema, ...]
    key_columns: tuple[str, ...]
    strict = True

    @classmethod
    def from_fields(
        cls, table: str, fields: Sequence[query_pb2.Field], key_columns: Sequence[str] | None
    ) -> TableSchema:
        columns = tuple(ColumnSchema.from_field(f) for f in fields)
        names = [c.name for c in columns]
        if names and all(_POSITIONAL.fullmatch(n) for n in names):
            raise UnnamedColumnsError(
                f"table {table!r}: vtgate sent its rows with columns named {names}: they were logged "
                "before a DDL that changed the table's column types, and vttablet has no schema "
                "history to name them (its --track_schema_versions is off). Nothing was staged. "
                f'Remedy: re-snapshot the table (trigger the DAG with {{"resnapshot_tables": ["{table}"]}}): '
                "its changes from before the copy are then skipped"
            )
        keys = tuple(key_columns) if key_columns else tuple(names)
        missing = [k for k in keys if k not in names]
        if missing:
            raise StagingError(f"table {table!r}: key column(s) {missing} are not among its columns {names}")
        return cls(columns, keys)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def fields(self) -> list[query_pb2.Field]:
        return [c.to_field() for c in self.columns]

    def arrow_schema(self, table: str) -> pa.Schema:
        return arrow_types.staged_schema(table, self.fields(), self.key_columns)

    def to_json(self) -> str:
        """Canonical text: equal schemas give equal texts (used as the schema's identity)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class PartInfo(JsonDocument):
    """One closed Parquet part; JSON-able (:meth:`to_dict`) for the caller's checkpoint store."""

    table: str
    path: str  # relative to the window directory: "{table}/part-00001.parquet"
    rows: int
    bytes: int
    sha256: str
    schema_json: str
    op_counts: Mapping[str, int] = field(default_factory=dict)
    keyspaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class DdlRecord(JsonDocument):
    keyspace: str
    shard: str
    statement: str
    commit_ts: int


@dataclass(frozen=True)
class TableManifest:
    """A table's share of the window. ``parts[i]`` was written with ``schemas[part_schema[i]]``."""

    table: str
    keyspaces: tuple[str, ...]
    key_columns: tuple[str, ...]
    schemas: tuple[TableSchema, ...]
    parts: tuple[PartInfo, ...]
    op_counts: Mapping[str, int]

    @property
    def keyspace(self) -> str:
        """The first keyspace the table came from (several only across a MoveTables cut-over)."""
        return self.keyspaces[0] if self.keyspaces else ""

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def schema(self) -> TableSchema:
        """The latest schema."""
        return self.schemas[-1]

    def schema_of(self, part: PartInfo) -> TableSchema:
        """The schema ``part`` was written with."""
        return next(s for s in self.schemas if s.to_json() == part.schema_json)


# A window read by shard groups: its stat naming, per group, the shards it read and the source
# second its read reached (``staging/group_manifest.combine``; ``merge/job/conflicts.covered``).
GROUP_READS = "group_reads"


@dataclass(frozen=True)
class Manifest:
    """A staged window. ``location``/``storage_options`` say where it was read from or written
    to; they are not part of the JSON (a window can be moved) nor of equality."""

    sync_id: str
    window_seq: int
    start_vgtid: Vgtid
    stop_vgtid: Vgtid | None
    end_vgtid: Vgtid
    tables: Mapping[str, TableManifest]
    ddls: tuple[DdlRecord, ...] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    location: str = field(default="", compare=False)
    storage_options: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    @property
    def source_ts_max(self) -> int | None:
        """The newest source time (seconds, the tablets' clocks) the window's read saw, if
        recorded (``WindowReader``'s ``source_ts_max`` stat; see ``merge/context.py``)."""
        value = self.stats.get("source_ts_max")
        return int(value) if value else None

    @property
    def copy_started_at(self) -> int | None:
        """A snapshot window's plan time (seconds, the checkpoint store's clock), if recorded
        (``COPY_STARTED_AT``): every change a sync merged before a re-snapshot committed before
        it, and every change read after the copy after it; a re-snapshot of a ``history`` or
        ``soft_delete`` table dates what its copy tells at this second (``merge/job/resnapshot``)."""
        value = self.stats.get(COPY_STARTED_AT)
        return int(value) if value else None

    @property
    def path(self) -> str:
        """Where the manifest file is, spelled as the location was (a path or a URL)."""
        return f"{window_dir(self.location, self.sync_id, self.window_seq)}/{MANIFEST_NAME}"

    @property
    def window_name(self) -> str:
        return f"{self.sync_id}/window={self.window_seq:010d}"

    def window_path(self) -> tuple[Any, str]:
        fs, root = open_location(self.location, self.storage_options)
        return fs, window_dir(root, self.sync_id, self.window_seq)

    def to_json(self) -> str:
        return _ManifestFile.of(self).to_json()

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "manifest") -> Manifest:
        """Parse; any problem is a :class:`CorruptStagedDataError` naming ``source`` and the field."""
        listed = _ManifestFile.from_json(text, source=source)
        try:
            return listed.manifest()
        except ValueError as exc:
            raise CorruptStagedDataError(f"{source} is not a valid {listed.document}: {exc}") from None


# -- the manifest file -------------------------------------------------------------------------
# The file lists each table under its name and each part in its table, its schema by index (a
# window's parts share a few schemas); in memory a part carries its table and schema text.


def _vgtid(value: object) -> Vgtid:
    return value if isinstance(value, Vgtid) else Vgtid.from_json(json.dumps(value))


def _known_version(version: int) -> int:
    if version != FORMAT_VERSION:
        raise ValueError(f"format_version {version} is not {FORMAT_VERSION} (written by a newer provider?)")
    return version


_VgtidJson = Annotated[
    Vgtid, PlainValidator(_vgtid), PlainSerializer(lambda v: json.loads(v.to_json()), return_type=Any)
]


@dataclass(frozen=True)
class _ListedPart:
    path: str
    rows: int
    bytes: int
    sha256: str
    schema: int  # index into the table's schemas
    op_counts: dict[str, int]
    keyspaces: tuple[str, ...]


@dataclass(frozen=True)
class _ListedTable:
    keyspaces: tuple[str, ...]
    key_columns: tuple[str, ...]
    op_counts: dict[str, int]
    schemas: tuple[TableSchema, ...]
    parts: tuple[_ListedPart, ...]

    @classmethod
    def of(cls, tm: TableManifest) -> _ListedTable:
        index = {s.to_json(): i for i, s in enumerate(tm.schemas)}
        parts = tuple(
            _ListedPart(
                p.path, p.rows, p.bytes, p.sha256, index[p.schema_json], dict(p.op_counts), p.keyspaces
            )
            for p in tm.parts
        )
        return cls(tm.keyspaces, tm.key_columns, dict(tm.op_counts), tm.schemas, parts)

    def table(self, name: str) -> TableManifest:
        texts = [s.to_json() for s in self.schemas]
        parts = []
        for i, p in enumerate(self.parts):
            where = f"tables.{name}.parts.{i}"
            if not p.path.startswith(f"{name}/") or ".." in p.path.split("/"):
                raise ValueError(f"{where}.path: {p.path!r} is not inside the table's directory")
            if not 0 <= p.schema < len(texts):
                raise ValueError(f"{where}.schema: {p.schema} is not one of the table's {len(texts)} schemas")
            parts.append(
                PartInfo(name, p.path, p.rows, p.bytes, p.sha256, texts[p.schema], p.op_counts, p.keyspaces)
            )
        return TableManifest(
            name, self.keyspaces, self.key_columns, self.schemas, tuple(parts), self.op_counts
        )


@dataclass(frozen=True)
class _ManifestFile(JsonDocument):
    format_version: Annotated[int, AfterValidator(_known_version)]
    sync_id: str
    window_seq: int
    start_vgtid: _VgtidJson
    stop_vgtid: Annotated[_VgtidJson | None, Field(default=None)]
    end_vgtid: _VgtidJson
    created_at: str
    tables: dict[str, _ListedTable]
    ddls: tuple[DdlRecord, ...]
    stats: dict[str, Any]
    document = "staging manifest"
    error = CorruptStagedDataError
    strict = True

    @classmethod
    def of(cls, m: Manifest) -> _ManifestFile:
        tables = {name: _ListedTable.of(t) for name, t in m.tables.items()}
        return cls(
            m.format_version, m.sync_id, m.window_seq, m.start_vgtid, m.stop_vgtid, m.end_vgtid,
            m.created_at, tables, m.ddls, dict(m.stats),
        )  # fmt: skip

    def to_json(self) -> str:
        return adapter(_ManifestFile).dump_json(self, indent=1).decode()

    def manifest(self) -> Manifest:
        tables = {name: t.table(name) for name, t in self.tables.items()}
        return Manifest(
            self.sync_id, self.window_seq, self.start_vgtid, self.stop_vgtid, self.end_vgtid, tables,
            self.ddls, self.stats, self.created_at, self.format_version,
        )  # fmt: skip


# -- reading -----------------------------------------------------------------------------------


def load_manifest(
    location: str,
    sync_id: str,
    window_seq: int,
    *,
    storage_options: Mapping[str, Any] | None = None,
    name: str = MANIFEST_NAME,
) -> Manifest | None:
    """The window's manifest (or, by ``name``, a shard group's), or None when it has none (the
    window was never staged)."""
    fs, root = open_location(location, storage_options)
    path = f"{window_dir(root, sync_id, window_seq)}/{name}"
    try:
        text = fs.cat_file(path)
    except FileNotFoundError:
        return None
    manifest = Manifest.from_json(text, source=f"manifest {path}")
    if (manifest.sync_id, manifest.window_seq) != (sync_id, window_seq):
        raise CorruptStagedDataError(
            f"manifest {path} is for sync {manifest.sync_id!r} window {manifest.window_seq}, "
            f"not sync {sync_id!r} window {window_seq}"
        )
    return replace(manifest, location=location, storage_options=storage_options)
