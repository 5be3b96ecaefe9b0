"""Apache Iceberg behind :class:`.base.TableFormat`: the merge's writes, marker and state in Iceberg.

* The table: the location read as a Hadoop catalog's table (:mod:`..iceberg_sql`), created as
  format version 2 with row-level changes written as position deletes (merge-on-read), which
  every Iceberg v2 reader reads; not equality deletes, which most engines cannot.
* The exactly-once marker: each write's snapshot carries the sync's app id, the window's seq and
  its mark in its summary (Iceberg's session snapshot properties, :data:`..iceberg_sql.SNAPSHOT_PROPERTY`).
  Iceberg has no transaction id that makes a write skip itself as Delta's does, so each write
  first asks whether the table's current line of snapshots holds the window
  (:func:`..iceberg_log.read_commits`) and writes nothing when it does. The sync's lock makes the
  job the table's one writer, so nothing commits between the question and the write.
* The version: the current snapshot's sequence number less one (:mod:`..iceberg_log`).
* Schema changes: Iceberg tracks columns by id, so a column is added and dropped in place; a
  widening Iceberg allows (int to bigint, float to double, a decimal's precision) is done in
  place, any other by rewriting the table (:func:`_rewrite`).
* The integrity check: the states read here, checked by :func:`..integrity.check_targets` as
  Delta's are (a rollback shows as a version below the one recorded, and in ``restores``).
* Time travel: ``VERSION AS OF`` the snapshot of a version (:mod:`.time_travel`): each write's
  commit tells its snapshot id, which the store records; a version recorded without one is
  found in the metadata log.

SQL only, as Delta's Connect path: nothing here reaches into the JVM.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from airflow_provider_vitess.exceptions import TargetIntegrityError
from airflow_provider_vitess.merge.job import apply, iceberg_log
from airflow_provider_vitess.merge.job.delta_access import for_session as access_for_session
from airflow_provider_vitess.merge.job.delta_sql import q
from airflow_provider_vitess.merge.job.formats import time_travel
from airflow_provider_vitess.merge.job.formats.base import Commit, Statement
from airflow_provider_vitess.merge.job.iceberg_log import APP, MARK, WINDOW, Commits, LogEntry, Snapshot
from airflow_provider_vitess.merge.job.iceberg_sql import SNAPSHOT_PROPERTY, IcebergTable, at, register
from airflow_provider_vitess.merge.job.integrity import check_targets
from airflow_provider_vitess.merge.job.window_rows import col
from airflow_provider_vitess.merge.modes import SHAPE_PROPERTIES, shape_marker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriterV2, SparkSession
    from pyspark.sql import types as T

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
    from airflow_provider_vitess.merge.job.schema import Evolution
    from airflow_provider_vitess.merge.job.steps import TableSize, TableState
    from airflow_provider_vitess.merge.modes import TargetShape
    from airflow_provider_vitess.merge.plan import MergePlan

# Format version 2, row-level changes as position deletes: what Iceberg v2 readers read.
CREATE_PROPERTIES: Mapping[str, str] = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


class IcebergFormat:
    """Iceberg tables at locations, through ``spark``'s SQL: a Hadoop catalog's, or those of the
    JDBC catalog ``jdbc`` (:mod:`...iceberg_catalog`)."""

    name = "iceberg"

    def __init__(self, jdbc: IcebergCatalog | None = None) -> None:
        self.jdbc = jdbc
        self.catalog: str | None = None if jdbc is None else jdbc.name

    def _table(self, spark: SparkSession, path: str) -> IcebergTable:
        return register(spark, at(path, self.jdbc))

    def _existing(self, spark: SparkSession, path: str) -> IcebergTable | None:
        """The table at ``path`` if it exists (None: not yet). A JDBC catalog's table of the same
        name elsewhere is another program's, and refused: the sync never writes it."""
        table = self._table(spark, path)
        if not _exists(spark, table):
            return None
        if table.jdbc is not None:
            found = _location(spark, table)
            if found.rstrip("/") != table.location:
                raise TargetIntegrityError(
                    f"the Iceberg catalog {table.catalog!r} has a table {table.namespace}.{table.name} "
                    f"at {found}, not at the sync's location {table.location}: it is another "
                    "table than the sync's. Remedy: give the sync's table another path (its last two "
                    "parts name it in the catalog), or drop the catalog's table if it is the sync's "
                    "moved away"
                )
        return table

    # -- state --------------------------------------------------------------------------------

    def state(self, spark: SparkSession, path: str, app_id: str, restores_after: int | None) -> TableState:
        from airflow_provider_vitess.merge.job.steps import TableState

        table = self._existing(spark, path)
        if table is None:
            return TableState(exists=False)
        commits = _commits(spark, table, app_id, restores_after)
        return TableState(
            exists=True,
            schema=spark.table(table.sql).schema,
            txn_version=commits.txn_version,
            column_mapping=False,  # Iceberg maps columns by id itself: no Delta column mapping
            version=commits.version,
            snapshot_id=commits.snapshot_id,
            restores=commits.restores,
            marks=commits.marks,
            properties=_shape_properties(spark, table),
        )

    def size(self, spark: SparkSession, path: str) -> TableSize:
        from airflow_provider_vitess.merge.job.steps import TableSize

        table = self._table(spark, path)
        row = spark.sql(
            f"SELECT count(*), sum(file_size_in_bytes) FROM {table.metadata('data_files')}"
        ).first()
        return TableSize(int(row[0]) if row else 0, int(row[1] or 0) if row else 0)

    def applied(self, spark: SparkSession, path: str, app_id: str, seq: int) -> bool:
        table = self._existing(spark, path)
        if table is None:
            return False
        txn = _commits(spark, table, app_id, None).txn_version
        return txn is not None and txn >= seq

    def activate(self, spark: SparkSession) -> None:
        # A classic session is made the thread's active one in the JVM; a Connect one needs nothing.
        access_for_session(spark).activate(spark)

    def check(self, plan: MergePlan, states: Mapping[str, TableState], reads: Mapping[int, str]) -> None:
        check_targets(plan, states, reads)

    def marked(self, spark: SparkSession, mark: str) -> AbstractContextManager[None]:
        return _snapshot_properties(spark, {MARK: mark})

    # -- writes -------------------------------------------------------------------------------

    def replace(
        self,
        rows: DataFrame,
        path: str,
        keys: Sequence[str],
        app_id: str,
        seq: int,
        *,
        files: int,
        column_mapping: bool,
        properties: Mapping[str, str] | None,
    ) -> Commit | None:
        """A new line of snapshots (Iceberg's REPLACE TABLE: the table's history stays) whose
        first snapshot holds the window; ``column_mapping`` is Delta's and has no use here."""
        spark = rows.sparkSession
        if self.applied(spark, path, app_id, seq):
            return None
        table = self._table(spark, path)
        writer = _creating(apply.laid_out(rows, keys, files), table, _create_properties(rows, properties))
        with _window(spark, app_id, seq):
            writer.createOrReplace()
        return _last_commit(spark, table)

    def append(
        self,
        rows: DataFrame,
        path: str,
        app_id: str,
        seq: int,
        *,
        create: Mapping[str, str] | None,
        column_mapping: bool,
    ) -> Commit | None:
        spark = rows.sparkSession
        if self.applied(spark, path, app_id, seq):
            return None
        table = self._table(spark, path)
        data = apply.plain_strings(rows)
        with _window(spark, app_id, seq):
            if create is None:
                data.writeTo(table.sql).append()
            else:
                _creating(data, table, _create_properties(rows, create)).create()
        return _last_commit(spark, table)

    def merge(
        self,
        spark: SparkSession,
        rows: DataFrame,
        path: str,
        statement: Statement,
        app_id: str,
        seq: int,
        *,
        table: str,
        key: str,
        key_type: T.DataType,
        size: TableSize | None,
        view_prefix: str,
    ) -> Commit | None:
        """Iceberg answers a MERGE with no counts: the commit's are those of its snapshot summary
        (rows written; the inserted, updated and deleted rows are not told apart)."""
        if self.applied(spark, path, app_id, seq):
            return None
        target = self._table(spark, path)
        rows = apply.persist(rows)
        view = f"{view_prefix}{uuid.uuid4().hex}"
        try:
            size = size if size is not None else self.size(spark, path)
            prune = None if size.files <= 1 else apply.prune_condition(spark, rows, key, key_type)
            rows.createOrReplaceTempView(view)
            with _window(spark, app_id, seq):
                spark.sql(statement(target.sql, view, rows.columns, prune)).collect()
        finally:
            spark.catalog.dropTempView(view)
            rows.unpersist()
        return _last_commit(spark, target)

    def evolve(self, spark: SparkSession, path: str, ev: Evolution, *, widen_in_place: bool) -> None:
        """Added and dropped columns in place (Iceberg tracks columns by id); a widening in place
        where Iceberg allows it, else by rewriting the table. Each repeated is a no-op."""
        table = self._table(spark, path)
        have = {f.name: f for f in spark.table(table.sql).schema.fields}
        gone = [n for n in ev.drop if n in have]
        if gone:
            spark.sql(f"ALTER TABLE {table.sql} DROP COLUMNS ({', '.join(q(n) for n in gone)})")
        new = [f for f in ev.add if f.name not in have]
        if new:
            cols = ", ".join(f"{q(f.name)} {f.dataType.simpleString()}" for f in new)
            spark.sql(f"ALTER TABLE {table.sql} ADD COLUMNS ({cols})")
        rewrite: list[tuple[str, T.DataType]] = []
        for name, _, wider in ev.widen:
            if name in have and have[name].dataType == wider:
                continue
            if name in have and _promotes(have[name].dataType, wider):
                spark.sql(f"ALTER TABLE {table.sql} ALTER COLUMN {q(name)} TYPE {wider.simpleString()}")
            else:
                rewrite.append((name, wider))
        if rewrite:
            _rewrite(spark, table, rewrite)

    def read(self, spark: SparkSession, path: str) -> DataFrame:
        return spark.table(self._table(spark, path).sql)

    def set_change_data_feed(
        self, spark: SparkSession, path: str, shape: TargetShape, properties: Mapping[str, str]
    ) -> None:
        """Iceberg has no change feed to turn on: every snapshot's changes can be read (its
        ``create_changelog_view`` procedure); the shape's choice is checked where the sync is
        planned."""

    # -- time travel --------------------------------------------------------------------------

    def read_at(
        self, spark: SparkSession, path: str, version: int, snapshot_id: int | None = None
    ) -> DataFrame:
        """At the recorded snapshot; without one, at the snapshot the metadata log says was
        current at ``version`` (versions the store recorded before it kept snapshots)."""
        table = self._table(spark, path)  # the SQL names its catalog: registered on this session
        if snapshot_id is None:
            snapshot_id = iceberg_log.snapshot_at(metadata_log(spark, table), version)
        if snapshot_id is None:
            raise ValueError(
                f"Iceberg table {path}: version {version} is no longer in its metadata log "
                "(write.metadata.previous-versions-max), so its snapshot cannot be found"
            )
        return spark.sql(self.sql_at(path, version, snapshot_id))

    def sql_at(self, path: str, version: int, snapshot_id: int | None = None) -> str:
        return time_travel.sql_at(path, version, self.name, snapshot_id, self.catalog)


