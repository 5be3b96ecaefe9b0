"""``VitessMergeOperator``: apply the sync's staged window to Delta with spark-submit.

The window state machine (see the design) is driven here and only here on the apply side:

* STAGED -> submit ``spark_jobs/merge_cdc.py`` with a :class:`MergePlan`; on success MERGED.
  Delta's transaction ids (sync + table, window seq) make a resubmitted window a no-op, so a
  task killed after the Delta commit but before MERGED was recorded is simply run again.
* MERGED -> COMMITTED: the checkpoint advances and the committed VGTID goes to XCom.

On any failure the window stays STAGED and the checkpoint does not move.
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

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_vitess.checkpoints import CheckpointStore, Window, WindowKind, WindowState
from airflow_provider_vitess.exceptions import CheckpointError, VitessConnectionError
from airflow_provider_vitess.keys import KeyChoice
from airflow_provider_vitess.merge.jar_cache import cached_jars, default_cache_dir, remember_jars
from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
from airflow_provider_vitess.merge.spark_conf import BASE_CONF, DELTA_PACKAGE, LOCAL_CONF, packages_for
from airflow_provider_vitess.operators._sync import emit_metrics, log_group, open_store, s3_settings

REPORT_ARG = "--report-file"


def default_application() -> str:
    """The merge job's file, inside the installed provider (what spark-submit runs)."""
    return str(Path(__file__).resolve().parents[1] / "merge" / "job.py")


def _default_spark_binary() -> str | None:
    """``spark-submit`` from PATH, else the one pyspark installed next to this Python."""
    if shutil.which("spark-submit"):
        return None
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else None


def build_plan(
    store: CheckpointStore, sync_id: str, window: Window, target_location: str,
    targets: Mapping[str, Mapping[str, Any]] | None = None,
) -> MergePlan:  # fmt: skip
    """The plan for one staged window: each table's Delta path and key from the recorded choice."""
    config = store.sync_config(sync_id)
    keys = {t: KeyChoice.from_dict(c) for t, c in dict(config.get("keys") or {}).items()}
    root = target_location.rstrip("/")
    planned: dict[str, TableTarget] = {}
    for table, choice in keys.items():
        given = dict((targets or {}).get(table) or {})
        from_source = choice.target_from_source or choice.source_columns
        renames = {s: t for s, t in zip(from_source, choice.target_columns, strict=True) if s != t}
        planned[table] = TableTarget(
            table=table,
            path=str(given.get("path") or f"{root}/{table}"),
            key_columns=choice.target_columns,
            key_from_source=from_source,
            renames={**renames, **dict(given.get("renames") or {})},
        )
    replace: tuple[str, ...] = ()
    if window.kind is WindowKind.SNAPSHOT:
        copied = {p.table for p in store.progress(sync_id, window.seq)}
        replace = tuple(t for t in planned if t in copied) or tuple(planned)
    if window.manifest_path is None:
        raise CheckpointError(f"sync {sync_id!r} window {window.seq} is STAGED without a manifest path")
    return MergePlan(sync_id, (WindowToMerge(window.seq, window.manifest_path, replace),), planned)


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
    :param aws_conn_id: an Airflow ``aws`` connection for ``s3a://`` staging and Delta tables:
        its keys reach the job through the spark-submit process's environment only (see
        :mod:`airflow_provider_vitess.object_storage`), so with YARN or k8s masters, whose
        spark-submit puts that environment on its command line, leave it unset and give the
        cluster its own S3 credentials.

    Other arguments are ``SparkSubmitOperator``'s. The Delta package (with Hadoop's S3A for S3
    locations) and session settings are added to ``packages``/``conf`` unless given. Returns
    (XCom) the merge summary; the committed VGTID is also pushed under the key ``committed_vgtid``.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "sync_id", "target_location")
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
        self.aws_conn_id = aws_conn_id
        self._packages_given = packages is not None
        self.jars_cache_dir = Path(jars_cache_dir) if jars_cache_dir else default_cache_dir()

    # Returns the merge summary (the XCom value), where SparkSubmitOperator returns nothing.
    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        store = open_store(self.checkpoint_conn_id)
        window = store.open_window(self.sync_id)
        if window is None:
            committed, seq = store.committed(self.sync_id)
            self.log.info("sync %r has no staged window to merge (committed window %d)", self.sync_id, seq)
            return {"sync_id": self.sync_id, "merged": None, "committed_seq": seq}
        if window.state is WindowState.PLANNED:
            raise CheckpointError(
                f"sync {self.sync_id!r} window {window.seq} ({window.kind.value}) is still PLANNED: its "
                "capture task has not finished staging it; rerun that task first"
            )
        report: dict[str, Any] = {}
        started = time.monotonic()
        if window.state is WindowState.STAGED:
            plan = build_plan(store, self.sync_id, window, self.target_location, self.targets)
            with log_group(f"Merge window {window.seq} of sync {self.sync_id} into Delta"):
                report = self._submit(plan, context)
            store.mark_merged(self.sync_id, window.seq)
        committed = store.commit(self.sync_id, window.seq)
        elapsed = time.monotonic() - started
        self.log.info("committed sync %r window %d at %s", self.sync_id, window.seq, committed.to_json())
        emit_metrics("merge", self.sync_id, {"duration": elapsed}, timing=True)
        context["ti"].xcom_push(key="committed_vgtid", value=committed.to_json())
        return {
            "sync_id": self.sync_id,
            "merged": window.seq,
            "kind": window.kind.value,
            "committed_vgtid": committed.to_json(),
            "report": report,
        }

    def _local_master(self) -> bool:
        from airflow.sdk.bases.hook import BaseHook

        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:  # SparkSubmitHook falls back to yarn; so do we (no local tuning)
            return False
        return (conn.host or "").startswith("local")

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

    def _submit(self, plan: MergePlan, context: Any) -> dict[str, Any]:
        if self._local_master():
            # One small executor: fewer shuffle partitions and snapshot partitions save most of
            # a small window's merge time; the user's own conf still wins.
            self.conf = {**LOCAL_CONF, **(self.conf or {})}
        if not self._packages_given:
            paths = [t.path for t in plan.targets.values()] + [w.manifest_path for w in plan.windows]
            self.packages = packages_for(paths)
        with tempfile.TemporaryDirectory(prefix="vitess-merge-") as tmp:
            report_file = Path(tmp) / "report.json"
            jars_file = Path(tmp) / "jars.txt"
            self.application_args = ["--plan-json", plan.to_json(), REPORT_ARG, str(report_file)]
            given = set(filter(None, (self.jars or "").split(",")))
            resolve = self._jars_from_cache()
            if resolve is not None:
                self.application_args += ["--jars-file", str(jars_file)]
            self._hook = None  # the hook captures application_args when built
            super().execute(context)
            if resolve is not None and jars_file.exists():
                resolved = [j for j in jars_file.read_text().split(",") if j and j not in given]
                remember_jars(self.jars_cache_dir, resolve, resolved)
            if report_file.exists():
                report: dict[str, Any] = json.loads(report_file.read_text())
                return report
        return {}
