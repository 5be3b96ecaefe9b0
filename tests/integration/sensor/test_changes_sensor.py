"""``VitessChangesTrigger`` and ``VitessChangesSensor`` against the real local vtgate.

The watched table is ``customer.chgsensor_watch`` (sharded); ``customer.chgsensor_other`` and
``commerce.chgsensor_other`` are its neighbours. On the local cluster every shard lives in one
MariaDB, so a write to any of them moves every shard's GTID position: these tests prove the
trigger fires on the watched table's changes only, not on positions.

The deferrable sensor runs through Airflow itself in a throwaway ``AIRFLOW_HOME`` (SQLite
metadata database): once with ``dag.test()``, which runs triggers inline, and once with a real
``airflow triggerer`` process picking the trigger up from the database.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from airflow.sdk import PokeReturnValue

from airflow_provider_vitess.hooks import aio
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.sensors import VitessChangesSensor
from airflow_provider_vitess.triggers.changes import VitessChangesTrigger
from airflow_provider_vitess.vgtid import Vgtid
from tests.support.airflow_env import BIN, make_airflow_env
from tests.support.changes_sensor import CONN_ID, DRIVER, OTHER, SYNC_ID, WATCHED, commit_position, current
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

DAG_ID = "vitess_changes_sensor_test"


_next_id = [int(time.time() * 1000)]


def write(hook: VitessHook, qualified_table: str) -> int:
    """Inserts one row (a fresh id) and returns its id."""
    _next_id[0] += 1
    row_id = _next_id[0]
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text(f"INSERT INTO {qualified_table} (id, note) VALUES (:id, :note)"),
            {"id": row_id, "note": f"written at {time.time():.3f}"},
        )
    return row_id


def shard_of(hook: VitessHook, row_id: int) -> str:
    for shard in ("-80", "80-"):
        with hook.connect_sql() as conn:
            conn.execute(sqlalchemy.text(f"USE `customer:{shard}`"))
            found = conn.execute(sqlalchemy.text(f"SELECT 1 FROM {WATCHED} WHERE id = :id"), {"id": row_id})
            here = found.first() is not None
            conn.execute(sqlalchemy.text("USE customer"))  # pooled: leave no shard target behind
            if here:
                return shard
    raise AssertionError(f"row {row_id} is on no shard")


def trigger_for(start: Vgtid, **kwargs: Any) -> VitessChangesTrigger:
    return VitessChangesTrigger(
        vitess_conn_id=CONN_ID,
        keyspace="customer",
        tables=[WATCHED],
        start_vgtid=start.to_json(),
        heartbeat_interval=1,
        **kwargs,
    )


async def first_event(trigger: VitessChangesTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


# ----- the trigger, run directly in asyncio ---------------------------------------------------


def test_trigger_waits_through_other_writes_and_fires_on_a_row_of_its_table(hook: VitessHook) -> None:
    start = current(hook)

    async def scenario() -> tuple[dict[str, Any], int, float]:
        trigger = trigger_for(start)
        task = asyncio.ensure_future(first_event(trigger))
        await asyncio.sleep(3)
        assert not task.done(), "fired with no change at all"
        # Another table of the keyspace and another keyspace: positions move, the table did not.
        await asyncio.to_thread(write, hook, f"customer.{OTHER}")
        await asyncio.to_thread(write, hook, f"commerce.{OTHER}")
        await asyncio.sleep(3)
        assert not task.done(), f"fired on other tables' writes: {task.result() if task.done() else ''}"
        written = time.monotonic()
        row_id = await asyncio.to_thread(write, hook, f"customer.{WATCHED}")
        payload = await asyncio.wait_for(task, timeout=10)
        assert trigger.streams_opened == 1
        return payload, row_id, time.monotonic() - written

    payload, row_id, latency = asyncio.run(scenario())
    assert payload["status"] == "change"
    assert payload["reason"] == "row"
    assert (payload["keyspace"], payload["table"], payload["rows"]) == ("customer", WATCHED, 1)
    assert payload["shard"] == shard_of(hook, row_id)
    assert abs(payload["commit_ts"] - time.time()) < 60
    assert latency < 5


def test_trigger_fires_at_once_for_a_change_already_past_the_start(hook: VitessHook) -> None:
    start = current(hook)
    row_id = write(hook, f"customer.{WATCHED}")
    write(hook, f"customer.{OTHER}")
    began = time.monotonic()
    payload = asyncio.run(asyncio.wait_for(first_event(trigger_for(start)), timeout=10))
    assert (payload["reason"], payload["table"], payload["shard"]) == ("row", WATCHED, shard_of(hook, row_id))
    assert time.monotonic() - began < 5


def test_trigger_fires_on_a_ddl_of_its_table(hook: VitessHook) -> None:
    start = current(hook)
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text(f"ALTER TABLE customer.{WATCHED} COMMENT = 'changed {time.time():.0f}'"))
    payload = asyncio.run(asyncio.wait_for(first_event(trigger_for(start)), timeout=15))
    assert (payload["reason"], payload["table"]) == ("ddl", WATCHED)
    assert "COMMENT" in payload["statement"].upper()


def test_trigger_fires_on_lag_over_the_threshold(hook: VitessHook) -> None:
    """Positions move with writes to any table: that is what the lag threshold is about."""
    start = current(hook)
    write(hook, f"customer.{OTHER}")
    payload = asyncio.run(
        asyncio.wait_for(first_event(trigger_for(start, lag_threshold=0, lag_check_interval=1)), timeout=15)
    )
    assert payload["reason"] == "lag"
    assert set(payload["lag"]) == {"customer/-80", "customer/80-"}
    assert max(payload["lag"].values()) >= 1


def test_cancelling_the_trigger_cancels_the_stream_and_closes_the_channel(
    hook: VitessHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[bool] = []
    real_close = aio.AsyncVStreamClient.close

    async def close(self: aio.AsyncVStreamClient) -> None:
        closed.append(True)
        await real_close(self)

    monkeypatch.setattr(aio.AsyncVStreamClient, "close", close)
    start = current(hook)

    async def scenario() -> float:
        task = asyncio.ensure_future(first_event(trigger_for(start)))
        await asyncio.sleep(2)
        assert not task.done()
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 2
    assert closed == [True]


def test_trigger_reports_a_refused_stream_as_an_error_event(hook: VitessHook) -> None:
    start = current(hook)
    entries = [(sg.keyspace, sg.shard, sg.gtid) for sg in start.shard_gtids]
    bogus = Vgtid.from_json(
        json.dumps(
            [{"keyspace": k, "shard": s, "gtid": g, "table_p_ks": []} for k, s, g in entries]
            + [{"keyspace": "customer", "shard": "c0-", "gtid": entries[0][2], "table_p_ks": []}]
        )
    )
    payload = asyncio.run(asyncio.wait_for(first_event(trigger_for(bogus, max_reconnects=1)), timeout=30))
    assert payload["status"] == "error", payload
    assert "c0-" in payload["message"]


def test_the_trigger_reaches_vtgate_over_tls_and_reports_wrong_credentials(
    vitess: LocalVitess, hook: VitessHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same TLS files and credentials metadata as the blocking hook, read asynchronously."""
    monkeypatch.setenv(*connection_uri_env("vitess_changes_tls", vitess, tls=True, tls_ca=vitess.tls_ca))
    start = current(hook)
    row_id = write(hook, f"customer.{WATCHED}")
    trigger = VitessChangesTrigger(
        vitess_conn_id="vitess_changes_tls",
        keyspace="customer",
        tables=[WATCHED],
        start_vgtid=start.to_json(),
    )
    payload = asyncio.run(asyncio.wait_for(first_event(trigger), timeout=15))
    assert (payload["reason"], payload["shard"]) == ("row", shard_of(hook, row_id))

    wrong = LocalVitess(
        vitess.host, vitess.grpc_port, vitess.mysql_port, vitess.user, "not-it", vitess.tls_ca
    )
    monkeypatch.setenv(*connection_uri_env("vitess_changes_wrong", wrong))
    trigger = VitessChangesTrigger(
        vitess_conn_id="vitess_changes_wrong",
        keyspace="customer",
        tables=[WATCHED],
        start_vgtid=start.to_json(),
    )
    payload = asyncio.run(asyncio.wait_for(first_event(trigger), timeout=15))
    assert payload["status"] == "error", payload
    assert "PERMISSION_DENIED" in payload["message"] or "UNAUTHENTICATED" in payload["message"]
    assert "password of connection 'vitess_changes_wrong'" in payload["message"]
    assert "not-it" not in payload["message"]