def _exists(spark: SparkSession, table: IcebergTable) -> bool:
    return bool(spark.catalog.tableExists(table.sql))


def _location(spark: SparkSession, table: IcebergTable) -> str:
    """Where the catalog says the table is."""
    for name, value, _ in spark.sql(f"DESCRIBE TABLE EXTENDED {table.sql}").collect():
        if str(name).strip() == "Location":
            return str(value)
    raise AssertionError(f"{table.sql}: DESCRIBE TABLE EXTENDED names no location")


def metadata_log(spark: SparkSession, table: IcebergTable) -> list[LogEntry]:
    """The table's ``metadata_log_entries``, oldest first (:mod:`..iceberg_log`)."""
    rows = spark.sql(
        f"SELECT latest_snapshot_id, latest_sequence_number FROM {table.metadata('metadata_log_entries')} "
        "ORDER BY timestamp"
    ).collect()
    return [LogEntry(r[0], r[1]) for r in rows]


def _commits(spark: SparkSession, table: IcebergTable, app_id: str, restores_after: int | None) -> Commits:
    snapshots = [
        Snapshot(int(r[0]), None if r[1] is None else int(r[1]), dict(r[2] or {}))
        for r in spark.sql(
            f"SELECT snapshot_id, parent_id, summary FROM {table.metadata('snapshots')}"
        ).collect()
    ]
    return iceberg_log.read_commits(metadata_log(spark, table), snapshots, app_id, restores_after)


