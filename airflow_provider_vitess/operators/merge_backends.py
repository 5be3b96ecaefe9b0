"""Where ``VitessMergeOperator`` runs the merge job: spark-submit, or a Spark Connect server.

One interface (:class:`MergeBackend`: run a plan, stop it when the task is killed), chosen once
per task run, as the Airflow Spark provider's hooks each carry their own ``on_kill``:

- :class:`SparkSubmitMerge` submits ``merge/job/main.py`` with the Spark provider's
  ``SparkSubmitHook``, built per submit from the operator's (rendered) spark-submit arguments plus
  this submit's own (the operator is never changed, so credentials never reach a rendered
  field); its ``on_kill`` is the hook's (the spark-submit process, a YARN application, a driver);
- :class:`SparkConnectMerge` runs the merge in the task's process against the connection's
  server; its ``on_kill`` interrupts the server's operations for the merge's sessions and
  releases them, so the merge stops before any further commit and the task ends with an error
  (the sync's lock is released on the way out; the window stays STAGED, re-runnable).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_vitess.connections import s3_settings
from airflow_provider_vitess.exceptions import (
    MergeInterruptedError,
    SparkSubmitSetupError,
    VitessConnectionError,
    permanent_by_name,
)
from airflow_provider_vitess.merge import class_archive
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.merge.jar_cache import cached_jars, remember_jars
from airflow_provider_vitess.merge.report import MergeReport
from airflow_provider_vitess.merge.spark_conf import (
    BASE_CONF,
    DRIVER_JAVA_OPTIONS,
    EXTENSIONS_CONF,
    LOCAL_SUBMIT_CONF,
    packages_for,
    with_iceberg_extensions,
)
from airflow_provider_vitess.merge.submit_env import pyspark_home, spark_submit_problem
from airflow_provider_vitess.utils.airflow_compat import AirflowException
from airflow_provider_vitess.utils.failures import fail_permanently
from airflow_provider_vitess.utils.task import log_group

if TYPE_CHECKING:
    from airflow_provider_vitess.merge.job.connect import RemoteSessions
    from airflow_provider_vitess.merge.plan import MergePlan

# SparkSubmitHook's arguments (all but the application), as the merge operator takes them: those
# Airflow renders as templates, then the others.
TEMPLATED_SUBMIT_ARGS = (
    "conf", "files", "py_files", "jars", "driver_class_path", "packages", "exclude_packages",
    "keytab", "principal", "proxy_user", "name", "application_args", "env_vars", "properties_file",
)  # fmt: skip
SUBMIT_ARGS = frozenset(
    {
        *TEMPLATED_SUBMIT_ARGS, "conn_id", "archives", "java_class", "repositories",
        "total_executor_cores", "executor_cores", "executor_memory", "driver_memory",
        "num_executors", "status_poll_interval", "verbose", "spark_binary", "yarn_queue",
        "deploy_mode", "use_krb5ccache", "post_submit_commands", "track_driver_via_k8s_api",
        "yarn_track_via_rm_api", "yarn_rm_auth",
    }
)  # fmt: skip


@functools.cache
def hook_parameters() -> frozenset[str]:
    """The installed Spark provider's ``SparkSubmitHook`` parameters (read once a process: every
    merge operator a DAG file builds asks)."""
    return frozenset(inspect.signature(SparkSubmitHook.__init__).parameters)


def refuse_newer_submit_args(given: Iterable[str]) -> None:
    """Arguments of :data:`SUBMIT_ARGS` that the installed Spark provider's hook does not take (they
    came in a later release than the floor, 5.6.0, has) are refused by name when the DAG is
    parsed, instead of a ``TypeError`` from the hook when the task submits."""
    missing = sorted(set(given) - hook_parameters())
    if missing:
        installed = importlib.metadata.version("apache-airflow-providers-apache-spark")
        raise ValueError(
            f"VitessMergeOperator: {', '.join(missing)}: not taken by the installed "
            f"apache-airflow-providers-apache-spark {installed}'s SparkSubmitHook; upgrade that "
            "provider to a release that has them, or drop them"
        )


REPORT_ARG = "--report-file"
PLAN_ARG = "--plan-file"
JARS_ARG = "--jars-file"


class MergeBackend(Protocol):
    def submit(self, plan: MergePlan, context: Any) -> MergeReport | None:
        """Run the merge job with ``plan``: its report (None: it wrote none), or its error."""

    def on_kill(self) -> None:
        """Stop what :meth:`submit` started (the task is being killed)."""


def _connection_host(conn_id: str) -> str | None:
    from airflow.sdk.bases.hook import BaseHook

    try:
        return BaseHook.get_connection(conn_id).host or ""
    except Exception:  # SparkSubmitHook falls back to yarn without the connection
        return None


def _cluster_spark(conn_id: str) -> dict[str, str | None]:
    """The Spark connection's extra ``spark_version`` (the cluster's Spark, when it is not the
    installed PySpark's) and ``delta_package`` (a Delta coordinate of the user's choosing)."""
    from airflow.sdk.bases.hook import BaseHook

    try:
        extra = BaseHook.get_connection(conn_id).extra_dejson
    except Exception:  # no connection: SparkSubmitHook's defaults, the installed PySpark's Spark
        return {"spark_version": None, "delta_package": None}
    return {"spark_version": extra.get("spark_version"), "delta_package": extra.get("delta_package")}


class SparkSubmitMerge:
    """spark-submit of ``application`` (the job) with ``SparkSubmitHook``: ``arguments`` are the
    operator's (rendered) hook arguments, each submit adds its plan, report, packages and the
    object store's keys to a copy of them."""

    def __init__(
        self,
        application: str,
        arguments: Mapping[str, Any],
        *,
        sync_id: str,
        log: logging.Logger | Any,
        packages_given: bool = False,
        aws_conn_id: str | None = None,
        jars_cache_dir: Path,
        iceberg_catalog: IcebergCatalog | None = None,
    ) -> None:
        self.application, self.arguments, self.sync_id, self.log = application, dict(arguments), sync_id, log
        self.spark_conn_id: str = self.arguments.get("conn_id") or "spark_default"
        self.packages_given, self.aws_conn_id, self.jars_cache_dir = (
            packages_given,
            aws_conn_id,
            jars_cache_dir,
        )
        # The spark-submit the provider runs (a path, or a name on PATH).
        self.binary: str = self.arguments.get("spark_binary") or "spark-submit"
        self.iceberg_catalog = iceberg_catalog
        self._hook: SparkSubmitHook | None = None
        self.application_id: str | None = None  # from the job's report, for the "Spark UI" link

    def job(self, plan: MergePlan, plan_file: Path, report_file: Path) -> dict[str, Any]:
        """The hook arguments that submit ``plan`` (written to ``plan_file``): this submit's
        arguments, Spark settings and packages, and the object store's keys and the Iceberg
        catalog's credentials in its process environment only (never in a rendered field of the
        operator, nor on the logged command line)."""
        job = dict(self.arguments)
        job["application_args"] = [PLAN_ARG, str(plan_file), REPORT_ARG, str(report_file)]
        if (_connection_host(self.spark_conn_id) or "").startswith("local"):
            # One small executor: fewer shuffle partitions and snapshot partitions save most of
            # a small window's merge time, the quick JIT tier much of the rest; the user's own
            # conf still wins.
            job["conf"] = {**LOCAL_SUBMIT_CONF, **(job.get("conf") or {})}
        iceberg = plan.table_format == "iceberg"
        if iceberg:  # Iceberg's SQL beside Delta's (the extensions are fixed when Spark starts)
            conf = dict(job.get("conf") or {})
            conf[EXTENSIONS_CONF] = with_iceberg_extensions(
                str(conf.get(EXTENSIONS_CONF) or BASE_CONF[EXTENSIONS_CONF])
            )
            job["conf"] = conf
        catalog = self.iceberg_catalog
        if not self.packages_given:
            paths = [t.path for t in plan.targets.values()] + [w.manifest_path for w in plan.windows]
            packages = packages_for(paths, **_cluster_spark(self.spark_conn_id), iceberg=iceberg)
            job["packages"] = packages if catalog is None else f"{packages},{catalog.driver}"
        s3 = s3_settings(self.aws_conn_id)
        if s3 is not None:
            self._refuse_secrets_on_command_line(f"aws_conn_id {self.aws_conn_id!r}", "S3 credentials")
            job["env_vars"] = {**(job.get("env_vars") or {}), **s3.environment()}
        if catalog is not None and catalog.environment():
            self._refuse_secrets_on_command_line("iceberg_catalog_conn_id", "catalog credentials")
            job["env_vars"] = {**(job.get("env_vars") or {}), **catalog.environment()}
        self._check_can_start(job)
        return job

    def _refuse_secrets_on_command_line(self, setting: str, remedy_keys: str) -> None:
        """Refuse a master whose spark-submit turns the process environment into command-line
        settings (YARN's and Kubernetes' driver environment)."""
        master = _connection_host(self.spark_conn_id) or ""
        if master.startswith(("yarn", "k8s")):
            raise VitessConnectionError(
                f"{setting} cannot be used with the {master!r} master: its spark-submit would put "
                f"the credentials on its command line; leave it unset and give the cluster "
                f"{remedy_keys} of its own (instance role, Hadoop or Spark configuration)"
            )

    def _check_can_start(self, job: Mapping[str, Any]) -> None:
        """Refuse, naming the setting, a spark-submit that would exit 127 before Spark starts
        (merge/submit_env.py), instead of the provider's bare exit code retried in vain."""
        # The Spark provider runs spark-submit with the worker's environment plus env_vars, except
        # on Kubernetes, where env_vars become the driver's (spark.kubernetes.driverEnv.*).
        master = _connection_host(self.spark_conn_id) or ""
        given = {} if master.startswith("k8s") else job.get("env_vars") or {}
        env = {**os.environ, **{k: str(v) for k, v in given.items()}}
        problem = spark_submit_problem(self.binary, env)
        if problem is not None:
            raise SparkSubmitSetupError(problem)

    def _class_archive(self, job: dict[str, Any]) -> class_archive.ArchiveUse | None:
        """The driver JVM's class-data archive (:mod:`..merge.class_archive`), added to its
        options when they are the provider's local ones (:data:`LOCAL_SUBMIT_CONF`: a local
        master, and the user's own JVM options win, as the rest of their conf does)."""
        conf = dict(job.get("conf") or {})
        if conf.get(DRIVER_JAVA_OPTIONS) != LOCAL_SUBMIT_CONF[DRIVER_JAVA_OPTIONS]:
            return None
        env = {**os.environ, **{k: str(v) for k, v in (job.get("env_vars") or {}).items()}}
        java = class_archive.java_executable(env)
        if java is None:
            return None
        refused = class_archive.writing_refused(env, conf, env.get("SPARK_HOME") or pyspark_home())
        if refused is not None:
            self.log.info("no class-data archive for the driver: %s", refused)
            return None
        jars = (job.get(k) for k in ("packages", "repositories", "exclude_packages", "jars"))
        key = (env.get("SPARK_HOME"), *jars)
        use = class_archive.archive_for(self.jars_cache_dir / "class-archives", key, java)
        if any(c.isspace() for c in str(use.path)):  # Spark splits the JVM options at whitespace
            return None
        conf[DRIVER_JAVA_OPTIONS] = f"{conf[DRIVER_JAVA_OPTIONS]} {use.option}"
        job["conf"] = conf
        return use

    def _jars_from_cache(self, job: dict[str, Any]) -> tuple[str | None, ...] | None:
        """Swap the job's ``packages`` for the jars an earlier submit resolved for them (no Ivy
        run); else the key to remember this submit's jars under (None: nothing to resolve)."""
        packages = job.get("packages")
        if not packages:
            return None
        key = (packages, job.get("repositories"), job.get("exclude_packages"))
        jars = cached_jars(self.jars_cache_dir, key)
        if jars is None:
            return key
        self.log.info("%d jars resolved earlier for %s: no dependency resolution", len(jars), packages)
        job["jars"] = ",".join([*filter(None, (job.get("jars") or "").split(",")), *jars])
        job["packages"] = None
        return None

    def submit(self, plan: MergePlan, context: Any) -> MergeReport | None:
        seq = plan.windows[-1].seq
        with (
            log_group(f"Merge window {seq} of sync {self.sync_id} into Delta"),
            tempfile.TemporaryDirectory(prefix="vitess-merge-") as tmp,
        ):
            report_file, jars_file = Path(tmp) / "report.json", Path(tmp) / "jars.txt"
            # A file, not an argument: a plan grows with the tables and windows it names, and
            # Linux refuses one argument over 128 KiB (E2BIG) however often the task retries.
            plan_file = Path(tmp) / "plan.json"
            plan_file.write_text(plan.to_json(), encoding="utf-8")
            job = self.job(plan, plan_file, report_file)
            given = set(filter(None, (job.get("jars") or "").split(",")))
            archive = self._class_archive(job)  # keyed by the packages, before they become jars
            resolve = self._jars_from_cache(job)
            if resolve is not None:
                job["application_args"] = [*job["application_args"], JARS_ARG, str(jars_file)]
            hook = self._hook = SparkSubmitHook(**job)
            try:
                hook.submit(self.application)
            except AirflowException:
                error = _job_error(report_file)
                if archive is not None:
                    class_archive.settle(archive, failed=not report_file.exists())
                if error is None:
                    raise  # spark-submit itself failed (no JVM, cluster unreachable): retryable
                message = f"the merge job refused window {seq}: {error['error']}"
                if permanent_by_name(str(error.get("type", ""))):
                    raise fail_permanently(message) from None
                raise AirflowException(message) from None
            if archive is not None:
                class_archive.settle(archive, failed=False)
            if resolve is not None and jars_file.exists():
                resolved = [j for j in jars_file.read_text().split(",") if j and j not in given]
                remember_jars(self.jars_cache_dir, resolve, resolved)
            if report_file.exists():
                text = report_file.read_text()
                # The job adds its Spark application to the report, for the "Spark UI" link.
                self.application_id = dict(json.loads(text).get("spark") or {}).get("application_id")
                return MergeReport.from_json(text)
        return None

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()


