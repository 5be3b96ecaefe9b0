"""The operators take ``sync=`` (a VitessSync, its JSON dict or JSON text) instead of their
flat arguments, and get the same arguments as the DAG factory gives them from the object."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_vitess.capture.sync import SparkConnect, TableSpec, VitessSync
from airflow_provider_vitess.operators import _sync
from airflow_provider_vitess.operators.capture import VitessCatchUpOperator, VitessSnapshotOperator
from airflow_provider_vitess.operators.capture_groups import (
    VitessCatchUpGroupOperator,
    VitessCatchUpPlanOperator,
    VitessSnapshotGroupOperator,
    VitessSnapshotPlanOperator,
)
from airflow_provider_vitess.operators.merge import VitessMergeOperator

SYNC = VitessSync(
    keyspace="customer",
    tables=["customer", TableSpec(name="corder", hash_columns=["email"], mode="history", path="/x/corder")],
    staging_location="/stage",
    target_location="/lake",
    sync_id="orders",
    hash_salt_conn_id="salt",
    budget={"max_events": 70},
    capture={"spill_dir": "/big", "copy_stall_timeout": 60, "minimize_skew": True},
    merge=SparkConnect(conn_id="connect"),
    capture_parallelism=2,
)

OPERATORS: list[tuple[type[Any], _sync.SyncParts]] = [
    (VitessSnapshotOperator, _sync.snapshot_parts),
    (VitessCatchUpOperator, _sync.catch_up_parts),
    (VitessCatchUpPlanOperator, _sync.grouped(_sync.capture_parts)),
    (VitessCatchUpGroupOperator, _sync.catch_up_parts),
    (VitessSnapshotPlanOperator, _sync.grouped(_sync.snapshot_parts)),
    (VitessSnapshotGroupOperator, _sync.snapshot_parts),
    (VitessMergeOperator, _sync.merge_parts),
]


def _dag() -> DAG:
    return DAG("ops", start_date=datetime(2026, 1, 1), schedule=None)


@pytest.mark.parametrize(("operator", "parts"), OPERATORS)
@pytest.mark.parametrize("form", ["object", "dict", "text"])
def test_an_operator_from_sync_has_the_arguments_the_object_derives(
    operator: type[Any], parts: _sync.SyncParts, form: str
) -> None:
    given: Any = {
        "object": SYNC,
        "dict": SYNC.model_dump(mode="json"),
        "text": SYNC.model_dump_json(),
    }[form]
    flat = parts(SYNC, "orders")
    with _dag():
        by_sync = operator(task_id="by_sync", sync=given)
        by_flat = operator(task_id="by_flat", **flat)
    for name in flat:
        # The merge operator keeps a few arguments under its own names (modes, connect_conf).
        if hasattr(by_flat, name):
            assert getattr(by_sync, name) == getattr(by_flat, name), name
    assert by_sync.sync_id == "orders"


def test_the_values_reach_the_operators() -> None:
    with _dag():
        snapshot = VitessSnapshotOperator(task_id="s", sync=SYNC)
        catch_up = VitessCatchUpOperator(task_id="c", sync=SYNC)
        merge = VitessMergeOperator(task_id="m", sync=SYNC, sync_id="other")
    assert snapshot.hash_columns == {"corder": ["email"]}
    assert (snapshot.spill_dir, snapshot.copy_stall_timeout) == ("/big", 60)
    assert snapshot.targets == {"corder": {"mode": "history", "path": "/x/corder"}}
    assert (catch_up.max_events, catch_up.minimize_skew) == (70, True)
    assert (merge.sync_id, merge.spark_connect_conn_id) == ("other", "connect")
    assert merge.modes.target_mode == "mirror"


def test_sync_and_the_same_flat_argument_or_no_sync_id_are_refused() -> None:
    with _dag():
        with pytest.raises(TypeError, match=r"\['max_events'\] given both as arguments and by sync="):
            VitessCatchUpOperator(task_id="c", sync=SYNC, max_events=5)
        with pytest.raises(TypeError, match=r"the sync has no sync_id; give sync_id= or VitessSync"):
            VitessMergeOperator(task_id="m", sync=SYNC.model_copy(update={"sync_id": None}))
        with pytest.raises(TypeError, match=r"in \.partial\(\.\.\.\) give sync=sync\.model_dump"):
            VitessMergeOperator(task_id="m", sync=str(SYNC))
        # Without sync, what it would have given is required, as before.
        with pytest.raises(TypeError, match="missing keyword arguments 'keyspace', 'staging_location'"):
            VitessSnapshotOperator(task_id="s")
        with pytest.raises(TypeError, match="needs sync_id and target_location, or sync="):
            VitessMergeOperator(task_id="m", sync_id="orders")


def test_a_mapped_task_takes_the_json_dict_through_serialisation() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    with _dag() as dag:
        plan = VitessCatchUpPlanOperator(task_id="plan", sync=SYNC)
        VitessCatchUpGroupOperator.partial(task_id="g", sync=SYNC.model_dump(mode="json")).expand(
            group=plan.output
        )
    again = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    kept: Any = again.task_dict["g"]
    assert VitessSync.model_validate(kept.partial_kwargs["sync"]) == SYNC