def _current(spark: SparkSession, table: IcebergTable) -> tuple[str, dict[str, str], int, int]:
    """The current snapshot's operation, summary, sequence number and id."""
    row = spark.sql(
        f"SELECT s.operation, s.summary, m.latest_sequence_number, s.snapshot_id "
        f"FROM {table.metadata('snapshots')} s "
        f"JOIN {table.metadata('metadata_log_entries')} m ON s.snapshot_id = m.latest_snapshot_id "
        "ORDER BY m.timestamp DESC LIMIT 1"
    ).first()
    assert row is not None, f"{table.location}: the table has no snapshot"
    return str(row[0]), dict(row[1] or {}), int(row[2]), int(row[3])


def _last_commit(spark: SparkSession, table: IcebergTable) -> Commit:
    """The commit the write just made: the current snapshot (its id: what time travel names),
    counts from its summary."""
    operation, summary, sequence_number, snapshot_id = _current(spark, table)
    return Commit(
        iceberg_log.version_of(sequence_number),
        operation,
        rows_written=int(summary.get("added-records", 0)),
        files_touched=int(summary.get("removed-data-files", 0)) + int(summary.get("added-delete-files", 0)),
        snapshot_id=snapshot_id,
    )


@contextmanager
def _snapshot_properties(spark: SparkSession, summary: Mapping[str, str]) -> Iterator[None]:
    """The commits ``spark`` makes in the block carry ``summary`` in their snapshot's summary."""
    keys = {SNAPSHOT_PROPERTY + k: v for k, v in summary.items()}
    for k, v in keys.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k in keys:
            spark.conf.unset(k)