# ----- the sensor poking (not deferrable) ----------------------------------------------------


def sensor_for(start: Vgtid | None, **kwargs: Any) -> VitessChangesSensor:
    return VitessChangesSensor(
        task_id="wait",
        vitess_conn_id=CONN_ID,
        keyspace="customer",
        tables=[WATCHED],
        start_vgtid=start.to_json() if start is not None else "None",
        deferrable=False,
        poke_read_seconds=10,
        **kwargs,
    )


def test_poke_reads_to_the_current_position_and_finds_only_its_tables_changes(hook: VitessHook) -> None:
    start = current(hook)
    sensor = sensor_for(start)
    context: Any = {}
    began = time.monotonic()
    assert sensor.poke(context) is False
    write(hook, f"customer.{OTHER}")
    write(hook, f"commerce.{OTHER}")
    assert sensor.poke(context) is False  # read up to the current position: nothing of its table
    assert time.monotonic() - began < 10
    row_id = write(hook, f"customer.{WATCHED}")
    result = sensor.poke(context)
    assert isinstance(result, PokeReturnValue) and result.is_done
    summary = result.xcom_value
    assert isinstance(summary, dict)
    assert (summary["reason"], summary["table"], summary["shard"]) == ("row", WATCHED, shard_of(hook, row_id))


