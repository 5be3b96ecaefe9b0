"""What one run of the Spark merge job applies: the contract between the Airflow worker and the job.

The operator builds a :class:`MergePlan` from the checkpoint store (the STAGED windows of one
sync, in order) and hands it to the job as a JSON file (``--plan-file``). The job never
reads the checkpoint store: it applies what the plan names and reports, per window and table,
whether it wrote or found the window already applied (Delta transaction identifiers).

Pure data, no I/O: both sides import it, and it has no credentials in it (the staging and
target file systems take theirs from the Spark/Hadoop configuration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from airflow_provider_vitess.delta_txns import txn_app_id
from airflow_provider_vitess.exceptions import MergePlanError as MergePlanError
from airflow_provider_vitess.merge.modes import TargetShape
from airflow_provider_vitess.utils.jsondoc import JsonDocument, null_is

# The table formats a sync can write (``merge.job.formats`` implements each).
TABLE_FORMATS = ("delta", "iceberg")


@dataclass(frozen=True)
class TableTarget:
    """How one source table lands in Delta.

    ``path`` is the Delta table's location. ``key_columns`` identify a row on the target, in
    target names; ``key_from_source[i]`` is the source column that feeds ``key_columns[i]`` (its
    before image is staged, so an update that changes it deletes the old row). ``renames`` maps
    source column -> target column for the columns named differently on the target. ``shape``:
    the target mode and metadata columns (:mod:`.modes`).
    """

    table: str
    path: str
    key_columns: tuple[str, ...]
    key_from_source: tuple[str, ...]
    renames: Annotated[Mapping[str, str], null_is({})] = field(default_factory=dict)
    # What the checkpoint store says the sync last wrote to the table: the window seq (None:
    # never) and that commit's Delta version (None: no Delta table was needed). The job checks
    # the table against them before writing (``merge.integrity``).
    last_merged_seq: int | None = None
    last_delta_version: int | None = None
    # The target mode and metadata columns (``merge.modes``); the table records them itself.
    shape: TargetShape = field(default_factory=TargetShape)

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise MergePlanError(f"table {self.table!r}: the target key has no columns")
        if len(self.key_columns) != len(self.key_from_source):
            raise MergePlanError(
                f"table {self.table!r}: {len(self.key_columns)} target key column(s) "
                f"{list(self.key_columns)} but {len(self.key_from_source)} source column(s) feeding them"
            )

    @model_serializer(mode="wrap")
    def _omit_plain_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plain mirror's plan is written as before target modes existed (no ``shape``)."""
        out: dict[str, Any] = handler(self)
        if self.shape == TargetShape():
            out.pop("shape", None)
        return out

    def target_name(self, source_column: str) -> str:
        return self.renames.get(source_column, source_column)


@dataclass(frozen=True)
class WindowToMerge:
    """One staged window. ``replace_tables``: tables whose target is replaced by this window's
    rows (a snapshot or re-snapshot of them) instead of having the changes merged into it."""

    seq: int
    manifest_path: str
    replace_tables: Annotated[tuple[str, ...], null_is(())] = ()


@dataclass(frozen=True)
class MergePlan(JsonDocument):
    """Windows of one sync, applied in ``seq`` order, to the tables in ``targets``.

    Delta transaction identifiers make each (window, table) apply once: app id
    :meth:`txn_app_id`, version = the window's seq.
    """

    sync_id: str
    windows: tuple[WindowToMerge, ...]
    targets: Mapping[str, TableTarget]
    # The tables' format (``merge.job.formats``): "delta" or "iceberg".
    table_format: str = "delta"
    # An Iceberg sync's JDBC catalog, without its credentials (``IcebergCatalog.document``);
    # None: a Hadoop catalog per warehouse.
    iceberg_catalog: Mapping[str, str] | None = None
    document = "merge plan"
    error = MergePlanError

    def __post_init__(self) -> None:
        seqs = [w.seq for w in self.windows]
        if seqs != sorted(set(seqs)):
            raise MergePlanError(f"sync {self.sync_id!r}: windows must be distinct and in order, got {seqs}")
        if self.table_format not in TABLE_FORMATS:
            raise MergePlanError(
                f"sync {self.sync_id!r}: table format {self.table_format!r} is not one of "
                f"{', '.join(TABLE_FORMATS)}"
            )
        if self.iceberg_catalog is not None and self.table_format != "iceberg":
            raise MergePlanError(
                f"sync {self.sync_id!r}: an Iceberg catalog is given for {self.table_format} tables"
            )
        for target in self.targets.values():
            problem = format_problem(self.table_format, target.table, target.shape)
            if problem:
                raise MergePlanError(problem)
        for w in self.windows:
            unknown = sorted(set(w.replace_tables) - set(self.targets))
            if unknown:
                raise MergePlanError(f"window {w.seq} replaces table(s) {unknown} that have no target")

    @model_serializer(mode="wrap")
    def _omit_delta(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A Delta sync's plan is written as before Iceberg (no ``table_format``), and one without a
        JDBC catalog as before catalogs."""
        out: dict[str, Any] = handler(self)
        if self.table_format == "delta":
            out.pop("table_format", None)
        if self.iceberg_catalog is None:
            out.pop("iceberg_catalog", None)
        return out

    def txn_app_id(self, table: str) -> str:
        return txn_app_id(self.sync_id, table)


def catalog_problem(table_format: str, iceberg_catalog_conn_id: str | None) -> str | None:
    """Why ``iceberg_catalog_conn_id`` cannot be given for ``table_format`` tables (None: it
    can): a catalog is Iceberg's."""
    if not iceberg_catalog_conn_id or table_format == "iceberg":
        return None
    return (
        f"iceberg_catalog_conn_id {iceberg_catalog_conn_id!r} is given for {table_format} tables: "
        "a catalog is Iceberg's; set table_format='iceberg', or leave it out"
    )


def format_problem(table_format: str, table: str, shape: TargetShape) -> str | None:
    """What ``table_format`` cannot do of ``shape`` (None: nothing): Delta's change data feed and
    table features have no meaning on Iceberg, whose every snapshot's changes can be read."""
    if table_format != "iceberg":
        return None
    asked = [
        *(["change_data_feed"] if shape.change_data_feed else []),
        *([f"table_features {list(shape.features)}"] if shape.features else []),
    ]
    if not asked:
        return None
    return (
        f"table {table!r}: {' and '.join(asked)} are Delta's and an Iceberg table has no such "
        "thing (Iceberg keeps every snapshot's changes: its create_changelog_view procedure reads "
        "them). Remedy: leave them out for table_format='iceberg', or write the table to Delta"
    )


def target_path(
    target_location: str, table: str, targets: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """Where ``table``'s Delta table is: its ``targets`` override, else ``<target_location>/<table>``."""
    given = (targets or {}).get(table) or {}
    return str(given.get("path") or f"{target_location.rstrip('/')}/{table}")


def default_targets(
    tables: Sequence[str], target_location: str, key_columns: Mapping[str, Sequence[str]]
) -> dict[str, TableTarget]:
    """One Delta table per source table under ``target_location``, same names, same key."""
    return {
        t: TableTarget(t, target_path(target_location, t), tuple(key_columns[t]), tuple(key_columns[t]))
        for t in tables
    }
