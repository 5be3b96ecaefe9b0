"""The trigger serializes to its class path and kwargs (never credentials); the sensor defers
to it, succeeds at once without a checkpoint, and turns the trigger's events into results."""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.sensors import VitessChangesSensor
from airflow_provider_vitess.triggers import VitessChangesTrigger
from airflow_provider_vitess.utils.airflow_compat import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferred,
)
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream import moves
from airflow_provider_vitess.vstream.moves import TableMove

START = Vgtid.from_json(
    '[{"keyspace":"customer","shard":"-80","gtid":"MariaDB/0-1-5","table_p_ks":[]},'
    '{"keyspace":"customer","shard":"80-","gtid":"MariaDB/0-1-6","table_p_ks":[]}]'
)
CONTEXT: Any = {}


def test_trigger_serialize_round_trip_holds_the_conn_id_only() -> None:
    trigger = VitessChangesTrigger(
        vitess_conn_id="vitess_prod",
        keyspace="customer",
        tables=("orders", "customers"),
        start_vgtid=START.to_json(),
        lag_threshold=1000,
        heartbeat_interval=5,
        lag_check_interval=30,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_vitess.triggers.changes.VitessChangesTrigger"
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON: storable by the triggerer
    assert kwargs["vitess_conn_id"] == "vitess_prod"
    assert kwargs["tables"] == ["orders", "customers"]
    assert Vgtid.from_json(kwargs["start_vgtid"]) == START
    assert not {"password", "login", "host", "extra"} & set(kwargs)


def test_trigger_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="at least one table"):
        VitessChangesTrigger(vitess_conn_id="c", keyspace="k", tables=[], start_vgtid=START.to_json())
    with pytest.raises(ValueError, match="heartbeat_interval"):
        VitessChangesTrigger(
            vitess_conn_id="c", keyspace="k", tables=["t"], start_vgtid=START.to_json(), heartbeat_interval=0
        )


