"""A sync's freshness objective as an Airflow deadline alert (Airflow 3.1+'s ``DeadlineAlert``).

Past ``freshness_sla`` the merge task warns and returns ``breached: true``, yet succeeds (a
failed task records no asset events: the table's consumers would not run for data that is there),
and the status page turns red while the data is older (``checkpoints/freshness.py``). Both need a
run that gets as far as the merge or a look at the page; a sync whose runs fail before it (vtgate
unreachable) is flagged by Airflow itself with a deadline on each DAG run: a run that has not
*succeeded* by

    its queue time + the sensor's longest wait (when it waits for changes) + ``follow_seconds``
    (when a follow task catches up and merges in rounds after it) + ``freshness_sla``

missed its deadline, and Airflow's triggerer calls the callback. That bound is the latest a
healthy run ends: a quiet source's run waits the sensor's time, then succeeds (skipped tasks)
and Airflow drops its deadline; a run that commits within the objective succeeds before it. A
failed run keeps its deadline (Airflow prunes them on success only), so a stalled sync's alert
fires once per failed run, late by at most the sensor's wait: the page is red at once.

``airflow dags test`` runs without it: Airflow 3.1-3.3's ``dag.test()`` cannot end a run of a DAG
with a deadline (see ``utils.airflow_compat.DeadlineSafeDAG``, the factory's DAG class).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow_provider_vitess.utils.airflow_compat import deadline_alert

log = logging.getLogger(__name__)

__all__ = ["freshness_deadline", "freshness_deadline_missed"]


async def freshness_deadline_missed(sync_id: str, freshness_sla: float, **context: Any) -> str:
    """The default callback (run by Airflow's triggerer): an error in the triggerer's log, and
    the message as the callback's result, which Airflow keeps with the deadline."""
    message = (
        f"sync {sync_id!r}: a run did not succeed within its freshness deadline (freshness_sla "
        f"{freshness_sla:g} s): its data may be older than the objective; see the run's failed "
        "task and the Vitess sync's status page"
    )
    log.error("%s", message)
    return message


def freshness_deadline(
    sync_id: str, freshness_sla: float, sensor_wait: float | None, callback: Any = None
) -> Any:
    """The DAG's ``deadline`` for ``freshness_sla`` (see the module); ``callback``: an Airflow
    ``AsyncCallback`` (or ``SyncCallback`` on 3.2+) of the user's, else the default one."""
    interval = timedelta(seconds=(sensor_wait or 0.0) + freshness_sla)
    if callback is not None:
        return deadline_alert(interval, callback)
    kwargs = {"sync_id": sync_id, "freshness_sla": freshness_sla}
    return deadline_alert(interval, f"{__name__}.freshness_deadline_missed", kwargs)
