"""The factory's freshness objective as Airflow's own deadline alert (``deadlines.py``): the
interval is the latest a healthy run ends, the DAG serializes as the scheduler stores it, and the
default callback runs as the triggerer runs it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from airflow.serialization import serialized_objects

from airflow_provider_vitess.dag_factory import ON_CHANGES_SENSOR_TIMEOUT, vitess_sync_dag
from airflow_provider_vitess.deadlines import freshness_deadline_missed
from airflow_provider_vitess.utils.airflow_compat import deadline_alert

try:
    from airflow.sdk.definitions.callback import AsyncCallback as async_callback
except ImportError:  # Airflow 3.1
    from airflow.sdk.definitions.deadline import AsyncCallback as async_callback  # type: ignore[attr-defined,no-redef,unused-ignore]


def _dag(**kwargs: Any) -> Any:
    return vitess_sync_dag(
        "d", keyspace="k", tables=["t"], staging_location="/s", target_location="/t", **kwargs
    )


def _alert(dag: Any) -> Any:
    deadline = dag.deadline
    return deadline[0] if isinstance(deadline, list) else deadline


@pytest.mark.parametrize(
    ("kwargs", "seconds"),
    [
        ({"freshness_sla": 120}, 60 + 120),  # the sensor waits 60 s at most, then the run commits
        ({"freshness_sla": 120, "wait_for_changes": False}, 120),
        ({"freshness_sla": 120, "sensor_timeout": 300}, 300 + 120),
        ({"freshness_sla": 30, "on_changes": True}, ON_CHANGES_SENSOR_TIMEOUT + 30),
        # A follow task goes on for its seconds after the sensor's wait, committing as it goes.
        ({"freshness_sla": 30, "on_changes": True, "follow_seconds": 300}, ON_CHANGES_SENSOR_TIMEOUT + 330),
    ],
)
def test_a_run_s_deadline_is_its_queue_time_plus_the_sensor_s_wait_plus_the_objective(
    kwargs: dict[str, Any], seconds: float
) -> None:
    alert = _alert(_dag(**kwargs))
    assert alert.interval == timedelta(seconds=seconds)
    assert type(alert.reference).__name__ == "DagRunQueuedAtDeadline"
    assert alert.callback.path == "airflow_provider_vitess.deadlines.freshness_deadline_missed"
    assert alert.callback.kwargs == {"sync_id": "d", "freshness_sla": kwargs["freshness_sla"]}


def test_no_objective_no_deadline_and_the_caller_s_own_deadline_or_callback_wins() -> None:
    assert not _dag().deadline
    own = deadline_alert(timedelta(minutes=7), "airflow_provider_vitess.deadlines.freshness_deadline_missed")
    assert _alert(_dag(freshness_sla=60, deadline=own)).interval == timedelta(minutes=7)
    mine = async_callback(f"{__name__}.page_someone", kwargs={"team": "data"})
    alert = _alert(_dag(freshness_sla=60, freshness_callback=mine))
    assert alert.callback.path == f"{__name__}.page_someone"
    assert alert.callback.kwargs == {"team": "data"}


async def page_someone(team: str, **context: Any) -> str:
    return team


def test_the_dag_with_its_deadline_serializes_as_the_scheduler_stores_it() -> None:
    dag = _dag(freshness_sla=90, wait_for_changes=False)
    # 3.3 names the class DagSerialization; 3.1 and 3.2 SerializedDAG.
    serializer: Any = getattr(serialized_objects, "DagSerialization", None)
    serializer = serializer or serialized_objects.SerializedDAG
    serialized = serializer.to_dict(dag)
    text = str(serialized)
    assert "freshness_deadline_missed" in text and "DagRunQueuedAtDeadline" in text
    assert "90.0" in text  # the interval, in seconds
    assert serializer.from_dict(serialized).dag_id == "d"  # and reads back


def test_the_default_callback_says_which_sync_missed_what_and_where_to_look(caplog: Any) -> None:
    message = asyncio.run(freshness_deadline_missed(sync_id="orders", freshness_sla=90.0, context={"x": 1}))
    assert message.startswith("sync 'orders': a run did not succeed within its freshness deadline")
    assert "freshness_sla 90 s" in message and "status page" in message
    assert message in caplog.text
