"""What differs between the Airflow minors the provider supports (versions.AIRFLOW_RELEASES), in
one place: every other module imports these names from here, never with a version check of its
own. Each fallback names the release that lacks the newer spelling; drop it with that release.
"""

from __future__ import annotations

import inspect
import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG

# Airflow 3.1's Task SDK does not re-export the task exceptions yet (3.2 does, and 3.3 warns on
# the airflow.exceptions spelling).
try:
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferred,
    )
except ImportError:  # Airflow 3.1
    from airflow.exceptions import (  # type: ignore[no-redef,attr-defined,unused-ignore]
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferred,
    )

__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "DeadlineSafeDAG",
    "TaskDeferred",
    "airflow_conf",
    "dag_bag",
    "deadline_alert",
    "stats",
]


def stats() -> Any:
    """Airflow's metrics client (``Stats``): the Task SDK's from 3.2, the core's before."""
    try:
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow 3.1
        from airflow.stats import Stats
    return Stats


def dag_bag(dag_folder: str | None = None) -> Any:
    """A ``DagBag`` of ``dag_folder`` (Airflow's dags folder by default) without Airflow's own
    example DAGs, for tests and tools: 3.2 moved the class to airflow.dag_processing, 3.3 dropped
    its ``include_examples`` (3.1 and 3.2 read ``[core] load_examples``, True by default)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef,unused-ignore]
    if "include_examples" in inspect.signature(DagBag).parameters:  # Airflow 3.1, 3.2
        return DagBag(dag_folder=dag_folder, include_examples=False)  # type: ignore[call-arg,unused-ignore]
    return DagBag(dag_folder=dag_folder)


def airflow_conf() -> Any:
    """Airflow's configuration as the task side reads it: the Task SDK's from 3.2."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # Airflow 3.1
        from airflow.configuration import conf
    return conf


def deadline_alert(interval: timedelta, callback: Any, kwargs: dict[str, Any] | None = None) -> Any:
    """A ``DeadlineAlert`` from each DAG run's queue time; ``callback`` an Airflow callback, or
    the dotted path of an async function (made an ``AsyncCallback`` with ``kwargs``, the only
    kind 3.1 runs). 3.1 keeps the callbacks in airflow.sdk.definitions.deadline."""
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    try:
        from airflow.sdk.definitions.callback import AsyncCallback
    except ImportError:  # Airflow 3.1
        from airflow.sdk.definitions.deadline import AsyncCallback  # type: ignore[attr-defined,no-redef,unused-ignore]
    if isinstance(callback, str):
        callback = AsyncCallback(callback, kwargs=kwargs)
    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=interval, callback=callback)


class DeadlineSafeDAG(DAG):
    """A ``DAG`` whose ``test()`` (``airflow dags test``) runs without the DAG's deadline alerts.

    Airflow 3.1-3.3's ``dag.test()`` builds its scheduler DAG by serializing the DAG in memory:
    its ``deadline`` stays a list of encoded alerts (dicts), where the scheduler's DAG, read from
    the metadata database, holds the alerts' ids. When the test run succeeds, ``DagRun.update_state``
    looks each one up by id (``DeadlineAlertModel.get_by_id``) and fails on the dict
    (``StatementError: 'dict' object has no attribute 'hex'``): ``airflow dags test`` of any DAG
    with a deadline exits 1 after a successful run. A test run is not a scheduled one, so it goes
    without the alerts (the DAG in the metadata database keeps them; the scheduler's runs have them).
    Drop this class once no supported Airflow has the bug.
    """

    def test(self, *args: Any, **kwargs: Any) -> Any:
        deadline = self.deadline
        if not deadline:
            return super().test(*args, **kwargs)
        logging.getLogger(__name__).info(
            "dag %r: this test run goes without the DAG's deadline alerts (Airflow's dag.test() "
            "cannot end a run that has them); the scheduler's runs have them",
            self.dag_id,
        )
        self.deadline = None
        try:
            return super().test(*args, **kwargs)
        finally:
            self.deadline = deadline