def test_trigger_with_a_copying_start_fires_without_connecting() -> None:
    copying = Vgtid.from_json('[{"keyspace":"customer","shard":"-80","gtid":"","table_p_ks":[]}]')
    trigger = VitessChangesTrigger(
        vitess_conn_id="not_defined_anywhere",
        keyspace="customer",
        tables=["orders"],
        start_vgtid=copying.to_json(),
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    assert asyncio.run(first()) == {"status": "change", "reason": "copy_unfinished", "keyspace": "customer"}


def sensor(**kwargs: Any) -> VitessChangesSensor:
    args: dict[str, Any] = {"task_id": "wait", "keyspace": "customer", "tables": "orders"} | kwargs
    return VitessChangesSensor(**args)


def test_sensor_needs_exactly_one_start() -> None:
    with pytest.raises(ValueError, match="either sync_id"):
        sensor()
    with pytest.raises(ValueError, match="either sync_id"):
        sensor(sync_id="s", start_vgtid=START.to_json())
    with pytest.raises(ValueError, match="lag_threshold"):
        sensor(sync_id="s", lag_threshold=-1)
    assert sensor(sync_id="s").tables == ["orders"]


def _store_connection(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    """An Airflow connection naming a SQLite checkpoint store; returns the store's URL."""
    monkeypatch.setenv("AIRFLOW_CONN_VITESS_STORE", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return f"sqlite:///{path}"


def _no_movetables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No vtgate in these tests: the MoveTables check of a "no change" wait finds no move (it
    has a test of its own, below)."""
    monkeypatch.setattr(VitessChangesSensor, "refuse_moved_tables", lambda self: None)


def _committed_sync(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """A checkpoint store where sync "orders" of keyspace customer committed START."""
    store = CheckpointStore(_store_connection(monkeypatch, path))
    store.migrate()
    store.ensure_sync("orders", "customer", ["orders"], {})
    seq = store.plan_window("orders", "snapshot", Vgtid.for_keyspace("customer", ""))
    store.mark_staged("orders", seq, START, "/x/manifest.json")
    store.mark_merged("orders", seq)
    store.commit("orders", seq)
    store.close()


def test_sensor_defers_to_the_trigger_from_the_committed_vgtid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed_sync(monkeypatch, tmp_path / "store.db")
    task = sensor(
        sync_id="orders",
        checkpoint_conn_id="vitess_store",
        vitess_conn_id="vt",
        lag_threshold=50,
        timeout=600,
        deferrable=True,
    )
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(CONTEXT)
    assert deferred.value.method_name == "execute_complete"
    # The trigger ends the wait at the sensor's timeout (a "timeout" event, a skip); the deferral
    # outlives it by a margin, so only a triggerer that never answered fails the task that way.
    assert deferred.value.timeout == timedelta(seconds=600 + VitessChangesSensor.DEFERRAL_MARGIN_SECONDS)
    trigger = deferred.value.trigger
    assert isinstance(trigger, VitessChangesTrigger)
    _, kwargs = trigger.serialize()
    assert kwargs["vitess_conn_id"] == "vt" and kwargs["lag_threshold"] == 50
    assert Vgtid.from_json(kwargs["start_vgtid"]) == START


def test_sensor_without_a_checkpoint_succeeds_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = _store_connection(monkeypatch, tmp_path / "never_used.db")
    assert sensor(sync_id="orders", checkpoint_conn_id="vitess_store").execute(CONTEXT) == {
        "reason": "no_checkpoint",
        "keyspace": "customer",
    }
    store = CheckpointStore(empty)
    store.migrate()
    store.close()
    assert (
        sensor(sync_id="orders", checkpoint_conn_id="vitess_store").execute(CONTEXT)["reason"]
        == "no_checkpoint"
    )
    assert sensor(start_vgtid="None").execute(CONTEXT)["reason"] == "no_checkpoint"


def test_sensor_resumes_with_the_change_or_raises_the_error() -> None:
    task = sensor(start_vgtid=START.to_json())
    event = {"status": "change", "reason": "row", "keyspace": "customer", "table": "orders", "shard": "-80"}
    assert task.execute_complete(CONTEXT, event) == {
        "reason": "row",
        "keyspace": "customer",
        "table": "orders",
        "shard": "-80",
    }
    with pytest.raises(AirflowException, match="vtgate said no"):
        task.execute_complete(CONTEXT, {"status": "error", "message": "vtgate said no"})
    with pytest.raises(AirflowException, match="without an event"):
        task.execute_complete(CONTEXT, None)


def test_the_trigger_ends_the_wait_itself_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_movetables(monkeypatch)
    # dag.test() runs triggers inline without enforcing the deferral timeout: the trigger must.
    trigger = VitessChangesTrigger(
        vitess_conn_id="unused", keyspace="customer", tables=["orders"], start_vgtid=START.to_json(),
        timeout_at=time.time() - 1,
    )  # fmt: skip
    assert trigger.serialize()[1]["timeout_at"] == trigger.timeout_at

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    # It never read (nor learnt the position to read up to): that is not "no change", the run
    # goes on (its catch-up reads whatever there is).
    payload = asyncio.run(first_event())
    assert (payload["status"], payload["reason"]) == ("change", "scan_unfinished"), payload
    with pytest.raises(AirflowSensorTimeout, match=r"No change to customer\.orders within"):
        sensor(start_vgtid=START.to_json(), timeout=5).execute_complete(CONTEXT, {"status": "timeout"})


def test_only_no_change_skips_errors_fail_and_permanent_ones_without_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_movetables(monkeypatch)
    # What vitess_sync_dag's sensor does (skip_on_timeout, never soft_fail): an outage, refused
    # credentials or a purged position must fail the task, never look like "no changes".
    from airflow_provider_vitess.dag_factory import vitess_sync_dag

    dag = vitess_sync_dag(
        "d", keyspace="customer", tables=["orders"], staging_location="/s", target_location="/t"
    )
    task = dag.get_task("wait_for_changes")
    assert isinstance(task, VitessChangesSensor)
    assert (task.soft_fail, task.never_fail, task.skip_on_timeout) == (False, False, True)
    with pytest.raises(AirflowSkipException, match=r"No change to customer\.orders within .*skipped"):
        task.execute_complete(CONTEXT, {"status": "timeout"})
    refused = {"status": "error", "message": "gRPC status UNAUTHENTICATED: bad password", "permanent": False}
    with pytest.raises(AirflowException, match="UNAUTHENTICATED") as failed:
        task.execute_complete(CONTEXT, refused)
    assert not isinstance(failed.value, (AirflowSkipException, AirflowFailException))
    unknown = {"status": "error", "message": "keyspace 'nope' is not served", "permanent": True}
    with pytest.raises(AirflowFailException, match=r"not served.*not retried"):
        task.execute_complete(CONTEXT, unknown)
    # A wait whose read the timeout cut short of the position it started at: the run goes on.
    unfinished = {
        "status": "change",
        "reason": "scan_unfinished",
        "keyspace": "customer",
        "lag": {"customer/-80": 7},
    }
    assert task.execute_complete(CONTEXT, unfinished) == {
        k: v for k, v in unfinished.items() if k != "status"
    }


def test_the_dag_factory_passes_lag_threshold_to_its_sensor() -> None:
    from airflow_provider_vitess.dag_factory import vitess_sync_dag

    def sensor(**kwargs: Any) -> VitessChangesSensor:
        dag = vitess_sync_dag(
            "d", keyspace="customer", tables=["orders"], staging_location="/s", target_location="/t", **kwargs
        )
        task = dag.get_task("wait_for_changes")
        assert isinstance(task, VitessChangesSensor)
        return task

    assert sensor().lag_threshold is None
    assert sensor(lag_threshold=5000).lag_threshold == 5000


def test_a_wait_that_never_reached_vtgate_ends_in_an_error_not_in_no_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(
        "AIRFLOW_CONN_VT_DOWN",
        json.dumps(
            {"conn_type": "vitess", "host": "127.0.0.1", "port": port, "extra": {"timeout_seconds": 30}}
        ),
    )
    trigger = VitessChangesTrigger(
        vitess_conn_id="vt_down", keyspace="customer", tables=["orders"], start_vgtid=START.to_json(),
        timeout_at=time.time() + 2,
    )  # fmt: skip

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(first_event())
    assert (event["status"], event["permanent"]) == ("error", False)
    assert event["message"] == (
        "could not watch keyspace 'customer' tables orders: vtgate did not answer until the sensor's "
        "timeout (no connection to vtgate yet)"
    )


def test_a_wait_that_saw_no_change_on_tables_a_movetables_switched_away_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The keyspace's stream stays silent on moved tables: without the check every run of a
    # sensor-gated DAG would end "no change" (skipped) instead of naming the move.
    _committed_sync(monkeypatch, tmp_path / "store.db")
    conn = {"conn_type": "vitess", "host": "127.0.0.1", "port": 1, "extra": {"mysql_port": 2}}
    monkeypatch.setenv("AIRFLOW_CONN_VT", json.dumps(conn))
    asked: list[tuple[str, list[str]]] = []

    def find_moves(hook: Any, keyspace: str, tables: list[str]) -> list[TableMove]:
        asked.append((keyspace, list(tables)))
        return [TableMove("orders", "commerce", "-80", "MariaDB/0-1-9")]

    monkeypatch.setattr(moves, "find_moves", find_moves)
    task = sensor(sync_id="orders", checkpoint_conn_id="vitess_store", vitess_conn_id="vt", timeout=5)
    with pytest.raises(AirflowFailException, match=r"'orders' moved out of keyspace 'customer'.*'commerce'"):
        task.execute_complete(CONTEXT, {"status": "timeout"})
    assert asked == [("customer", ["orders"])]
    monkeypatch.setattr(moves, "find_moves", lambda hook, keyspace, tables: [])
    with pytest.raises(AirflowSensorTimeout):  # not moved: "no change", as before
        task.execute_complete(CONTEXT, {"status": "timeout"})
