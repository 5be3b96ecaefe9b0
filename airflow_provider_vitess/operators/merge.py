"""``VitessMergeOperator``: apply the sync's staged window to Delta with spark-submit, or on
a long-running Spark Connect server (``spark_connect_conn_id``).

Thin: :class:`~airflow_provider_vitess.merge.runner.MergeRunner` drives the window state
machine on the apply side (under the sync's lock: STAGED -> merged by the Spark job -> MERGED
-> COMMITTED); this operator gives it the spark-submit of ``merge/job.py`` with a
:class:`MergePlan`, and turns the job's outcome into the task's: the report as XCom, the
committed VGTID under the key ``committed_vgtid``, a refused plan or staged input as a failure
without retries (see ``exceptions.is_permanent``).

Delta's transaction ids (sync + table, window seq) make a resubmitted window a no-op, so a task
killed after the Delta commit but before MERGED was recorded is simply run again. On any
failure the window stays STAGED and the checkpoint does not move.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_vitess.connections import open_store, s3_settings
from airflow_provider_vitess.exceptions import VitessConnectionError, permanent_by_name
from airflow_provider_vitess.lineage import assets as lineage_assets
from airflow_provider_vitess.lineage.openlineage import MergeLineage, merge_facets
from airflow_provider_vitess.merge.jar_cache import cached_jars, default_cache_dir, remember_jars
from airflow_provider_vitess.merge.plan import MergePlan
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.runner import MergeOutcome, MergeRunner, build_plan
from airflow_provider_vitess.merge.spark_conf import BASE_CONF, DELTA_PACKAGE, LOCAL_SUBMIT_CONF, packages_for
from airflow_provider_vitess.operators.links import DeltaTableLink, SparkUILink, VitessSyncStatusLink
from airflow_provider_vitess.utils.airflow_compat import AirflowException
from airflow_provider_vitess.utils.failures import fail_permanently, task_failures
from airflow_provider_vitess.utils.task import emit_metrics, holder, log_group

REPORT_ARG = "--report-file"
PLAN_ARG = "--plan-file"


def default_application() -> str:
    """The merge job's file, inside the installed provider (what spark-submit runs)."""
    return str(Path(__file__).resolve().parents[1] / "merge" / "job.py")


def _default_spark_binary() -> str | None:
    """``spark-submit`` from PATH, else the one pyspark installed next to this Python."""
    if shutil.which("spark-submit"):
        return None
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else None


