"""Staged windows' manifests built by hand (tables of ``id`` and ``name`` in keyspace ``ks``), for
the merge plan's and the target modes' unit tests."""

from __future__ import annotations

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.merge.plan import WindowToMerge
from airflow_provider_vitess.staging.manifest import (
    ColumnSchema,
    Manifest,
    PartInfo,
    TableManifest,
    TableSchema,
)
from airflow_provider_vitess.vgtid import Vgtid

Q = query_pb2.Type


def col(name: str, type_: query_pb2.Type, column_type: str) -> ColumnSchema:
    return ColumnSchema.from_field(
        query_pb2.Field(name=name, type=type_, column_type=column_type, charset=255)
    )


ID = col("id", Q.INT32, "int")
ID64 = col("id", Q.INT64, "bigint")
NAME = col("name", Q.VARCHAR, "varchar(9)")
NAME_INT = col("name", Q.INT32, "int")
EXTRA = col("extra", Q.DATE, "date")


def table(name: str, *schemas: tuple[ColumnSchema, ...], rows: bool = True) -> TableManifest:
    ts = tuple(TableSchema(cols, ("id",)) for cols in schemas)
    parts = tuple(
        PartInfo(name, f"{name}/part-{i:05d}.parquet", 1, 1, "0" * 64, s.to_json()) for i, s in enumerate(ts)
    )
    return TableManifest(name, ("ks",), ("id",), ts, parts if rows else (), {})


def manifest(seq: int, *tables: TableManifest) -> Manifest:
    v = Vgtid.for_keyspace("ks", "")
    return Manifest("s", seq, v, v, v, {t.table: t for t in tables}, location="/stage")


def w(seq: int, *replace: str) -> WindowToMerge:
    return WindowToMerge(seq, f"/stage/s/window={seq:010d}/_manifest.json", replace)
