"""What the merge asks of a table format: one small protocol, :class:`TableFormat`.

The merge's mode logic (ordering, look-back, each target mode's rows and statement:
:mod:`..window_step`, :mod:`..strategies`) is the same whatever the tables are stored as; what
differs per format is behind this protocol: a table's state, the exactly-once marker ("was this
window applied"), the writes (each one commit carrying the window's marker), a schema change,
the integrity check before a run writes, and a read at an earlier version (the consistent cut).
Delta (classic session or Spark Connect, chosen inside it) is :mod:`.delta`; Apache Iceberg is
:mod:`.iceberg`. ``tests/job/test_table_formats.py`` runs the same assertions over every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

    from airflow_provider_vitess.merge.job.schema import Evolution
    from airflow_provider_vitess.merge.job.steps import TableSize, TableState
    from airflow_provider_vitess.merge.modes import TargetShape
    from airflow_provider_vitess.merge.plan import MergePlan

# A MERGE's statement from the target table's reference in SQL (the format's: Delta's
# delta.`path`), its source view's name, the source's columns and the window's key ranges over the
# target (a SQL predicate, or None): the mode renders it (.merge_sql), the format names the table.
Statement = Callable[[str, str, Sequence[str], "str | None"], str]


@dataclass(frozen=True)
class Commit:
    """The commit a write made: the table's version that holds the window, and what it did
    (counts a format does not report are 0)."""

    version: int
    operation: str
    rows_inserted: int = 0  # a MERGE's
    rows_updated: int = 0
    rows_deleted: int = 0
    rows_written: int = 0  # a replace's or an append's
    files_touched: int = 0  # data files a MERGE rewrote or marked (deletion vectors)
    # The commit's own id where the format's time travel names commits by one (Iceberg's
    # snapshot id; None for Delta, whose time travel names ``version``): the store records it.
    snapshot_id: int | None = None


class TableFormat(Protocol):
    """A table format the merge writes. ``path``: the table's location (its identity for every
    method); ``app_id`` and ``seq``: the sync's id for the table and the window's seq, the pair
    each write records so that a window is applied once (``applied``)."""

    name: str  # "delta": what the store, the report and the asset events record it as
    # The catalog whose SQL names the tables where the format names them by a catalog of the
    # user's (an Iceberg JDBC catalog); None: by their locations.
    catalog: str | None

    def state(self, spark: SparkSession, path: str, app_id: str, restores_after: int | None) -> TableState:
        """The table as it is: whether it exists, its schema, version and properties (those
        ``merge.modes.SHAPE_PROPERTIES`` names), column mapping, the highest window seq of
        ``app_id`` it holds (``txn_version``, None: none), and with ``restores_after`` the
        versions after it that rolled the table back. A missing table is ``exists=False``, not
        an error."""
        ...

    def size(self, spark: SparkSession, path: str) -> TableSize:
        """The data files of the table's latest version and their bytes."""
        ...

    def applied(self, spark: SparkSession, path: str, app_id: str, seq: int) -> bool:
        """Whether the table holds window ``seq`` of ``app_id`` (or a later one): the
        exactly-once marker. A write of a window it holds commits nothing."""
        ...

    def activate(self, spark: SparkSession) -> None:
        """Make ``spark`` usable from the calling thread (tables are worked on in threads,
        :mod:`..sessions`)."""
        ...

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
        """Create or overwrite the table with ``rows`` (about ``files`` files, laid out by
        ``keys``; ``properties``: the table's), as one commit marked (app id, seq). None: the
        table holds that window already, nothing was written."""
        ...

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
        """Append ``rows`` as one commit marked (app id, seq); ``create``: the table does not
        exist yet and is created with these properties. None: already applied."""
        ...

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
        """MERGE ``rows`` into the table with ``statement`` (from :mod:`..merge_sql`) as one
        commit marked (app id, seq); ``table``: the source table's name (for errors); ``key`` (of
        type ``key_type``) bounds the files the MERGE reads, ``size`` is the table's if known.
        None: already applied, nothing was written."""
        ...

    def read(self, spark: SparkSession, path: str) -> DataFrame:
        """The table's rows as they are (a re-snapshot rewrites them: :mod:`..resnapshot`)."""
        ...

    def set_change_data_feed(
        self, spark: SparkSession, path: str, shape: TargetShape, properties: Mapping[str, str]
    ) -> None:
        """Turn the table's change feed on or off when ``shape`` asks otherwise than its
        ``properties`` say (its own commit before the window's; repeated, a no-op)."""
        ...

    def evolve(self, spark: SparkSession, path: str, ev: Evolution, *, widen_in_place: bool) -> None:
        """The step's schema changes (added, dropped, widened columns) before it writes; each
        repeated is a no-op. A widening the format cannot do in place is refused before the first
        change (no half-changed table), unless ``widen_in_place`` is False: then the table is
        rewritten with the wider type."""
        ...

    def check(self, plan: MergePlan, states: Mapping[str, TableState], reads: Mapping[int, str]) -> None:
        """Refuse (``TargetIntegrityError``) a table that is not what the sync last wrote
        (rolled back, replaced, recreated, another writer's, a window of the plan from another
        read: ``reads``, per seq, the plan's, :mod:`..marks`), before anything is written."""
        ...

    def marked(self, spark: SparkSession, mark: str) -> AbstractContextManager[None]:
        """The commits ``spark`` makes in the block carry ``mark`` (:mod:`..marks`) in their
        metadata, which :meth:`state` reads back for the windows committed since the version
        the sync last wrote."""
        ...

    def read_at(
        self, spark: SparkSession, path: str, version: int, snapshot_id: int | None = None
    ) -> DataFrame:
        """The table as it was at ``version`` (time travel: the consistent cut); ``snapshot_id``:
        that version's commit id where the format has one and it was recorded (:class:`Commit`),
        else the format finds it, if it can."""
        ...

    def sql_at(self, path: str, version: int, snapshot_id: int | None = None) -> str:
        """Spark SQL that reads the table at ``version`` (:func:`.time_travel.sql_at`: the same
        text without a session); ValueError where it cannot be written without a session."""
        ...
