"""A catch-up run's reading time (``max_seconds``) defaults from the DAG's schedule, so that a
run reading a long backlog fits its interval (``dag_factory.default_max_seconds``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_vitess.dag_factory import default_max_seconds, schedule_interval, vitess_sync_dag


@pytest.mark.parametrize(
    ("schedule", "interval"),
    [
        ("*/5 * * * *", timedelta(minutes=5)),
        ("@hourly", timedelta(hours=1)),
        ("0 9 * * 1-5", timedelta(days=1)),  # the shortest gap: Monday to Tuesday
        ("0,50 * * * *", timedelta(minutes=10)),  # uneven: the shortest gap bounds a run
        (timedelta(minutes=10), timedelta(minutes=10)),
        (None, None),
        ("@once", None),
        ("@continuous", None),
    ],
)
def test_the_interval_of_a_schedule(schedule: Any, interval: timedelta | None) -> None:
    assert schedule_interval(schedule) == interval


def test_the_factory_gives_the_catch_up_half_the_interval_unless_told() -> None:
    def catch_up(**kwargs: Any) -> Any:
        dag = vitess_sync_dag(
            "d", keyspace="k", tables=["t"], staging_location="/s", target_location="/t", **kwargs
        )
        return dag.get_task("catch_up")

    assert catch_up().max_seconds == 150.0 == default_max_seconds("*/5 * * * *")  # the default schedule
    assert catch_up(schedule="@hourly").max_seconds == 1800.0
    assert catch_up(schedule=None).max_seconds is None  # manual runs read until caught up
    assert catch_up(schedule="@hourly", max_seconds=60).max_seconds == 60
    assert catch_up(max_events=1000).max_events == 1000