def _window(spark: SparkSession, app_id: str, seq: int) -> AbstractContextManager[None]:
    """The commits ``spark`` makes in the block carry (app id, window seq) in their summary."""
    return _snapshot_properties(spark, {APP: app_id, WINDOW: str(seq)})


def _shape_properties(spark: SparkSession, table: IcebergTable) -> dict[str, str]:
    """The table's properties that record its shape (``merge.modes.SHAPE_PROPERTIES``)."""
    rows = spark.sql(f"SHOW TBLPROPERTIES {table.sql}").collect()
    return {str(k): str(v) for k, v in rows if str(k) in SHAPE_PROPERTIES}


def _creating(rows: DataFrame, table: IcebergTable, properties: Mapping[str, str]) -> DataFrameWriterV2:
    """A writer that creates (or replaces) ``table`` with ``rows`` and ``properties``, at its
    location: a JDBC catalog would put it below its warehouse, in a namespace that must exist."""
    writer = rows.writeTo(table.sql).using("iceberg")
    if table.jdbc is not None:
        rows.sparkSession.sql(f"CREATE NAMESPACE IF NOT EXISTS {q(table.catalog)}.{q(table.namespace)}")
        writer = writer.tableProperty("location", table.location)
    for k, v in properties.items():
        writer = writer.tableProperty(k, v)
    return writer


def _create_properties(rows: DataFrame, properties: Mapping[str, str] | None) -> dict[str, str]:
    """A new table's properties: the format's, and the shape the rows' schema records (Iceberg
    keeps no column metadata, so it goes in the table's properties). Delta's properties (its
    features, its change feed) have no meaning here."""
    shape = {
        k: v
        for k, v in {**shape_marker(rows.schema), **(properties or {})}.items()
        if not k.startswith("delta.")
    }
    return {**CREATE_PROPERTIES, **shape}


def _promotes(have: T.DataType, wider: T.DataType) -> bool:
    """Whether Iceberg widens ``have`` to ``wider`` in place (its type promotion rules)."""
    from pyspark.sql import types as T

    if isinstance(have, T.IntegerType | T.ShortType | T.ByteType):
        return isinstance(wider, T.LongType | T.IntegerType)
    if isinstance(have, T.FloatType):
        return isinstance(wider, T.DoubleType)
    if isinstance(have, T.DecimalType) and isinstance(wider, T.DecimalType):
        return wider.scale == have.scale and wider.precision >= have.precision
    return False


def _rewrite(spark: SparkSession, table: IcebergTable, widen: Sequence[tuple[str, T.DataType]]) -> None:
    """The table replaced by its own rows with ``widen``'s columns cast to their wider types
    (every value survives), for a widening Iceberg does not do in place. A replace starts a new
    line of snapshots, so its snapshot carries the marker of the one it replaces: it holds the
    same windows. A rerun finds the columns wide and does nothing."""
    old = spark.table(table.sql)
    wider = dict(widen)
    cast = [
        col(f.name).cast(wider[f.name]).alias(f.name) if f.name in wider else col(f.name)
        for f in old.schema.fields
    ]
    rows = old.select(*cast).localCheckpoint()  # read whole before the table is replaced
    summary = _current(spark, table)[1]
    writer = _creating(rows, table, {**CREATE_PROPERTIES, **_shape_properties(spark, table)})
    with _snapshot_properties(spark, {k: summary[k] for k in (APP, WINDOW, MARK) if k in summary}):
        writer.createOrReplace()
