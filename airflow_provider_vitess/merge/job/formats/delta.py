"""Delta Lake behind :class:`.base.TableFormat`: the merge's writes, marker and state in Delta.

The work stays in the modules that did it before this seam; this class only puts them behind
the protocol:

* the state, the size and the log files: :mod:`..tables` on a classic session (Delta's JVM),
  :mod:`..connect_tables` over Spark Connect (SQL and log files), one of the two chosen from the
  first session (:func:`..delta_access.for_session`), as before;
* the writes: :mod:`..apply` (replace, append, MERGE, each one commit carrying Delta's
  transaction id, txnAppId = the app id and txnVersion = the window's seq, which Delta skips
  when the table holds it: the exactly-once marker), the commit they made from
  :mod:`..delta_log`;
* the schema changes and their type-widening guard: :func:`..apply.evolve_table`
  (:mod:`..delta_features`);
* the integrity check: :mod:`..integrity` (pure, over the states), with each window's mark
  (:mod:`..marks`) in its commits' ``userMetadata``;
* time travel: ``versionAsOf`` (the consistent cut, :mod:`airflow_provider_vitess.consistent_reads`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from airflow_provider_vitess.exceptions import UnsupportedDeltaError
from airflow_provider_vitess.merge.job import apply, delta_log, shapes
from airflow_provider_vitess.merge.job.delta_access import DeltaAccess
from airflow_provider_vitess.merge.job.delta_access import for_session as access_for_session
from airflow_provider_vitess.merge.job.delta_sql import table as sql_table
from airflow_provider_vitess.merge.job.formats import time_travel
from airflow_provider_vitess.merge.job.formats.base import Commit, Statement
from airflow_provider_vitess.merge.job.integrity import check_targets
from airflow_provider_vitess.merge.spark_conf import DELTA_PACKAGE

# Delta's commit metadata for the session's commits (``userMetadata`` in the table's history).
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

    from airflow_provider_vitess.merge.job.schema import Evolution
    from airflow_provider_vitess.merge.job.steps import TableSize, TableState
    from airflow_provider_vitess.merge.modes import TargetShape
    from airflow_provider_vitess.merge.plan import MergePlan


class DeltaFormat:
    """Delta through ``access`` (:mod:`..tables` or :mod:`..connect_tables`)."""

    name = "delta"
    catalog: str | None = None

    def __init__(self, access: DeltaAccess) -> None:
        self.access = access

    @classmethod
    def for_session(cls, spark: SparkSession) -> DeltaFormat:
        """Delta for ``spark``'s kind of session (classic or Spark Connect)."""
        return cls(access_for_session(spark))

    # -- state --------------------------------------------------------------------------------

    def state(self, spark: SparkSession, path: str, app_id: str, restores_after: int | None) -> TableState:
        return self.access.table_state(spark, path, app_id, restores_after)

    def size(self, spark: SparkSession, path: str) -> TableSize:
        return self.access.table_size(spark, path)

    def applied(self, spark: SparkSession, path: str, app_id: str, seq: int) -> bool:
        txn = self.access.table_state(spark, path, app_id, None).txn_version
        return txn is not None and txn >= seq

    def activate(self, spark: SparkSession) -> None:
        self.access.activate(spark)

    def check(self, plan: MergePlan, states: Mapping[str, TableState], reads: Mapping[int, str]) -> None:
        check_targets(plan, states, reads)

    @contextmanager
    def marked(self, spark: SparkSession, mark: str) -> Iterator[None]:
        # The session's user metadata: a DataFrame write and a SQL MERGE alike take it.
        spark.conf.set(USER_METADATA_CONF, mark)
        try:
            yield
        finally:
            spark.conf.unset(USER_METADATA_CONF)

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
        apply.write_replace(
            rows, path, keys, app_id, seq, files=files, column_mapping=column_mapping, properties=properties
        )
        return self._last_commit(rows.sparkSession, path)

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
        apply.append(rows, path, app_id, seq, create, column_mapping)
        return self._last_commit(rows.sparkSession, path)

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
        """One file, or a table small enough to rewrite (so to scan whole: no deletion vectors,
        :data:`..apply.REWRITE_BELOW_BYTES`), takes no key ranges, which cost more than the files
        they would skip. Delta answers whether it ran the MERGE; a MERGE it ran without a commit
        version recorded cannot be told from a skip, and is refused."""
        # Delta still copies this source before its MERGE (its materializeSource "auto": the source
        # is no Delta scan). Turning that off was tried: Delta refuses a persisted source then
        # (DELTA_MERGE_SOURCE_CACHED_DURING_EXECUTION), and without the persist the MERGE computes
        # the source twice, which was slower (bench_merge_latency.py over Connect: 4.5-4.8 s a
        # window against 4.1-4.2 s).
        rows = apply.persist(rows)
        try:
            size = size if size is not None else self.access.table_size(spark, path)
            rewrite = size.bytes < apply.REWRITE_BELOW_BYTES
            small = size.files <= 1 or rewrite
            prune = None if small else apply.prune_condition(spark, rows, key, key_type)
            view = f"{view_prefix}{uuid.uuid4().hex}"
            text = statement(sql_table(path), view, rows.columns, prune)
            ran = apply.run_merge(spark, rows, view, text, app_id, seq, rewrite)
        finally:
            rows.unpersist()
        commit = self._last_commit(spark, path)
        if commit is None and ran:
            raise UnsupportedDeltaError(
                f"window {seq} table {table}: Delta ran the MERGE into {path} but the session "
                f"recorded no commit version ({delta_log.LAST_COMMIT_CONF}), so the job cannot tell "
                "the commit from a skip. The window's changes are in the table; a rerun finds them "
                "there. Remedy: run the merge with the Delta Lake the provider pins "
                f"({DELTA_PACKAGE}), on the Spark Connect server too."
            )
        return commit

    def evolve(self, spark: SparkSession, path: str, ev: Evolution, *, widen_in_place: bool) -> None:
        apply.evolve_table(spark, path, ev, widen_in_place=widen_in_place)

    def read(self, spark: SparkSession, path: str) -> DataFrame:
        return spark.read.format("delta").load(path)

    def set_change_data_feed(
        self, spark: SparkSession, path: str, shape: TargetShape, properties: Mapping[str, str]
    ) -> None:
        shapes.set_change_data_feed(spark, path, shape, properties)

    def _last_commit(self, spark: SparkSession, path: str) -> Commit | None:
        """The commit the session's write just made (None: Delta skipped it, the table holds the
        window), its counts from Delta's operation metrics."""
        found = delta_log.last_commit(spark, path, self.access.read_log_file)
        if found is None:
            return None
        m = {k: int(v) for k, v in found.metrics.items() if v.lstrip("-").isdigit()}
        return Commit(
            found.version,
            found.operation,
            rows_inserted=m.get("numTargetRowsInserted", 0),
            rows_updated=m.get("numTargetRowsUpdated", 0),
            rows_deleted=m.get("numTargetRowsDeleted", 0),
            rows_written=m.get("numOutputRows", 0),
            files_touched=m.get("numTargetFilesRemoved", 0)
            + m.get("numTargetDeletionVectorsAdded", 0)
            + m.get("numTargetDeletionVectorsUpdated", 0),
        )

    # -- time travel --------------------------------------------------------------------------

    def read_at(
        self, spark: SparkSession, path: str, version: int, snapshot_id: int | None = None
    ) -> DataFrame:
        return spark.read.format("delta").option("versionAsOf", version).load(path)

    def sql_at(self, path: str, version: int, snapshot_id: int | None = None) -> str:
        return time_travel.sql_at(path, version, self.name, snapshot_id)