class VitessMergeOperator(SparkSubmitOperator):
    """Merge the sync's staged window into Delta tables and commit the checkpoint.

    :param sync_id: the sync whose window to merge (as given to the capture operators).
    :param target_location: Delta tables go to ``<target_location>/<table>`` (any URI Spark
        writes to: a local path, ``s3a://``, ``abfss://``...).
    :param targets: per table overrides: ``{"table": {"path": ..., "renames": {src: dst}}}``.
    :param checkpoint_conn_id: the Airflow connection of the checkpoint store (default SQLite).
    :param jars_cache_dir: where the jars resolved for ``packages`` are remembered, so that only
        the first submit resolves them and later ones pass ``--jars`` (default
        ``~/.cache/airflow-provider-vitess/spark-jars`` on the worker).
    :param conn_id: the Spark connection (``local[*]``, ``spark://host:7077``, YARN, k8s).
    :param spark_connect_conn_id: a ``spark_connect`` connection (the Spark provider's
        ``SparkConnectHook``): the merge then runs in the task's process against that server
        (``sc://``), with no spark-submit and no JVM per window (see
        :mod:`airflow_provider_vitess.merge.connect`; ``dev/spark_connect.sh`` starts one). The
        server reads ``s3a://`` with S3A settings of its own; ``aws_conn_id`` then serves the
        task's reads of the manifests.
    :param spark_history_url: a Spark history server (``http://host:18080``): the task's "Spark
        UI" link then opens the merge's application there.
    :param tables: the sync's tables, when known where the DAG is defined: each Delta table is
        then an outlet Asset, and a window that changed a table emits an event for it (extra:
        sync id, window seq and kind, committed VGTID, rows inserted/updated/deleted).
    :param aws_conn_id: an Airflow ``aws`` connection for ``s3a://`` staging and Delta tables:
        its keys reach the job through the spark-submit process's environment only (see
        :mod:`airflow_provider_vitess.object_storage`), so with YARN or k8s masters, whose
        spark-submit puts that environment on its command line, leave it unset and give the
        cluster its own S3 credentials.

    Other arguments are ``SparkSubmitOperator``'s. The Delta package (with Hadoop's S3A for S3
    locations) and session settings are added to ``packages``/``conf`` unless given. Returns
    (XCom) the merge summary; the committed VGTID is also pushed under the key ``committed_vgtid``.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "sync_id",
        "target_location",
        "targets",
        "checkpoint_conn_id",
        "spark_history_url",
    )
    template_fields_renderers = {"conf": "json", "env_vars": "json", "targets": "json"}  # noqa: RUF012
    operator_extra_links = (VitessSyncStatusLink(), DeltaTableLink(), SparkUILink())
    ui_color = "#e4f0ff"

    def __init__(
        self,
        *,
        sync_id: str,
        target_location: str,
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
        tables: Sequence[str] | None = None,
        spark_connect_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        python = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        super().__init__(
            application=application or default_application(),
            packages=packages or DELTA_PACKAGE,
            conf={**BASE_CONF, **(conf or {})},
            spark_binary=spark_binary or _default_spark_binary(),
            # The driver runs this Python (the provider is installed in it), unless told otherwise.
            env_vars={**python, **(env_vars or {})},
            name=kwargs.pop("name", f"vitess-merge-{sync_id}"),
            **kwargs,
        )
        self.sync_id = sync_id
        self.target_location = target_location
        self.targets = targets
        self.checkpoint_conn_id = checkpoint_conn_id
        self.spark_history_url = spark_history_url
        self.spark_application_id: str | None = None  # from the job's report, for the link
        self.table_uris = lineage_assets.declare(self, target_location, tables, targets)
        self._lineage: MergeLineage | None = None
        self.aws_conn_id = aws_conn_id
        self.spark_connect_conn_id = spark_connect_conn_id
        self._packages_given = packages is not None
        self.jars_cache_dir = Path(jars_cache_dir) if jars_cache_dir else default_cache_dir()

    # Returns the merge summary (the XCom value), where SparkSubmitOperator returns nothing.
    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        self.outlets = lineage_assets.withhold(self.outlets, self.table_uris)  # emit() adds back
        s3 = s3_settings(self.aws_conn_id)
        runner = MergeRunner(
            open_store(self.checkpoint_conn_id),
            self.sync_id,
            self.target_location,
            self.targets,
            holder=holder(context),
            # The staging's credentials, for the lost-file check and retention on S3.
            storage_options=s3.storage_options() if s3 else None,
        )
        started = time.monotonic()
        with task_failures(self.log):
            outcome = runner.run(lambda plan: self._submit(plan, context))
        self.log.info("sync %r: %s", self.sync_id, outcome.message)
        if outcome.seq is None:
            return {"sync_id": self.sync_id, "merged": None, "committed_seq": outcome.committed_seq}
        assert outcome.committed_vgtid is not None and outcome.kind is not None
        emit_metrics("merge", self.sync_id, {"duration": time.monotonic() - started}, timing=True)
        context["ti"].xcom_push(key="committed_vgtid", value=outcome.committed_vgtid.to_json())
        self._lineage = self._record_lineage(context, runner, outcome)
        report = outcome.report
        return {
            "sync_id": self.sync_id,
            "merged": outcome.seq,
            "kind": outcome.kind.value,
            "committed_vgtid": outcome.committed_vgtid.to_json(),
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
        for seq in outcome.seqs or (outcome.seq,):  # a table changed by several windows: the last
            events.update(lineage_assets.window_events(outcome.report, seq, kind, outcome.committed_vgtid))
        emitted = lineage_assets.emit(self, context, self.table_uris, events)
        self.log.info("asset events for %d changed table(s): %s", len(emitted), emitted or "none")
        window = runner.store.window(self.sync_id, outcome.seq)
        plan = build_plan(runner.store, self.sync_id, window, self.target_location, self.targets)
        vtgate = runner.store.sync_config(self.sync_id).get("vtgate")
        return MergeLineage(vtgate, plan, outcome.report, outcome.seq)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the window's source tables in, its Delta tables out (see ``lineage``)."""
        return merge_facets(self._lineage)

    def _local_master(self) -> bool:
        from airflow.sdk.bases.hook import BaseHook

        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:  # SparkSubmitHook falls back to yarn; so do we (no local tuning)
            return False
        return (conn.host or "").startswith("local")

    def _cluster_spark(self) -> dict[str, str | None]:
        """The Spark connection's extra ``spark_version`` (the cluster's Spark, when it is not the
        installed PySpark's) and ``delta_package`` (a Delta coordinate of the user's choosing)."""
        from airflow.sdk.bases.hook import BaseHook

        try:
            extra = BaseHook.get_connection(self._conn_id).extra_dejson
        except Exception:  # no connection: SparkSubmitHook's defaults, the installed PySpark's Spark
            return {"spark_version": None, "delta_package": None}
        return {"spark_version": extra.get("spark_version"), "delta_package": extra.get("delta_package")}

    def _get_hook(self) -> SparkSubmitHook:
        # Object-store credentials reach spark-submit through its process environment only:
        # never through a rendered field (env_vars is one) nor the logged command line.
        s3 = s3_settings(self.aws_conn_id)
        if s3 is None:
            return super()._get_hook()
        from airflow.sdk.bases.hook import BaseHook

        master = BaseHook.get_connection(self._conn_id).host or ""
        if master.startswith(("yarn", "k8s")):
            raise VitessConnectionError(
                f"aws_conn_id {self.aws_conn_id!r} cannot be used with the {master!r} master: its "
                "spark-submit would put the credentials on its command line; leave aws_conn_id unset "
                "and give the cluster S3 credentials of its own (instance role, Hadoop configuration)"
            )
        rendered = self.env_vars
        self.env_vars = {**(rendered or {}), **s3.environment()}
        try:
            return super()._get_hook()
        finally:
            self.env_vars = rendered

    def _jars_from_cache(self) -> tuple[str | None, ...] | None:
        """Swap ``packages`` for the jars an earlier submit resolved for them (no Ivy run); else
        the key to remember this submit's jars under (None: no packages to resolve)."""
        if not self.packages:
            return None
        key = (self.packages, self._repositories, self.exclude_packages)
        jars = cached_jars(self.jars_cache_dir, key)
        if jars is None:
            return key
        self.log.info("%d jars resolved earlier for %s: no dependency resolution", len(jars), self.packages)
        self.jars = ",".join([*filter(None, (self.jars or "").split(",")), *jars])
        self.packages = None
        return None

    def _submit(self, plan: MergePlan, context: Any) -> MergeReport | None:
        """spark-submit the job with ``plan``; its report, or its error as the task's."""
        if self.spark_connect_conn_id:
            return self._merge_on_connect(plan, self.spark_connect_conn_id)
        if self._local_master():
            # One small executor: fewer shuffle partitions and snapshot partitions save most of
            # a small window's merge time, the quick JIT tier much of the rest; the user's own
            # conf still wins.
            self.conf = {**LOCAL_SUBMIT_CONF, **(self.conf or {})}
        if not self._packages_given:
            paths = [t.path for t in plan.targets.values()] + [w.manifest_path for w in plan.windows]
            self.packages = packages_for(paths, **self._cluster_spark())
        with (
            log_group(f"Merge window {plan.windows[-1].seq} of sync {self.sync_id} into Delta"),
            tempfile.TemporaryDirectory(prefix="vitess-merge-") as tmp,
        ):
            report_file = Path(tmp) / "report.json"
            jars_file = Path(tmp) / "jars.txt"
            # A file, not an argument: a plan grows with the tables and windows it names, and
            # Linux refuses one argument over 128 KiB (E2BIG) however often the task retries.
            plan_file = Path(tmp) / "plan.json"
            plan_file.write_text(plan.to_json(), encoding="utf-8")
            self.application_args = [PLAN_ARG, str(plan_file), REPORT_ARG, str(report_file)]
            given = set(filter(None, (self.jars or "").split(",")))
            resolve = self._jars_from_cache()
            if resolve is not None:
                self.application_args += ["--jars-file", str(jars_file)]
            self._hook = None  # the hook captures application_args when built
            try:
                super().execute(context)
            except AirflowException:
                error = _job_error(report_file)
                if error is None:
                    raise  # spark-submit itself failed (no JVM, cluster unreachable): retryable
                message = f"the merge job refused window {plan.windows[-1].seq}: {error['error']}"
                if permanent_by_name(str(error.get("type", ""))):
                    raise fail_permanently(message) from None
                raise AirflowException(message) from None
            if resolve is not None and jars_file.exists():
                resolved = [j for j in jars_file.read_text().split(",") if j and j not in given]
                remember_jars(self.jars_cache_dir, resolve, resolved)
            if report_file.exists():
                text = report_file.read_text()
                # The job adds its Spark application to the report, for the "Spark UI" link.
                self.spark_application_id = dict(json.loads(text).get("spark") or {}).get("application_id")
                return MergeReport.from_json(text)
        return None

    def _merge_on_connect(self, plan: MergePlan, conn_id: str) -> MergeReport:
        """The job's merge in this process, on the Spark Connect server of the connection."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk.log import mask_secret

        from airflow_provider_vitess.merge.connect import run_merge, split_token

        url = SparkConnectHook(conn_id).get_connection_url()
        token = split_token(url)[1]
        if token:
            # Airflow masks the connection's password as typed; the URL carries it URL-encoded.
            mask_secret(token)
            mask_secret(quote(token))
        with log_group(f"Merge window {plan.windows[-1].seq} of sync {self.sync_id} on Spark Connect"):
            return run_merge(
                url,
                plan,
                s3=s3_settings(self.aws_conn_id),
                progress=lambda seq, table, phase: self.log.info("window %d table %s: %s", seq, table, phase),
            )


def _job_error(report_file: Path) -> dict[str, Any] | None:
    """The error the job wrote instead of a report (see ``merge.job``), if it got that far."""
    try:
        found = json.loads(report_file.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "error" in found else None
