"""``VitessMergeOperator``: apply the sync's staged windows to Delta with spark-submit, or on
a long-running Spark Connect server (``spark_connect_conn_id``).

Thin: :class:`~airflow_provider_vitess.merge.runner.MergeRunner` drives the window state
machine on the apply side (under the sync's lock: STAGED -> merged by the Spark job -> MERGED
-> COMMITTED) and builds the merge's one plan; this operator gives it a backend that runs the
job (:mod:`.merge_backends`: spark-submit of ``merge/job/main.py``, or Spark Connect, each with
its own ``on_kill``), and turns the outcome into the task's: the report as XCom, the committed
VGTID under the key ``committed_vgtid``, asset events and OpenLineage from the same plan, a
refused plan or staged input as a failure without retries (see ``exceptions.is_permanent``).

Delta's transaction ids (sync + table, window seq) make a resubmitted window a no-op, so a task
killed after the Delta commit but before MERGED was recorded is simply run again. On any
failure the window stays STAGED and the checkpoint does not move.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_vitess.checkpoints.freshness import seconds_behind, window_breached
from airflow_provider_vitess.checkpoints.store import CheckpointStore
from airflow_provider_vitess.connections import iceberg_catalog, open_store, refuse_single_host, s3_settings
from airflow_provider_vitess.lineage import assets as lineage_assets
from airflow_provider_vitess.lineage.openlineage import MergeLineage, merge_facets
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.merge.jar_cache import default_cache_dir
from airflow_provider_vitess.merge.modes import DEFAULT_PREFIX, ModeOptions, check_features
from airflow_provider_vitess.merge.plan import TABLE_FORMATS, MergePlanError, catalog_problem, format_problem
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner
from airflow_provider_vitess.merge.spark_conf import BASE_CONF, DELTA_PACKAGE, connect_session_conf
from airflow_provider_vitess.operators._sync import accepts_sync, merge_parts
from airflow_provider_vitess.operators.merge_backends import (
    SUBMIT_ARGS,
    TEMPLATED_SUBMIT_ARGS,
    SparkConnectMerge,
    SparkSubmitMerge,
    refuse_newer_submit_args,
)
from airflow_provider_vitess.plugins.links import DeltaTableLink, SparkUILink, VitessSyncStatusLink
from airflow_provider_vitess.utils.failures import task_failures
from airflow_provider_vitess.utils.task import emit_metrics, holder


def default_application() -> str:
    """The merge job's file, inside the installed provider (what spark-submit runs)."""
    return str(Path(__file__).resolve().parents[1] / "merge" / "job" / "main.py")


def _default_spark_binary() -> str | None:
    """``spark-submit`` from PATH, else the one pyspark installed next to this Python."""
    if shutil.which("spark-submit"):
        return None
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else None


def _connect_conf(conn_id: str | None, conf: Mapping[str, Any], submit_args: Sequence[str]) -> dict[str, str]:
    """A Spark Connect merge's session settings: the SQL and Delta ones of ``conf``. What a
    Connect session cannot take (other settings, spark-submit's arguments) fails the DAG's parse,
    named, rather than being ignored. Without ``conn_id`` (spark-submit): none."""
    if not conn_id:
        return {}
    applied, refused = connect_session_conf(conf)
    if refused or submit_args:
        names = ", ".join([*(f"conf {k!r}" for k in refused), *sorted(submit_args)])
        raise MergePlanError(
            f"the merge runs on Spark Connect ({conn_id!r}), which takes only session settings "
            f"(spark.sql.*, spark.databricks.delta.*) and no spark-submit arguments: {names} would "
            "do nothing there. Set executor, jar and static settings on the Connect server "
            "itself, or drop spark_connect_conn_id to merge with spark-submit"
        )
    return applied


