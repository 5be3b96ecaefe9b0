"""A ``pre_execute`` hook for the test DAGs of grouped syncs, imported by their DAG files.

A group's read of a test window takes about a second. Two ``catch_up`` group tasks queued together
then overlap only if the executor starts the second worker before the first is done, and on a
loaded machine it may not (CI saw them 57 ms apart). The hook holds each ``catch_up`` until every
group of its run has started, up to a limit: groups the executor and the DAG let run at once then
do, and groups run one after the other still do not overlap (the first waits out the limit alone),
so a test that asserts they overlap fails on them.

The meeting point is an Airflow Variable per group and run. Workers on other hosts reach it through
the api-server, as they share no directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow.sdk import Variable

WAIT_SECONDS = 120.0
_POLL_SECONDS = 0.2


def _key(dag_id: str, run_id: str, map_index: int) -> str:
    return f"group_started:{dag_id}:{run_id}:{map_index}"


def meeting(groups: int) -> Callable[[Any], None]:
    """The hook for a DAG whose ``catch_up`` task is mapped over ``groups`` groups."""

    def meet_the_other_groups(context: Any) -> None:
        ti = context["ti"]
        if ti.task_id != "catch_up":
            return
        Variable.set(_key(ti.dag_id, ti.run_id, ti.map_index), "started")
        deadline = time.monotonic() + WAIT_SECONDS
        others = [i for i in range(groups) if i != ti.map_index]
        while others and time.monotonic() < deadline:
            others = [i for i in others if Variable.get(_key(ti.dag_id, ti.run_id, i), default=None) is None]
            if others:
                time.sleep(_POLL_SECONDS)

    return meet_the_other_groups
