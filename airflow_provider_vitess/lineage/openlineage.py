"""OpenLineage of the capture and merge tasks: which Vitess tables a window read, which Delta
tables it wrote, with schemas, row counts and column lineage.

The operators collect a small :class:`CaptureLineage` / :class:`MergeLineage` while they run
(plain data: the vtgate address, the staged manifest, the merge plan and report); the OpenLineage
provider asks for facets when the task completes, and only then is it imported. A deployment
without ``apache-airflow-providers-openlineage`` never calls this module.

Naming (:mod:`.uris`): a source table is namespace ``vitess://<vtgate host:port>``, name
``<keyspace>.<table>``; a Delta table is named after its location (``file`` + path, or
``s3://bucket`` + key). Column lineage is identity: each Delta column is one source column,
renamed at most.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_vitess.checkpoints.states import WINDOW_COLUMNS
from airflow_provider_vitess.lineage.assets import changed_tables
from airflow_provider_vitess.lineage.uris import DatasetName, location_dataset, vitess_dataset
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport, TableResult, TableStatus
from airflow_provider_vitess.staging.manifest import Manifest, TableSchema, load_manifest

HASHED = "salted SHA-256 (hash_columns)"

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage


@dataclass(frozen=True)
class CaptureLineage:
    """What a capture task read: the sync's tables, and the staged window's schemas if any."""

    vtgate: str
    keyspace: str
    tables: tuple[str, ...]
    manifest: Manifest | None


@dataclass(frozen=True)
class MergeLineage:
    """What a merge task wrote: the plan's tables, the job's report, the window it merged."""

    vtgate: str | None  # recorded by the capture task in the sync's config
    plan: MergePlan
    report: MergeReport
    seq: int


def _schema_facet(columns: Sequence[tuple[str, str]]) -> Any:
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacet, SchemaDatasetFacetFields

    return SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=n, type=t) for n, t in columns])


def _source_columns(schema: TableSchema) -> list[tuple[str, str]]:
    return [(c.name, c.column_type or c.type) for c in schema.columns]


def _source(vtgate: str, keyspace: str, table: str, schema: TableSchema | None) -> Any:
    from airflow.providers.common.compat.openlineage.facet import InputDataset

    name = vitess_dataset(vtgate, keyspace, table)
    facets = {} if schema is None else {"schema": _schema_facet(_source_columns(schema))}
    return InputDataset(namespace=name.namespace, name=name.name, facets=facets)


def capture_facets(lineage: CaptureLineage | None) -> OperatorLineage:
    """Inputs: the sync's tables, with the schema the window staged (a catch-up window stages
    schemas only for tables that changed). No outputs: the staged files are internal."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    if lineage is None or lineage.manifest is None:  # nothing was read (no snapshot needed)
        return OperatorLineage()
    staged = lineage.manifest.tables
    inputs = [
        _source(lineage.vtgate, lineage.keyspace, t, staged[t].schema if t in staged else None)
        for t in lineage.tables
    ]
    return OperatorLineage(inputs=inputs)


def _manifest(plan: MergePlan, seq: int) -> Manifest | None:
    """The merged window's manifest (schemas and keyspaces of its tables), if still staged."""
    window = next((w for w in plan.windows if w.seq == seq), None)
    if window is None:
        return None
    suffix = f"/{plan.sync_id}/window={seq:010d}/"
    location = window.manifest_path.rsplit(suffix, 1)[0]
    return load_manifest(location, plan.sync_id, seq)


def _column_lineage(
    source: DatasetName, renames: dict[str, str], schema: TableSchema, hashed: Collection[str] = ()
) -> Any:
    """Identity lineage per column; a ``hash_columns`` column (lower-cased in ``hashed``) is a
    masking transformation of its source column (docs/column-control.md)."""
    from airflow.providers.common.compat.openlineage.facet import (
        ColumnLineageDatasetFacet,
        Fields,
        InputField,
    )
    from openlineage.client.generated.column_lineage_dataset import Transformation

    identity = Transformation(type="DIRECT", subtype="IDENTITY")
    masked = Transformation(type="DIRECT", subtype="TRANSFORMATION", description=HASHED, masking=True)

    def fields(name: str) -> Any:
        hash_ = name.lower() in hashed
        return Fields(
            inputFields=[
                InputField(
                    source.namespace, source.name, name, transformations=[masked if hash_ else identity]
                )
            ],
            transformationType="MASKED" if hash_ else "IDENTITY",
            transformationDescription=HASHED if hash_ else "",
        )

    return ColumnLineageDatasetFacet(
        fields={renames.get(c.name, c.name): fields(c.name) for c in schema.columns}
    )


def _target(
    result: TableResult,
    plan: MergePlan,
    source: DatasetName | None,
    schema: TableSchema | None,
    hashed: Collection[str] = (),
) -> Any:
    from airflow.providers.common.compat.openlineage.facet import (
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )

    name = location_dataset(result.path)
    renames = dict(plan.targets[result.table].renames)
    facets: dict[str, Any] = {}
    if schema is not None:
        facets["schema"] = _schema_facet([(renames.get(c.name, c.name), c.arrow) for c in schema.columns])
        if source is not None:
            facets["columnLineage"] = _column_lineage(source, renames, schema, hashed)
    output_facets: dict[str, Any] = {}
    if result.status is TableStatus.WRITTEN:
        # Rows this window changed in the table (a replace: every row it now holds).
        changed = result.rows_inserted + result.rows_updated + result.rows_deleted
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=changed)
    return OutputDataset(name.namespace, name.name, facets=facets, outputFacets=output_facets)


def merge_facets(lineage: MergeLineage | None) -> OperatorLineage:
    """Inputs: the Vitess tables of the tables the window changed; outputs: their Delta tables,
    with schema, row-count and identity column-lineage facets. A window that changed nothing
    has neither (like its asset events)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    changed = [] if lineage is None else changed_tables(lineage.report, lineage.seq)
    if lineage is None or not changed:
        return OperatorLineage()
    manifest = _manifest(lineage.plan, lineage.seq)
    inputs, outputs = [], []
    for result in changed:
        tm = None if manifest is None else manifest.tables.get(result.table)
        schema = None if tm is None else tm.schema
        source = None
        if lineage.vtgate is not None and tm is not None:
            source = vitess_dataset(lineage.vtgate, tm.keyspace, result.table)
            inputs.append(_source(lineage.vtgate, tm.keyspace, result.table, schema))
        chosen = {} if manifest is None else dict(manifest.stats.get(WINDOW_COLUMNS) or {})
        hashed = (chosen.get(result.table) or {}).get("hash") or ()
        outputs.append(_target(result, lineage.plan, source, schema, hashed))
    return OperatorLineage(inputs=inputs, outputs=outputs)
