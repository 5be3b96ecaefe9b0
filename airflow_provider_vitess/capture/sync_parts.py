"""The parts of a sync's description (:class:`~airflow_provider_vitess.capture.sync.VitessSync`)
that are not its tables: the read budget, the change wait, the target defaults, the capture
settings and the merge backend (spark-submit or Spark Connect, a named choice). Frozen pydantic
models without rules of their own beyond their types: the rules run in ``capture/sync.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator

from airflow_provider_vitess.capture.snapshot import CHECKPOINT_EVERY_ROWS
from airflow_provider_vitess.merge.modes import DEFAULT_PREFIX, ModeOptions
from airflow_provider_vitess.merge.plan import catalog_problem
from airflow_provider_vitess.vstream.copy_stall import COPY_STALL_SECONDS

__all__ = [
    "Backend",
    "CaptureSettings",
    "ChangeWait",
    "FrozenModel",
    "Names",
    "ReadBudget",
    "SparkConnect",
    "SparkSubmit",
    "TargetDefaults",
    "as_plain",
]


def _names(value: Any) -> Any:
    """Column names as a list, or as comma-separated text (as the operators take them)."""
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    return value


Names = Annotated[tuple[str, ...], BeforeValidator(_names)]


class FrozenModel(BaseModel):
    # Frozen: a sync's description does not change under the tasks built from it; forbid: a
    # misspelt setting fails the DAG's parse instead of being ignored.
    # hide_input_in_errors: an error must not print the settings (storage_options may hold keys).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


def as_plain(value: Any) -> Any:
    """Tuples as lists, as the operators' (JSON-rendered) arguments hold them."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: as_plain(v) for k, v in value.items()}
    return value


class ReadBudget(FrozenModel):
    """How much a catch-up run reads."""

    max_events: int | None = Field(
        default=None,
        description="end a catch-up window after about this many row events (at a transaction "
        "boundary); the next window starts there. Not for a group's part of a window "
        "(`capture_parallelism`): each group reads to the window's stop",
    )
    max_seconds: float | None = Field(
        default=None,
        description="the run's reading time (default: half the schedule's interval; none: read it all)",
    )


class ChangeWait(FrozenModel):
    """Whether and how a run waits for a change before it catches up."""

    wait_for_changes: StrictBool = Field(default=True, description="put the sensor in front of the catch-up")
    sensor_timeout: float | None = Field(
        default=None,
        description="seconds to wait for a change (default 60, 3600 with `on_changes`); none: "
        "the rest of the run is skipped (only if the sensor read up to the position it started at)",
    )
    deferrable: StrictBool = Field(default=True, description="the sensor waits in the triggerer")
    on_changes: StrictBool = Field(
        default=False,
        description="run on the source's changes instead of a clock: `@continuous`, each run's "
        "deferred sensor waits in the triggerer until a table changes, then the run catches up "
        "and merges at once. Replaces the schedule; needs the deferrable sensor "
        "([design](design.md#event-driven-syncs))",
    )
    follow_seconds: float | None = Field(
        default=None,
        gt=0,
        description="with `on_changes`: once its sensor sees a change, a run catches up and "
        "merges in one task (`follow`), window after window, for up to this many seconds, and "
        "ends when no change came for a minute; fresh in seconds on a busy source, at the cost "
        "of a worker slot while it follows. Needs a Spark Connect merge to pay off "
        "([design](design.md#event-driven-syncs))",
    )
    lag_threshold: int | None = Field(
        default=None,
        description="also go on when a shard is more than this many transactions (of any table) "
        "past the committed position: keeps a quiet sync within the binlogs the server keeps",
    )


