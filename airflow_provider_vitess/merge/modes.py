"""Target modes: the shape a source table takes in Delta, and its metadata columns (pure).

* ``mirror`` (default): the source table as it is now; a deleted row is gone. Unchanged.
* ``soft_delete``: a deleted row stays, flagged (``<prefix>deleted``) with the source commit time
  of its delete (``<prefix>deleted_at``); a later insert of the key brings it back live.
* ``history`` (SCD type 2): one row per version of each key, ``<prefix>valid_from`` /
  ``<prefix>valid_to`` (source commit times), ``<prefix>current`` and ``<prefix>deleted`` (the
  version was ended by a delete).
* ``changelog``: append-only, one row per change, in the order the merge applies them.

Metadata columns (``<prefix>op``, ``<prefix>commit_ts``, ``<prefix>window_seq``,
``<prefix>synced_at``) are on by default in the three new modes and opt-in for ``mirror``. The
prefix (default ``_vitess_``) is refused when it collides with a source column.

The shape is chosen per table: a sync-wide default (``target_mode``, ``metadata_columns``,
``metadata_prefix``, ``change_data_feed``, ``table_features``) and a per-table override in
``targets[table]`` (keys ``mode``, ``metadata_columns``, ``change_data_feed``,
``table_features``).

Table features (:data:`TABLE_FEATURES`): Delta features a reader must know to read the table at
all. None by default, so every table the merge creates is read by any Delta reader (delta-rs and
Polars, DuckDB, Spark 3.5 with Delta 3; column mapping only where a column name needs it).
``type_widening`` widens a column in place when the source widens it (else the merge rewrites
the table with the wider type); ``deletion_vectors`` lets a MERGE mark changed rows instead of
rewriting their files. Each is turned on when a table is created, or when the merge first needs
it on a table that exists, and never otherwise: a table keeps the features it has.

The Delta table records its mode and prefix in its own properties (:data:`MODE_PROPERTY`,
:data:`PREFIX_PROPERTY`), written in the same commit as its first rows, and the merge refuses to
write a table in another shape than the one it was built with (:func:`shape_change`): nothing is
written, the remedy is a new target location and a re-snapshot of the table.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_vitess.exceptions import TargetModeError


class TargetMode(str, enum.Enum):
    MIRROR = "mirror"
    SOFT_DELETE = "soft_delete"
    HISTORY = "history"
    CHANGELOG = "changelog"


DEFAULT_PREFIX = "_vitess_"
MODE_PROPERTY = "vitess.targetMode"
PREFIX_PROPERTY = "vitess.metadataPrefix"
METADATA_PROPERTY = "vitess.metadataColumns"
CDF_PROPERTY = "delta.enableChangeDataFeed"
TYPE_WIDENING, DELETION_VECTORS = "type_widening", "deletion_vectors"
# The features a table may be given, with the table properties that turn each on; each locks
# out the readers that do not know it (docs/reading-the-tables.md).
TABLE_FEATURES: Mapping[str, Mapping[str, str]] = {
    TYPE_WIDENING: {"delta.enableTypeWidening": "true"},
    DELETION_VECTORS: {"delta.enableDeletionVectors": "true"},
}
FEATURE_PROPERTIES = tuple(k for props in TABLE_FEATURES.values() for k in props)
SHAPE_PROPERTIES = (MODE_PROPERTY, METADATA_PROPERTY, PREFIX_PROPERTY, CDF_PROPERTY, *FEATURE_PROPERTIES)
# The keys a ``targets[table]`` entry may hold (``path`` and ``renames`` are the merge's own).
TARGET_KEYS = frozenset({"path", "renames", "mode", "metadata_columns", "change_data_feed", "table_features"})
_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")


# The metadata columns, by role; the column is the prefix + the role.
OP, COMMIT_TS, WINDOW_SEQ, SYNCED_AT = "op", "commit_ts", "window_seq", "synced_at"
DELETED, DELETED_AT = "deleted", "deleted_at"
VALID_FROM, VALID_TO, CURRENT = "valid_from", "valid_to", "current"
SHARD, ORDER = "shard", "order"
COMMON = (OP, COMMIT_TS, WINDOW_SEQ, SYNCED_AT)
# Per mode: the columns it always has (its shape), then the common ones when metadata is on.
OWN: Mapping[TargetMode, tuple[str, ...]] = {
    TargetMode.MIRROR: (),
    TargetMode.SOFT_DELETE: (DELETED, DELETED_AT),
    TargetMode.HISTORY: (VALID_FROM, VALID_TO, CURRENT, DELETED),
    TargetMode.CHANGELOG: (OP, COMMIT_TS, WINDOW_SEQ, SHARD, ORDER),
}


def mode_of(value: Any, where: str) -> TargetMode:
    try:
        return TargetMode(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in TargetMode)
        raise TargetModeError(f"{where}: target mode {value!r} is not one of {allowed}") from None


def check_prefix(prefix: Any, where: str = "metadata_prefix") -> str:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise TargetModeError(
            f"{where} {prefix!r} is not a column name prefix: give letters, digits and '_' (not "
            f"starting with a digit, at most 31 characters), e.g. {DEFAULT_PREFIX!r}"
        )
    return prefix


@dataclass(frozen=True)
class ModeOptions:
    """The sync-wide defaults of :func:`resolve_shapes` (the operator's arguments)."""

    target_mode: str = TargetMode.MIRROR.value
    metadata_columns: bool | None = None  # None: on in the new modes, off in mirror
    metadata_prefix: str = DEFAULT_PREFIX
    change_data_feed: bool = False
    table_features: tuple[str, ...] = ()

    def shapes(
        self, tables: Iterable[str], targets: Mapping[str, Mapping[str, Any]] | None
    ) -> dict[str, TargetShape]:
        return resolve_shapes(
            tables,
            targets,
            target_mode=self.target_mode,
            metadata_columns=self.metadata_columns,
            metadata_prefix=self.metadata_prefix,
            change_data_feed=self.change_data_feed,
            table_features=self.table_features,
        )


@dataclass(frozen=True)
class TargetShape:
    """How one table lands: its mode, whether it has the common metadata columns, their
    prefix (the mode's own columns take it too), Change Data Feed, and the reader-locking
    Delta features chosen for it (:data:`TABLE_FEATURES`, sorted names)."""

    mode: TargetMode = TargetMode.MIRROR
    metadata: bool = False
    prefix: str = DEFAULT_PREFIX
    change_data_feed: bool = False
    features: tuple[str, ...] = ()

    def feature_properties(self) -> dict[str, str]:
        """The table properties of the chosen features (:data:`TABLE_FEATURES`)."""
        return {k: v for f in self.features for k, v in TABLE_FEATURES[f].items()}

    def roles(self) -> tuple[str, ...]:
        """The shape's metadata columns by role (:data:`OWN`, then :data:`COMMON`), in table order."""
        roles = list(OWN[self.mode])
        if self.metadata:
            roles += [r for r in COMMON if r not in roles]
        return tuple(roles)

    def columns(self) -> tuple[str, ...]:
        """Every metadata column of the shape, prefixed, in table order."""
        return tuple(self.prefix + r for r in self.roles())

    def name(self, role: str) -> str:
        return self.prefix + role

    @property
    def plain(self) -> bool:
        """A mirror without metadata columns or Change Data Feed: today's tables, written as
        they always were."""
        return self.mode is TargetMode.MIRROR and not self.metadata and not self.change_data_feed

    def key(self) -> tuple[str, bool, str]:
        """What fixes the rows' shape (Change Data Feed does not: a property of the table)."""
        return (self.mode.value, self.metadata, self.prefix if self.columns() else "")

    def properties(self) -> dict[str, str]:
        """What records the shape, in the first metadata column's metadata (:func:`shape_marker`;
        none for a plain mirror: its tables stay as they always were)."""
        if not self.columns():
            return {}
        return {
            MODE_PROPERTY: self.mode.value,
            METADATA_PROPERTY: str(self.metadata).lower(),
            PREFIX_PROPERTY: self.prefix,
        }

    def describe(self) -> str:
        meta = f"metadata columns {self.prefix}*" if self.metadata else "no metadata columns"
        return f"mode {self.mode.value!r} ({meta})"


def shape_marker(schema: Any) -> Mapping[str, str]:
    """The shape a table's schema records: the metadata of its first metadata column (written
    with the table's first rows, in the same commit; a Delta table property could not be: Delta
    takes only ``delta.*`` properties from a write). Empty: a plain mirror."""
    for f in schema.fields:
        if MODE_PROPERTY in (f.metadata or {}):
            return {k: str(v) for k, v in f.metadata.items() if k in SHAPE_PROPERTIES}
    return {}


def recorded_shape(properties: Mapping[str, str]) -> TargetShape:
    """The shape an existing Delta table was built with (no properties: a plain mirror)."""
    mode = TargetMode(properties.get(MODE_PROPERTY) or TargetMode.MIRROR.value)
    metadata = properties.get(METADATA_PROPERTY, "false") == "true"
    return TargetShape(mode, metadata, properties.get(PREFIX_PROPERTY) or DEFAULT_PREFIX)


def shape_change(recorded: TargetShape, wanted: TargetShape) -> str | None:
    """What differs between the shape a table was built with and the one asked for (Change
    Data Feed may change: it is a property of the table, not of its rows); None if nothing."""
    if recorded.key() == wanted.key():
        return None
    return f"was built in {recorded.describe()}, and the merge asks for {wanted.describe()}"


def collisions(shape: TargetShape, columns: Iterable[str]) -> list[str]:
    """Source (target) columns whose name is one of the shape's metadata columns."""
    own = {c.lower() for c in shape.columns()}
    return sorted(c for c in columns if c.lower() in own)


def resolve_shapes(
    tables: Iterable[str],
    targets: Mapping[str, Mapping[str, Any]] | None,
    *,
    target_mode: Any = TargetMode.MIRROR.value,
    metadata_columns: bool | None = None,
    metadata_prefix: str = DEFAULT_PREFIX,
    change_data_feed: bool = False,
    table_features: Iterable[str] = (),
) -> dict[str, TargetShape]:
    """Each table's shape from the sync-wide defaults and its ``targets`` entry, validated:
    an unknown mode or ``targets`` key, or a flag that is not a boolean, is an error naming it.
    (An entry for a table not among ``tables`` is not read: a table that left the sync.)"""
    tables = list(tables)
    default = mode_of(target_mode, "target_mode")
    prefix = check_prefix(metadata_prefix)
    given = dict(targets or {})
    out = {}
    for table in tables:
        entry = dict(given.get(table) or {})
        if extra := sorted(set(entry) - TARGET_KEYS):
            raise TargetModeError(
                f"targets[{table!r}] has unknown key(s) {extra}; allowed: {sorted(TARGET_KEYS)}"
            )
        mode = mode_of(entry.get("mode", default), f"targets[{table!r}]['mode']")
        meta = entry.get("metadata_columns", metadata_columns)
        if meta is None:
            meta = mode is not TargetMode.MIRROR
        if not isinstance(meta, bool):
            raise TargetModeError(
                f"targets[{table!r}]['metadata_columns'] must be true or false, got {meta!r}"
            )
        cdf = entry.get("change_data_feed", change_data_feed)
        if not isinstance(cdf, bool):
            raise TargetModeError(
                f"targets[{table!r}]['change_data_feed'] must be true or false, got {cdf!r}"
            )
        features = check_features(
            entry.get("table_features", table_features),
            f"targets[{table!r}]['table_features']" if "table_features" in entry else "table_features",
        )
        out[table] = TargetShape(mode, meta, prefix, cdf, features)
    return out


def check_features(value: Any, where: str = "table_features") -> tuple[str, ...]:
    """Chosen table features as sorted names; an unknown one, or a string where a list is
    expected, is an error naming the allowed ones."""
    allowed = sorted(TABLE_FEATURES)
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TargetModeError(f"{where} must be a list of feature names (from {allowed}), got {value!r}")
    names = list(value)
    if unknown := sorted({str(n) for n in names} - set(TABLE_FEATURES)):
        raise TargetModeError(f"{where}: unknown table feature(s) {unknown}; allowed: {allowed}")
    return tuple(sorted(set(names)))
