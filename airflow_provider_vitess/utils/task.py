"""What an Airflow task of this provider does around its work: names the holder of a sync's
lock, folds its log into groups, emits metrics, reads Airflow's configuration.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)


def holder(context: Mapping[str, Any]) -> str:
    """Who holds a sync's lock while a task runs: shown to a concurrent run that is refused."""
    ti = context.get("ti") or context.get("task_instance")
    if ti is None:
        return f"pid on {socket.gethostname()}"
    index = getattr(ti, "map_index", -1)
    mapped = f" map index {index}" if isinstance(index, int) and index >= 0 else ""
    return (
        f"dag {ti.dag_id!r} run {ti.run_id!r} task {ti.task_id!r}{mapped} try {ti.try_number} "
        f"on {socket.gethostname()}"
    )


@contextlib.contextmanager
def log_group(title: str) -> Iterator[None]:
    """A collapsible group in the Airflow task log (the UI folds ``::group::`` blocks)."""
    print(f"::group::{title}", flush=True)
    try:
        yield
    finally:
        print("::endgroup::", flush=True)


def executor_of(context: Mapping[str, Any]) -> str:
    """The executor running the task: the task's own (its ``executor`` argument), else the first
    of ``[core] executor`` (Airflow's default executor)."""
    ti = context.get("ti") or context.get("task_instance")
    task = getattr(ti, "task", None) or context.get("task")
    own = getattr(task, "executor", None)
    if isinstance(own, str) and own:
        return own
    configured = airflow_conf().get("core", "executor", fallback="") or "LocalExecutor"
    return str(configured).split(",")[0]


def airflow_conf() -> Any:
    """Airflow's configuration as the task side reads it."""
    from airflow_provider_vitess.utils.airflow_compat import airflow_conf as compat_conf

    return compat_conf()


def emit_metrics(prefix: str, sync_id: str, values: Mapping[str, float], *, timing: bool = False) -> None:
    """Airflow metrics ``vitess.<prefix>.<name>`` tagged with the sync; never fails the task."""
    try:
        from airflow_provider_vitess.utils.airflow_compat import stats as airflow_stats

        stats = airflow_stats()
        for name, value in values.items():
            metric = f"vitess.{prefix}.{name}"
            if timing:
                stats.timing(metric, value, tags={"sync_id": sync_id})
            else:
                stats.gauge(metric, value, tags={"sync_id": sync_id})
    except Exception as exc:  # metrics are an aid, not part of the result
        log.debug("could not emit metrics %s: %s", prefix, exc)