class VitessMergeOperator(BaseOperator):
    """Merge the sync's staged window into Delta tables and commit the checkpoint.

    :param sync_id: the sync whose window to merge (as given to the capture operators).
    :param target_location: Delta tables go to ``<target_location>/<table>`` (any URI Spark
        writes to: a local path, ``s3a://``, ``abfss://``...).
    :param targets: per table overrides: ``{"table": {"path": ..., "renames": {src: dst},
        "mode": ..., "metadata_columns": bool, "change_data_feed": bool, "table_features": [...]}}``.
    :param target_mode: the sync-wide target mode, ``mirror`` (default), ``soft_delete``,
        ``history`` or ``changelog`` (``docs/target-modes.md``); ``targets[table]["mode"]``
        overrides it per table. A Delta table keeps the mode it was built with: asking another
        fails the merge, nothing written (remedy: a new target location and a re-snapshot).
    :param metadata_columns: add ``<prefix>op``, ``commit_ts``, ``window_seq`` and ``synced_at``
        (default: on in the new modes, off in ``mirror``).
    :param metadata_prefix: the metadata columns' prefix (default ``_vitess_``); a source column
        with one of their names fails the merge, naming it.
    :param change_data_feed: turn on Delta's Change Data Feed (``delta.enableChangeDataFeed``) on
        the tables, so downstream jobs can read them incrementally (``table_changes``).
    :param table_features: Delta features that lock out readers, chosen for the tables
        (``targets[table]["table_features"]`` per table): ``type_widening`` (widen a column in
        place instead of rewriting the table) and ``deletion_vectors`` (a MERGE marks changed rows
        instead of rewriting their files). None by default: every Delta reader reads the tables
        (``docs/reading-the-tables.md``).
    :param table_format: ``delta`` (default) or ``iceberg``: Apache Iceberg tables at the same
        locations, read as a Hadoop catalog's (``docs/iceberg.md``); on Spark 4.1, refused by name
        on a Spark line without an Iceberg runtime.
    :param iceberg_catalog_conn_id: a ``postgres`` connection to the database of an Iceberg JDBC
        catalog that registers the tables by name (extra ``catalog``: its name, default the
        connection id; ``warehouse``; ``sslmode``); without one, each table is a Hadoop catalog's
        at its location. Iceberg only.
    :param checkpoint_conn_id: the Airflow connection of the checkpoint store (default SQLite).
    :param jars_cache_dir: where the jars resolved for ``packages`` are remembered, so that only
        the first submit resolves them and later ones pass ``--jars`` (default
        ``~/.cache/airflow-provider-vitess/spark-jars`` on the worker); on a local master also
        the driver JVM's class-data archive, in ``class-archives/`` (``merge/class_archive.py``).
    :param conn_id: the Spark connection (``local[*]``, ``spark://host:7077``, YARN, k8s).
    :param spark_connect_conn_id: a ``spark_connect`` connection (the Spark provider's
        ``SparkConnectHook``): the merge then runs in the task's process against that server
        (``sc://``), with no spark-submit and no JVM per window (see
        :mod:`airflow_provider_vitess.merge.job.connect`; ``dev/spark_connect.sh`` starts one). The
        server reads ``s3a://`` with S3A settings of its own; ``aws_conn_id`` then serves the
        task's reads of the manifests.
    :param spark_history_url: a Spark history server (``http://host:18080``): the task's "Spark
        UI" link then opens the merge's application there.
    :param freshness_sla: seconds: the data may be at most this old once a catch-up window is
        committed. Past it the task logs a warning and its result says ``"breached": true``; it
        still succeeds, and emits its asset events (``checkpoints/freshness.py``). The objective
        is also kept for the status page, and the DAG factory makes it the DAG's deadline alert.
    :param tables: the sync's tables, when known where the DAG is defined: each Delta table is
        then an outlet Asset, and a window that changed a table emits an event for it (extra:
        sync id, window seq and kind, committed VGTID, rows inserted/updated/deleted).
    :param aws_conn_id: an Airflow ``aws`` connection for ``s3a://`` staging and Delta tables:
        its keys reach the job through the spark-submit process's environment only (see
        :mod:`airflow_provider_vitess.object_storage`), so with YARN or k8s masters, whose
        spark-submit puts that environment on its command line, leave it unset and give the
        cluster its own S3 credentials.

    Other arguments are spark-submit's, as ``SparkSubmitOperator`` takes them (``conn_id``,
    ``executor_memory``, ``jars``, ...): they go to the Spark provider's ``SparkSubmitHook``,
    those it templates templated here too. The Delta package (with Hadoop's S3A for S3
    locations) and session settings are added to ``packages``/``conf`` unless given. Returns
    (XCom) the merge summary (with ``as_of``, ``seconds_behind`` and ``breached``); the committed
    VGTID is also pushed under the key ``committed_vgtid``.
    """

    template_fields: Sequence[str] = (
        "application",
        *TEMPLATED_SUBMIT_ARGS,
        "sync_id",
        "target_location",
        "targets",
        "checkpoint_conn_id",
        "spark_history_url",
    )
    template_fields_renderers = {"conf": "json", "env_vars": "json", "targets": "json"}  # noqa: RUF012
    operator_extra_links = (VitessSyncStatusLink(), DeltaTableLink(), SparkUILink())
    ui_color = "#e4f0ff"

    @accepts_sync(merge_parts)
    def __init__(
        self,
        *,
        # Optional in the signature only so that ``sync=`` may give them (operators/_sync.py).
        sync_id: str | None = None,
        target_location: str | None = None,
        targets: Mapping[str, Mapping[str, Any]] | None = None,
        checkpoint_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        jars_cache_dir: str | None = None,
        application: str | None = None,
        packages: str | None = None,
        conf: dict[str, Any] | None = None,
        spark_binary: str | None = None,
        env_vars: dict[str, Any] | None = None,
        spark_history_url: str | None = None,
        freshness_sla: float | None = None,
        tables: Sequence[str] | None = None,
        spark_connect_conn_id: str | None = None,
        target_mode: str = "mirror",
        metadata_columns: bool | None = None,
        metadata_prefix: str = DEFAULT_PREFIX,
        change_data_feed: bool = False,
        table_features: Sequence[str] = (),
        table_format: str = "delta",
        iceberg_catalog_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if sync_id is None or target_location is None:
            raise TypeError("VitessMergeOperator needs sync_id and target_location, or sync= (a VitessSync)")
        submit_only = {
            "application": application,
            "packages": packages,
            "spark_binary": spark_binary,
            "env_vars": env_vars,
            "jars_cache_dir": jars_cache_dir,
        }
        self.connect_conf = _connect_conf(
            spark_connect_conn_id,
            conf or {},
            [
                *(k for k, v in submit_only.items() if v is not None),
                # The DAG factory names the default Spark connection whatever the backend.
                *(
                    k
                    for k in kwargs
                    if k in SUBMIT_ARGS and not (k == "conn_id" and kwargs[k] == "spark_default")
                ),
            ],
        )
        python = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        binary = spark_binary or _default_spark_binary()
        submit = {k: kwargs.pop(k) for k in list(kwargs) if k in SUBMIT_ARGS}
        refuse_newer_submit_args(submit)
        super().__init__(**kwargs)
        self.application = application or default_application()
        # SparkSubmitHook's arguments: the templated ones as attributes Airflow renders.
        self.conf: dict[str, Any] = {**BASE_CONF, **(conf or {})}
        self.packages: str | None = packages or DELTA_PACKAGE
        # The driver runs this Python (the provider is installed in it), unless told otherwise.
        self.env_vars: dict[str, Any] = {**python, **(env_vars or {})}
        self.name: str = submit.pop("name", f"vitess-merge-{sync_id}")
        self.files: str | None = submit.pop("files", None)
        self.py_files: str | None = submit.pop("py_files", None)
        self.jars: str | None = submit.pop("jars", None)
        self.driver_class_path: str | None = submit.pop("driver_class_path", None)
        self.exclude_packages: str | None = submit.pop("exclude_packages", None)
        self.keytab: str | None = submit.pop("keytab", None)
        self.principal: str | None = submit.pop("principal", None)
        self.proxy_user: str | None = submit.pop("proxy_user", None)
        self.application_args: list[Any] | None = submit.pop("application_args", None)
        self.properties_file: str | None = submit.pop("properties_file", None)
        self.submit_args: dict[str, Any] = {**submit, "spark_binary": binary}
        self.sync_id = sync_id
        self.target_location = target_location
        self.targets = targets
        self.modes = ModeOptions(
            target_mode, metadata_columns, metadata_prefix, change_data_feed, check_features(table_features)
        )
        # Bad options fail the DAG's parse, naming them (templated targets: when the task runs).
        given = targets if isinstance(targets, Mapping) else None
        shapes = self.modes.shapes(
            {*([] if isinstance(tables, str) else tables or ()), *(given or {})}, given
        )
        if table_format not in TABLE_FORMATS:
            raise ValueError(f"table_format {table_format!r} is not one of {', '.join(TABLE_FORMATS)}")
        for table, shape in shapes.items():
            problem = format_problem(table_format, table, shape)
            if problem:
                raise ValueError(problem)
        problem = catalog_problem(table_format, iceberg_catalog_conn_id)
        if problem:
            raise ValueError(problem)
        self.table_format, self.iceberg_catalog_conn_id = table_format, iceberg_catalog_conn_id
        self.checkpoint_conn_id = checkpoint_conn_id
        self.spark_history_url = spark_history_url
        self.freshness_sla = freshness_sla
        self.spark_application_id: str | None = None  # from the job's report, for the link
        self.table_uris = lineage_assets.declare(self, target_location, tables, targets)
        self._lineage: MergeLineage | None = None
        self.aws_conn_id = aws_conn_id
        self.spark_connect_conn_id = spark_connect_conn_id
        self.packages_given = packages is not None
        self.jars_cache_dir = Path(jars_cache_dir) if jars_cache_dir else default_cache_dir()
        self.submit_binary = binary or "spark-submit"  # None: the provider's, from PATH
        self._merge_backend: SparkSubmitMerge | SparkConnectMerge | None = None

    def _make_backend(self, catalog: IcebergCatalog | None = None) -> SparkSubmitMerge | SparkConnectMerge:
        """Where this run's merge job runs: chosen once, with its own ``on_kill``."""
        if self.spark_connect_conn_id:
            return SparkConnectMerge(
                self.spark_connect_conn_id,
                self.sync_id,
                self.aws_conn_id,
                self.log,
                conf=self.connect_conf,
                iceberg_catalog=catalog,
            )
        return SparkSubmitMerge(
            self.application,
            self.submit_arguments(),
            sync_id=self.sync_id,
            log=self.log,
            packages_given=self.packages_given,
            aws_conn_id=self.aws_conn_id,
            jars_cache_dir=self.jars_cache_dir,
            iceberg_catalog=catalog,
        )

    def submit_arguments(self) -> dict[str, Any]:
        """``SparkSubmitHook``'s arguments as given (and rendered) for this task."""
        return {**self.submit_args, **{arg: getattr(self, arg) for arg in TEMPLATED_SUBMIT_ARGS}}

    # Returns the merge summary (the XCom value).
    def execute(self, context: Any) -> dict[str, Any]:
        self.outlets = lineage_assets.withhold(self.outlets, self.table_uris)  # emit() adds back
        return self.merge_staged(context)

    def merge_staged(self, context: Any) -> dict[str, Any]:
        """Merge and commit what the sync has staged (nothing: a summary with ``merged`` None);
        its changed tables join the task's asset events. The follow task calls it once a round."""
        paths = [("target_location", self.target_location)]
        for table, target in (self.targets or {}).items():
            if isinstance(target, Mapping) and target.get("path"):
                paths.append((f"targets[{table!r}]['path']", str(target["path"])))
        refuse_single_host(context, self.checkpoint_conn_id, paths)
        store = open_store(self.checkpoint_conn_id)
        try:  # closed each time: the follow task merges hundreds of times in one process
            return self._merge(context, store)
        finally:
            store.close()

    def _merge(self, context: Any, store: CheckpointStore) -> dict[str, Any]:
        s3 = s3_settings(self.aws_conn_id)
        catalog = iceberg_catalog(self.iceberg_catalog_conn_id)
        runner = MergeRunner(
            store,
            self.sync_id,
            self.target_location,
            self.targets,
            holder=holder(context),
            # The staging's credentials, for the lost-file check and retention on S3.
            storage_options=s3.storage_options() if s3 else None,
            freshness_sla=self.freshness_sla,
            modes=self.modes,
            table_format=self.table_format,
            iceberg_catalog=None if catalog is None else catalog.document(),
        )
        backend = self._merge_backend = self._make_backend(catalog)
        started = time.monotonic()
        with task_failures(self.log):
            outcome = runner.run(lambda plan: backend.submit(plan, context))
        self.spark_application_id = backend.application_id
        self.log.info("sync %r: %s", self.sync_id, outcome.message)
        if outcome.seq is None:
            return {"sync_id": self.sync_id, "merged": None, "committed_seq": outcome.committed_seq}
        assert outcome.committed_vgtid is not None and outcome.kind is not None
        emit_metrics("merge", self.sync_id, {"duration": time.monotonic() - started}, timing=True)
        now = datetime.now(timezone.utc)
        behind = seconds_behind(outcome.as_of, now)
        if behind is not None and outcome.plan is not None:  # per table: a metric names one
            emit_metrics("freshness_seconds", self.sync_id, dict.fromkeys(outcome.plan.targets, behind))
        context["ti"].xcom_push(key="committed_vgtid", value=outcome.committed_vgtid.to_json())
        self._lineage = self._record_lineage(context, runner, outcome)
        report = outcome.report
        # A breach never fails this task: the window is committed and its asset events must
        # reach the consumers. It is told here, on the status page and by the DAG's deadline.
        breach = window_breached(outcome.kind, outcome.as_of, self.freshness_sla, now)
        if breach:
            self.log.warning(
                "sync %r: freshness objective breached: its data is as of %s, %s s behind, past "
                "its freshness_sla of %s s (window %s is committed, its asset events emitted). Runs "
                "that take longer than the objective, or backlogs read in windows cut short, leave "
                "it behind: give the catch-up more max_seconds or max_events, run more often, or "
                "raise freshness_sla",
                self.sync_id,
                outcome.as_of,
                behind,
                self.freshness_sla,
                outcome.seq,
            )
        return {
            "sync_id": self.sync_id,
            "merged": outcome.seq,
            "kind": outcome.kind.value,
            "committed_vgtid": outcome.committed_vgtid.to_json(),
            "as_of": None if outcome.as_of is None else outcome.as_of.isoformat(),
            "seconds_behind": behind,
            "freshness_sla": self.freshness_sla,
            "breached": breach,
            "report": {} if report is None else json.loads(report.to_json()),
        }

    def _record_lineage(
        self, context: Any, runner: MergeRunner, outcome: MergeOutcome
    ) -> MergeLineage | None:
        """Asset events for the tables the window changed; what OpenLineage will ask for."""
        if outcome.report is None or outcome.seq is None or outcome.committed_vgtid is None:
            return None
        kind = lineage_assets.window_kind(outcome.kind, outcome.streamed_before)
        events: dict[str, dict[str, Any]] = {}
        as_of = None if outcome.as_of is None else outcome.as_of.isoformat()
        for seq in outcome.seqs or (outcome.seq,):  # a table changed by several windows: the last
            events.update(
                lineage_assets.window_events(outcome.report, seq, kind, outcome.committed_vgtid, as_of)
            )
        emitted = lineage_assets.emit(self, context, self.table_uris, events)
        self.log.info("asset events for %d changed table(s): %s", len(emitted), emitted or "none")
        if outcome.plan is None:
            return None
        vtgate = runner.store.sync_config(self.sync_id).get("vtgate")
        return MergeLineage(vtgate, outcome.plan, outcome.report, outcome.seq)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the window's source tables in, its Delta tables out (see ``lineage``)."""
        return merge_facets(self._lineage)

    def on_kill(self) -> None:
        """Stop the merge job where it runs (its backend's own kill); the window stays STAGED."""
        if self._merge_backend is not None:
            self._merge_backend.on_kill()
