"""Settings that hold on one host only, refused where a sync's tasks may run on several.

Out of the box a sync keeps its checkpoint store in a SQLite file under ``AIRFLOW_HOME``, and
its staging and target locations may be local paths: right on one machine, where every task
sees the same disk. Under an executor that runs tasks on several hosts (Celery, Kubernetes,
Edge, ...) each worker would keep a truth of its own: a retry on another host would find no
checkpoint and snapshot again, or find no staged window, or merge into another copy of the
table. So each task of the sync checks its settings first and fails, naming each setting and
its remedy, before it reads or writes anything.

A local path is allowed on such a fleet when every worker mounts the same shared filesystem
there (``[vitess] shared_filesystem = True``). A SQLite store never is: SQLite's locking does
not hold on network filesystems.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from airflow_provider_vitess.exceptions import SingleHostSettingsError

# The executors that run every task on the scheduler's host (Airflow's own; `dag.test()` and
# `airflow dags test` run tasks in the calling process).
SINGLE_HOST_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})
SHARED_FILESYSTEM_SETTING = "[vitess] shared_filesystem"


def executor_class(executor: str) -> str:
    """The class name of an ``[core] executor`` entry: ``CeleryExecutor``, a module path
    (``airflow.providers.celery.executors.celery_executor.CeleryExecutor``) or an aliased one
    (``my_alias:my.module.MyExecutor``)."""
    path = executor.strip().rsplit(":", 1)[-1]
    return path.rsplit(".", 1)[-1]


def runs_on_one_host(executor: str) -> bool:
    return executor_class(executor) in SINGLE_HOST_EXECUTORS


def is_local_path(location: str) -> bool:
    """A path on the host's own disk: no URL scheme (or a Windows drive letter), or ``file:``."""
    scheme = urlsplit(location).scheme
    return scheme in ("", "file") or len(scheme) == 1


def refuse_single_host_settings(
    *,
    task: str,
    executor: str,
    store_url: str | None = None,
    locations: Iterable[tuple[str, str]] = (),
    shared_filesystem: bool = False,
) -> None:
    """Raises :class:`SingleHostSettingsError` when ``task`` runs under a multi-host
    ``executor`` with a SQLite checkpoint store (``store_url``) or, unless the workers share a
    filesystem, a location (``(setting, location)`` pairs) that is a local path."""
    if runs_on_one_host(executor):
        return
    problems = []
    if store_url is not None and store_url.startswith("sqlite"):
        problems.append(
            "its checkpoint store is a SQLite file on the worker's disk (checkpoint_conn_id unset, or "
            "a sqlite connection): name in checkpoint_conn_id a PostgreSQL or MySQL connection every "
            "worker reaches (copy an existing store with `python -m airflow_provider_vitess.store_copy`)"
        )
    if not shared_filesystem:
        for setting, location in locations:
            if is_local_path(location):
                problems.append(
                    f"{setting} {location!r} is a path on the worker's disk: give an object-store URL "
                    "every worker and the Spark cluster reach (e.g. s3://bucket/prefix with aws_conn_id)"
                )
    if not problems:
        return
    raise SingleHostSettingsError(
        f"task {task!r} runs under {executor_class(executor)}, which may run a sync's tasks on "
        f"different hosts, but {'; and '.join(problems)}. Nothing was read or written. If every "
        f"worker mounts one shared filesystem at those paths, set {SHARED_FILESYSTEM_SETTING} = True "
        "in the Airflow configuration (a SQLite store is refused even then: its locking does not "
        "hold on network filesystems)"
    )
