"""One sync, described once: :class:`VitessSync`, its tables as :class:`TableSpec` each.

A frozen, validated value (pydantic, no Airflow): the DAG factory builds its tasks from it, and
it round-trips through JSON (``model_dump(mode="json")`` -> ``model_validate``) for operators
and XCom. Each per-table setting lives on its table's :class:`TableSpec`; the operators' flat
per-table mappings (``hash_columns={"t": [...]}``) are derived from it in one place
(:meth:`VitessSync.capture_arguments`, :meth:`VitessSync.merge_arguments`).

Validation reuses the rules the operators apply (key overrides, column control, zero dates,
target modes, the shard-group split, the sync id): there is no second copy of a rule here, only
the field it is applied to, named in the error (``tables[corder].hash_columns: ...``). The
errors are the rules' own (``ColumnChoiceError``, ``TargetModeError``, ...): pydantic reports
them inside a ``ValidationError``, and :func:`domain_error` gives back the original.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from airflow_provider_vitess.capture.columns import parse as parse_columns
from airflow_provider_vitess.capture.columns import require_salt
from airflow_provider_vitess.capture.group_layout import group_split
from airflow_provider_vitess.capture.spec import as_tables, check_sync_id
from airflow_provider_vitess.capture.sync_parts import (
    Backend,
    CaptureSettings,
    ChangeWait,
    FrozenModel,
    Names,
    ReadBudget,
    SparkConnect,
    SparkSubmit,
    TargetDefaults,
    as_plain,
)
from airflow_provider_vitess.exceptions import SyncSettingsError, VitessProviderError
from airflow_provider_vitess.keys import KeyOverrides
from airflow_provider_vitess.merge.modes import (
    TARGET_KEYS,
    check_features,
    check_prefix,
    mode_of,
)
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicy

__all__ = [
    "CaptureSettings",
    "ChangeWait",
    "ReadBudget",
    "SparkConnect",
    "SparkSubmit",
    "TableSpec",
    "TargetDefaults",
    "VitessSync",
    "domain_error",
    "retitled",
]


class TableSpec(FrozenModel):
    """One table of the sync and every setting of its own (None: the sync's default)."""

    name: str = Field(description="the source table's name")
    key_columns: Names | None = Field(
        default=None, description="the unique key to stage, where the table has no usable one"
    )
    key_overrides: dict[str, Names] | None = Field(
        default=None,
        description="VReplication's key overrides: `source_unique_key_columns`, "
        "`target_unique_key_columns`, `source_unique_key_target_columns` (renames included)",
    )
    include_columns: Names | None = Field(
        default=None,
        description="only these columns are read, pushed into the VStream filter: the others never "
        "leave vttablet",
    )
    exclude_columns: Names | None = Field(
        default=None,
        description="every column but these is read (same filter); not with `include_columns`; key "
        "columns (and the PRIMARY KEY) cannot be left out",
    )
    hash_columns: Names | None = Field(
        default=None,
        description="staged, and merged, as `sha256(salt + value)` in hex (NULL stays NULL); not a "
        "key column; needs `hash_salt_conn_id` ([column control](column-control.md))",
    )
    zero_date_policy: str | None = Field(
        default=None, description="zero or invalid MySQL dates: `null`, `epoch` or `error`"
    )
    # The target settings: named as the merge's ``targets[table]`` keys (merge/modes.TARGET_KEYS).
    mode: str | None = Field(
        default=None, description="target mode: `mirror`, `soft_delete`, `history` or `changelog`"
    )
    path: str | None = Field(
        default=None, description="the Delta table's location (default `<target_location>/<name>`)"
    )
    renames: dict[str, str] | None = Field(default=None, description="source column -> Delta column")
    metadata_columns: StrictBool | None = Field(
        default=None, description="add the `<prefix>*` metadata columns"
    )
    change_data_feed: StrictBool | None = Field(default=None, description="turn on Delta's Change Data Feed")
    table_features: Names | None = Field(
        default=None, description="reader-locking Delta features: `type_widening`, `deletion_vectors`"
    )

    def target(self) -> dict[str, Any]:
        """The merge's ``targets[table]`` entry: the target settings given."""
        return {k: as_plain(getattr(self, k)) for k in sorted(TARGET_KEYS) if getattr(self, k) is not None}

    def capture_settings(self) -> list[str]:
        """The names of the capture settings given (a former table may have none)."""
        return [k for k in _CAPTURE_OPTIONS if getattr(self, k) is not None]


# The per-table capture settings, each an operator's per-table mapping of the same name.
_CAPTURE_OPTIONS = (
    "key_columns",
    "key_overrides",
    "include_columns",
    "exclude_columns",
    "hash_columns",
    "zero_date_policy",
)


def _table(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


def _tables(value: Any) -> Any:
    """Tables as TableSpecs, plain names or text (``"customer, corder"``) accepted."""
    if isinstance(value, str):
        value = as_tables(value)
    return tuple(_table(t) for t in value) if isinstance(value, list | tuple) else value


Tables = Annotated[tuple[TableSpec, ...], BeforeValidator(_tables)]


def _named(where: str | None, check: Callable[[], Any]) -> Any:
    """Run a rule; its error names ``where`` (the field) in front of the rule's own words
    (None: the rule names it itself). Raised as :class:`SyncSettingsError`, a ``ValueError``,
    so that pydantic reports every refusal alike, inside its ``ValidationError``; the rule's own
    error (its class, the named message) is its cause, for :func:`domain_error`."""
    try:
        return check()
    except (VitessProviderError, ValueError) as exc:
        # A rule that names the field itself (``capture_parallelism ...``) is not named twice.
        message = f"{where}: {exc}" if where and not str(exc).startswith(where) else str(exc)
        raise SyncSettingsError(message) from retitled(exc, message)


def retitled(exc: Exception, message: str) -> Exception:
    """``exc``'s class with ``message`` (SyncSettingsError for a class that takes other arguments)."""
    try:
        return type(exc)(message)
    except TypeError:
        return SyncSettingsError(message)


def domain_error(exc: ValidationError) -> Exception:
    """The rule's own error inside pydantic's (``ColumnChoiceError``, ...), for callers that
    catch those; ``exc`` itself when it holds several errors or a type error of pydantic's."""
    errors = exc.errors()
    if len(errors) == 1:
        inner = (errors[0].get("ctx") or {}).get("error")
        if isinstance(inner, Exception):
            return inner.__cause__ if isinstance(inner.__cause__, Exception) else inner
    return exc


class VitessSync(FrozenModel):
    """A sync: which tables of which keyspace, where they stage and land, and how it runs."""

    keyspace: str = Field(description="the Vitess keyspace")
    tables: Tables = Field(description="its tables: names or `TableSpec`s (text: comma-separated)")
    staging_location: str = Field(description="local path or fsspec URL where windows are staged as Parquet")
    target_location: str = Field(description="Delta tables go to `<target_location>/<table>`")
    sync_id: str | None = Field(default=None, description="names the sync (default: the DAG id)")
    former_tables: Tables = Field(
        (),
        description="tables that left the sync with windows still to merge: only their target "
        "settings are read",
    )
    vitess_conn_id: str = Field(default="vitess_default", description="the `vitess` connection")
    checkpoint_conn_id: str | None = Field(
        default=None, description="the checkpoint store's connection (default: SQLite in `$AIRFLOW_HOME`)"
    )
    aws_conn_id: str | None = Field(default=None, description="an `aws` connection for `s3a://` locations")
    hash_salt_conn_id: str | None = Field(
        default=None, description="the connection whose password salts `hash_columns`"
    )
    budget: ReadBudget = Field(default=ReadBudget(), description="the catch-up's read budget")
    wait: ChangeWait = Field(default=ChangeWait(), description="the wait for changes")
    target: TargetDefaults = Field(default=TargetDefaults(), description="the tables' default shape")
    capture: CaptureSettings = Field(default=CaptureSettings(), description="the capture tasks' settings")
    merge: Backend = Field(default=SparkSubmit(), description="where the merge job runs")
    spark_history_url: str | None = Field(
        default=None, description="a Spark history server, for the Spark UI link"
    )
    freshness_sla: float | None = Field(
        default=None,
        description="seconds: a catch-up window committed while the data is older is a breach: "
        "the merge warns, returns `breached: true` and succeeds; the DAG gets a deadline alert "
        "([freshness](design.md#freshness-as-of))",
    )
    capture_parallelism: int | tuple[str, ...] = Field(
        default=1,
        description="N > 1: the shards, sorted by key range, split into N groups; or key ranges "
        "tiling the keyspace (`['-80', '80-']`). Snapshot and catch-up are planned once and "
        "mapped over the groups, each retried alone ([shard groups](design.md#shard-groups))",
    )

    @model_validator(mode="after")
    def _check(self) -> VitessSync:
        if self.sync_id is not None:
            _named("sync_id", lambda: check_sync_id(str(self.sync_id)))
        names = [t.name for t in self.tables]
        if not names:
            raise SyncSettingsError("tables: no tables given; name at least one")
        _unique("tables", names)
        _unique("former_tables", [t.name for t in self.former_tables])
        for spec in self.tables:
            _check_table(self, spec)
        for spec in self.former_tables:
            _check_former(spec, names)
        _named("capture_parallelism", lambda: group_split(self.capture_parallelism))
        _named(None, lambda: ZeroDatePolicy.parse(self.capture.zero_date_policy, "capture.zero_date_policy"))
        _named(None, lambda: mode_of(self.target.mode, "target.mode"))
        _named(None, lambda: check_prefix(self.target.metadata_prefix, "target.metadata_prefix"))
        _named(None, lambda: check_features(self.target.table_features, "target.table_features"))
        if self.wait.on_changes and not (self.wait.wait_for_changes and self.wait.deferrable):
            raise SyncSettingsError(
                "wait.on_changes: on_changes=True waits for changes with the deferrable sensor; "
                "drop wait_for_changes=False / deferrable=False (or on_changes)"
            )
        if self.wait.follow_seconds is not None:
            if not self.wait.on_changes:
                raise SyncSettingsError(
                    "wait.follow_seconds: a run follows the source after its sensor saw a change; "
                    "set on_changes=True too (or drop follow_seconds)"
                )
            if group_split(self.capture_parallelism) != 1:
                raise SyncSettingsError(
                    "wait.follow_seconds: the follow task reads in one process; drop "
                    "capture_parallelism (or follow_seconds)"
                )
        return self

    # -- what the tasks are built from: the per-table mappings derived in this one place --

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def per_table(self, option: str) -> dict[str, Any]:
        """One per-table setting as the operators take it: ``{table: value}``, given ones only."""
        return {t.name: as_plain(getattr(t, option)) for t in self.tables if getattr(t, option) is not None}

    def targets(self) -> dict[str, dict[str, Any]] | None:
        """The merge's ``targets``: each table's target settings (former tables' too)."""
        given = {t.name: t.target() for t in (*self.tables, *self.former_tables) if t.target()}
        return given or None

    def capture_arguments(self, sync_id: str) -> dict[str, Any]:
        """Every capture task's arguments (snapshot, catch-up, their group variants)."""
        return {
            "sync_id": sync_id,
            "keyspace": self.keyspace,
            "tables": self.table_names,
            "staging_location": self.staging_location,
            "vitess_conn_id": self.vitess_conn_id,
            "checkpoint_conn_id": self.checkpoint_conn_id,
            "aws_conn_id": self.aws_conn_id,
            "key_overrides": self.per_table("key_overrides"),
            "key_columns": self.per_table("key_columns"),
            "zero_date_policy": self.capture.zero_date_policy,
            "zero_date_policies": self.per_table("zero_date_policy"),
            "include_columns": self.per_table("include_columns"),
            "exclude_columns": self.per_table("exclude_columns"),
            "hash_columns": self.per_table("hash_columns"),
            "hash_salt_conn_id": self.hash_salt_conn_id,
            "storage_options": self.capture.storage_options,
            "spill_dir": self.capture.spill_dir,
            "heartbeat_interval": self.capture.heartbeat_interval,
            "allow_all_columns_key": self.capture.allow_all_columns_key,
        }

    def snapshot_arguments(self) -> dict[str, Any]:
        """The snapshot tasks' own arguments, beyond :meth:`capture_arguments`."""
        return {
            "target_location": self.target_location,
            "targets": self.targets(),
            "checkpoint_every_rows": self.capture.checkpoint_every_rows,
            "copy_stall_timeout": self.capture.copy_stall_timeout,
        }

    def merge_arguments(self, sync_id: str) -> dict[str, Any]:
        """The merge tasks' arguments, the backend's included."""
        targets = self.targets()
        return {
            "sync_id": sync_id,
            "target_location": self.target_location,
            "checkpoint_conn_id": self.checkpoint_conn_id,
            "aws_conn_id": self.aws_conn_id,
            "tables": self.table_names,  # each Delta table an outlet Asset
            "freshness_sla": self.freshness_sla,
            "target_mode": self.target.mode,
            "metadata_columns": self.target.metadata_columns,
            "metadata_prefix": self.target.metadata_prefix,
            "change_data_feed": self.target.change_data_feed,
            "table_features": list(self.target.table_features),
            "table_format": self.target.table_format,
            "iceberg_catalog_conn_id": self.target.iceberg_catalog_conn_id,
            **({"targets": targets} if targets is not None else {}),
            **({"spark_history_url": self.spark_history_url} if self.spark_history_url else {}),
            **self.merge.merge_arguments(),
        }


def _unique(where: str, names: list[str]) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SyncSettingsError(f"{where}: table(s) {twice} given more than once; give each once")


def _check_table(sync: VitessSync, spec: TableSpec) -> None:
    """One table's settings, each by the rule the operators apply to it."""
    where, name = f"tables[{spec.name}]", spec.name
    if spec.key_overrides is not None:
        _named(f"{where}.key_overrides", lambda: KeyOverrides.from_mapping(spec.key_overrides))
    if spec.zero_date_policy is not None:
        _named(None, lambda: ZeroDatePolicy.parse(str(spec.zero_date_policy), f"{where}.zero_date_policy"))
    inc, exc, hashed = spec.include_columns, spec.exclude_columns, spec.hash_columns
    for option, value in (("include_columns", inc), ("exclude_columns", exc), ("hash_columns", hashed)):
        if value is not None:  # each list alone first: its error names it
            _named(f"{where}.{option}", partial(parse_columns, [name], **{option: {name: value}}))
    if inc is not None and exc is not None:
        _named(f"{where}.exclude_columns", lambda: parse_columns([name], {name: inc}, {name: exc}))
    if hashed:
        given = ({name: inc} if inc is not None else None, {name: exc} if exc is not None else None)
        _named(f"{where}.hash_columns", lambda: parse_columns([name], *given, {name: hashed}))
        _named(None, lambda: require_salt(True, sync.hash_salt_conn_id, f"{where}.hash_columns"))
    _check_target(spec, where)


def _check_target(spec: TableSpec, where: str) -> None:
    """The target settings' rules (merge/modes.py); the flags are strict booleans already."""
    if spec.mode is not None:
        _named(None, lambda: mode_of(spec.mode, f"{where}.mode"))
    if spec.table_features is not None:
        _named(None, lambda: check_features(spec.table_features, f"{where}.table_features"))


def _check_former(spec: TableSpec, names: list[str]) -> None:
    where = f"former_tables[{spec.name}]"
    if spec.name in names:
        raise SyncSettingsError(f"{where}: the table is among the sync's tables; list it once, in tables")
    if given := spec.capture_settings():
        raise SyncSettingsError(
            f"{where}: {given} are capture settings of a table the sync no longer reads; give "
            "only its target settings (mode, path, renames, ...), or list it in tables"
        )
    _check_target(spec, where)