def test_poke_fires_on_lag_and_succeeds_at_once_without_a_checkpoint(hook: VitessHook) -> None:
    start = current(hook)
    write(hook, f"customer.{OTHER}")
    context: Any = {}
    result = sensor_for(start, lag_threshold=0).poke(context)
    assert isinstance(result, PokeReturnValue) and isinstance(result.xcom_value, dict)
    assert result.xcom_value["reason"] == "lag" and result.xcom_value["keyspace"] == "customer"
    assert sensor_for(None).execute(context) == {"reason": "no_checkpoint", "keyspace": "customer"}


# ----- the sensor through Airflow -------------------------------------------------------------


DAG_FILE = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_vitess.sensors import VitessChangesSensor

with DAG({dag_id!r}, schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    VitessChangesSensor(
        task_id="wait",
        vitess_conn_id={conn_id!r},
        keyspace="customer",
        tables=[{table!r}],
        sync_id={sync_id!r},
        heartbeat_interval=1,
        timeout=120,
        deferrable=True,
    )
"""


@pytest.fixture(scope="module")
def airflow_home(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated throwaway Airflow (SQLite) whose dags folder holds the sensor's DAG; its env."""
    airflow = make_airflow_env(tmp_path_factory.mktemp("af-changes"), vitess)
    store_url = f"sqlite:///{airflow.home / 'vitess_sync.db'}"
    airflow.write_dag(
        "changes_dag",
        DAG_FILE.format(dag_id=DAG_ID, conn_id="vitess_default", table=WATCHED, sync_id=SYNC_ID),
    )
    (airflow.home / "driver.py").write_text(textwrap.dedent(DRIVER))
    return {**airflow.env, "STORE_URL": store_url}


def metadata(env: dict[str, str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{env['AIRFLOW_HOME']}/airflow.db?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def ti_state(env: dict[str, str]) -> str | None:
    rows = metadata(
        env,
        "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = 'wait' ORDER BY start_date DESC",
        DAG_ID,
    )
    return rows[0][0] if rows else None


def tail(proc: subprocess.Popen[str]) -> str:
    log = getattr(proc, "log_path", None)
    return log.read_text()[-5000:] if isinstance(log, Path) else ""


def wait_until(what: str, done: Callable[[], bool], timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"the DAG run ended while waiting for {what}:\n{tail(proc)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_driver(env: dict[str, str], mode: str, log: Path) -> subprocess.Popen[str]:
    home = Path(env["AIRFLOW_HOME"])
    proc = subprocess.Popen(
        [sys.executable, str(home / "driver.py"), mode, str(home / "dags" / "changes_dag.py"), DAG_ID],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert results, f"the DAG run printed no result:\n{output[-5000:]}"
    return str(json.loads(results[-1][len("RESULT ") :])["state"])


def xcom_summary(env: dict[str, str]) -> dict[str, Any]:
    rows = metadata(
        env,
        "SELECT value FROM xcom WHERE dag_id = ? AND task_id = 'wait' AND key = 'return_value' "
        "ORDER BY timestamp DESC",
        DAG_ID,
    )
    assert rows, "the sensor pushed no XCom"
    value = json.loads(rows[0][0])
    while isinstance(value, str):  # stored as JSON text of the serialized value
        value = json.loads(value)
    assert isinstance(value, dict)
    return value


def test_deferrable_sensor_with_dag_test_runs_the_trigger_inline_and_resumes_on_a_write(
    hook: VitessHook, airflow_home: dict[str, str], tmp_path: Path
) -> None:
    commit_position(airflow_home["STORE_URL"], current(hook))
    log = tmp_path / "dag_test.log"
    proc = start_driver(airflow_home, "inline", log)
    try:
        wait_until("the inline trigger", lambda: "running trigger in line" in log.read_text(), 60, proc)
        time.sleep(3)
        assert proc.poll() is None, f"the sensor finished before any change:\n{log.read_text()[-3000:]}"
        row_id = write(hook, f"customer.{WATCHED}")
        state = finish(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert state == "success", output[-5000:]
    assert output.index("Pausing task as DEFERRED") < output.index("running trigger in line")
    assert ti_state(airflow_home) == "success"
    summary = xcom_summary(airflow_home)
    assert (summary["reason"], summary["table"], summary["shard"]) == ("row", WATCHED, shard_of(hook, row_id))


def test_deferrable_sensor_defers_to_a_real_triggerer_and_resumes_when_a_change_is_written(
    hook: VitessHook, airflow_home: dict[str, str], tmp_path: Path
) -> None:
    commit_position(airflow_home["STORE_URL"], current(hook))
    triggerer_log = tmp_path / "triggerer.log"
    triggerer = subprocess.Popen(
        [str(BIN / "airflow"), "triggerer"],
        env=airflow_home,
        stdout=triggerer_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: it runs a trigger-runner child
    )
    log = tmp_path / "dag_test.log"
    proc: subprocess.Popen[str] | None = None
    try:
        proc = start_driver(airflow_home, "triggerer", log)
        driver = proc
        wait_until("the task to defer", lambda: ti_state(airflow_home) == "deferred", 60, driver)

        def picked_up() -> bool:
            rows = metadata(
                airflow_home,
                "SELECT t.triggerer_id, t.classpath FROM trigger t JOIN task_instance ti "
                "ON ti.trigger_id = t.id WHERE ti.dag_id = ? AND ti.task_id = 'wait'",
                DAG_ID,
            )
            return bool(rows) and rows[0][0] is not None

        wait_until("the triggerer to take the trigger", picked_up, 60, driver)
        classpath = metadata(airflow_home, "SELECT classpath FROM trigger")[-1][0]
        assert classpath == "airflow_provider_vitess.triggers.changes.VitessChangesTrigger"
        time.sleep(3)  # the trigger runs: with no change, the task stays deferred
        assert ti_state(airflow_home) == "deferred", log.read_text()[-3000:]
        row_id = write(hook, f"customer.{WATCHED}")
        state = finish(driver, log)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        os.killpg(triggerer.pid, signal.SIGTERM)
        try:
            triggerer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(triggerer.pid, signal.SIGKILL)
            triggerer.wait()
    output = log.read_text()
    assert state == "success", output[-5000:]
    assert "running trigger in line" not in output
    assert ti_state(airflow_home) == "success"
    summary = xcom_summary(airflow_home)
    assert (summary["reason"], summary["table"], summary["shard"]) == ("row", WATCHED, shard_of(hook, row_id))
    # The triggerer ran the trigger and wrote its log next to the task's.
    (run_id,) = metadata(
        airflow_home,
        "SELECT run_id FROM task_instance WHERE dag_id = ? ORDER BY start_date DESC LIMIT 1",
        DAG_ID,
    )[0]
    logs = Path(airflow_home["AIRFLOW_HOME"], "logs", f"dag_id={DAG_ID}", f"run_id={run_id}", "task_id=wait")
    trigger_logs = list(logs.glob("*trigger*"))
    trigger_output = "".join(p.read_text() for p in trigger_logs)
    assert "Trigger fired event" in trigger_output, triggerer_log.read_text()[-3000:]
    assert "Change found" in trigger_output