class TargetDefaults(FrozenModel):
    """The Delta tables' shape, unless a table's own settings say otherwise."""

    mode: str = Field(
        default="mirror",
        description="`mirror`, `soft_delete`, `history` or `changelog` "
        "([target modes](target-modes.md)); a table keeps the mode it was built in",
    )
    metadata_columns: StrictBool | None = Field(
        default=None,
        description="the `<prefix>*` metadata columns (default: on in the new modes, off in `mirror`)",
    )
    metadata_prefix: str = Field(default=DEFAULT_PREFIX, description="the metadata columns' prefix")
    change_data_feed: StrictBool = Field(default=False, description="turn on Delta's Change Data Feed")
    table_features: Names = Field(
        default=(),
        description="Delta features that lock out readers: `type_widening`, `deletion_vectors` "
        "(none by default: every Delta reader reads the tables; [reading the tables]"
        "(reading-the-tables.md))",
    )
    table_format: Literal["delta", "iceberg"] = Field(
        default="delta",
        description="`delta` or `iceberg` ([Iceberg targets](iceberg.md): Spark 4.1, through spark-submit)",
    )
    iceberg_catalog_conn_id: str | None = Field(
        default=None,
        description="a `postgres` connection to an Iceberg JDBC catalog's database (Iceberg only; "
        "default: a Hadoop catalog at the tables' locations)",
    )

    @model_validator(mode="after")
    def _catalog_is_icebergs(self) -> TargetDefaults:
        problem = catalog_problem(self.table_format, self.iceberg_catalog_conn_id)
        if problem:
            raise ValueError(problem)
        return self

    def options(self) -> ModeOptions:
        return ModeOptions(
            self.mode, self.metadata_columns, self.metadata_prefix, self.change_data_feed, self.table_features
        )


class CaptureSettings(FrozenModel):
    """The capture tasks' settings beyond the tables'."""

    zero_date_policy: str = Field(
        default="null", description="zero or invalid MySQL dates: `null`, `epoch` or `error`"
    )
    storage_options: dict[str, Any] | None = Field(
        default=None, description="fsspec options for `staging_location` (win over the `aws_conn_id` ones)"
    )
    spill_dir: str | None = Field(
        default=None,
        description="where a read spills (default `[vitess] spill_dir`, else the temporary directory)",
    )
    heartbeat_interval: int = Field(default=1, description="seconds between vtgate heartbeats on the stream")
    allow_all_columns_key: StrictBool = Field(
        default=False, description='accept "all columns" as the key of a table without a usable one'
    )
    minimize_skew: StrictBool = Field(default=False, description="pass VStream's MinimizeSkew flag to vtgate")
    checkpoint_every_rows: int = Field(
        default=CHECKPOINT_EVERY_ROWS, description="how often a long copy records where to resume"
    )
    copy_stall_timeout: float = Field(
        default=COPY_STALL_SECONDS,
        description="seconds a copying shard may send no row before the snapshot fails",
    )


class SparkSubmit(FrozenModel):
    """The merge job runs with spark-submit (one Spark application per merge)."""

    backend: Literal["spark_submit"] = Field(
        default="spark_submit", description="names the backend (in JSON: chooses the model)"
    )
    conn_id: str = Field(default="spark_default", description="the Spark connection (master, deploy mode)")
    conf: dict[str, Any] = Field(default_factory=dict, description="Spark settings (`--conf`)")
    packages: str | None = Field(default=None, description="Maven packages (default: the Delta package)")
    spark_binary: str | None = Field(default=None, description="the spark-submit to run (default: from PATH)")
    env_vars: dict[str, Any] | None = Field(default=None, description="the driver's environment")
    jars_cache_dir: str | None = Field(
        default=None, description="where resolved jars (and a local driver's class-data archive) are kept"
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="further `SparkSubmitHook` arguments (`executor_memory`, `jars`, ...)",
    )

    def merge_arguments(self) -> dict[str, Any]:
        given = self.model_dump(exclude={"backend", "arguments"}, exclude_none=True)
        return {**given, **self.arguments}


class SparkConnect(FrozenModel):
    """The merge runs in the task's process against a Spark Connect server (`sc://`): no
    spark-submit and no JVM per merge."""

    backend: Literal["spark_connect"] = Field(
        default="spark_connect", description="names the backend (in JSON: chooses the model)"
    )
    conn_id: str = Field(default="spark_connect_default", description="a `spark_connect` connection")
    conf: dict[str, Any] = Field(
        default_factory=dict, description="session settings (`spark.sql.*`, `spark.databricks.delta.*`)"
    )

    def merge_arguments(self) -> dict[str, Any]:
        return {"spark_connect_conn_id": self.conn_id, "conf": dict(self.conf)}


Backend = Annotated[SparkSubmit | SparkConnect, Field(discriminator="backend")]