class SparkConnectMerge:
    """The job's merge in the task's process, on the Spark Connect server of ``conn_id``."""

    def __init__(
        self,
        conn_id: str,
        sync_id: str,
        aws_conn_id: str | None,
        log: logging.Logger | Any,
        conf: Mapping[str, str] | None = None,
        iceberg_catalog: IcebergCatalog | None = None,
    ) -> None:
        self.conn_id, self.sync_id, self.aws_conn_id, self.log = conn_id, sync_id, aws_conn_id, log
        self.iceberg_catalog = iceberg_catalog
        self.conf = dict(conf or {})  # session settings (the operator's _connect_conf)
        self._sessions: RemoteSessions | None = None
        self.application_id: str | None = None

    def submit(self, plan: MergePlan, context: Any) -> MergeReport | None:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk.log import mask_secret

        from airflow_provider_vitess.merge.job.connect import run_merge, split_token

        url = SparkConnectHook(self.conn_id).get_connection_url()
        token = split_token(url)[1]
        if token:
            # Airflow masks the connection's password as typed; the URL carries it URL-encoded.
            mask_secret(token)
            mask_secret(quote(token))
        seq = plan.windows[-1].seq
        progress: Callable[[int, str, str], None] = lambda s, table, phase: self.log.info(  # noqa: E731
            "window %d table %s: %s", s, table, phase
        )
        with log_group(f"Merge window {seq} of sync {self.sync_id} on Spark Connect"):
            try:
                return run_merge(
                    url,
                    plan,
                    s3=s3_settings(self.aws_conn_id),
                    progress=progress,
                    started=self._started,
                    conf=self.conf,
                    iceberg_catalog=self.iceberg_catalog,
                )
            except Exception as exc:
                if self._sessions is None or not self._sessions.interrupted:
                    raise
                raise MergeInterruptedError(
                    f"the merge of sync {self.sync_id!r} window {seq} on Spark Connect was killed: "
                    "its Spark operations were interrupted and nothing more was committed; the "
                    "window stays STAGED and the next run of the merge task merges it"
                ) from exc

    def _started(self, sessions: RemoteSessions) -> None:
        self._sessions = sessions

    def on_kill(self) -> None:
        if self._sessions is None:
            return
        self.log.info("interrupting the merge's Spark Connect operations (the task is being killed)")
        self._sessions.interrupt()


def _job_error(report_file: Path) -> dict[str, Any] | None:
    """The error the job wrote instead of a report (see ``merge/job/main.py``), if it got that far."""
    try:
        found = json.loads(report_file.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "error" in found else None
