"""The fleet of ``dev/fleet.sh`` for the fleet tests (``make test-fleet``; not part of ``make test``).

One fleet per test session: started by the first test that needs it (or found running, e.g. a
``make fleet`` a person looks at) and stopped at the end if this session started it. The tests
drive it as a user does: DAG files deployed to each host, runs through the api-server's REST API
(:class:`tests.support.airflow_services.AirflowServices`' client), objects read from S3,
checkpoints from the PostgreSQL store.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
from pyspark.sql import SparkSession

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging.files import open_location
from tests.support.airflow_env import AirflowEnv
from tests.support.airflow_services import AirflowServiceError, AirflowServices
from tests.support.delta_check import delta_txns
from tests.support.local import REPO, LocalVitess, connection_uri_env, machine_lock
from tests.support.merge_workload import assert_equal_to_source

SCRIPT = REPO / "dev" / "fleet.sh"
_LOG_TAIL = 3000
CONTROL_PARTS = ("redis", "postgres", "api-server", "scheduler", "dag-processor", "triggerer", "triggerer-2")

# A grouped sync on the fleet's S3 and store; a new DAG (sync) id for each test, as the fleet may
# have run the test before (its store and bucket then hold that sync's windows). ``pre_execute`` is
# ``meeting(2)`` where a test needs the two groups at once, else None (``Fleet.deploy_sync``).
STORE = 'checkpoint_conn_id="fleet_store",'
SYNC_DAG = """
from datetime import timedelta
from airflow_provider_vitess.dag_factory import vitess_sync_dag
from tests.support.group_meeting import meeting

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="customer",
    tables=["{table}"],
    staging_location="s3a://{bucket}/staging",
    target_location="s3a://{bucket}/delta/{dag_id}",
    aws_conn_id="fleet_s3",
    {store}
    schedule=None,
    capture_parallelism=2,
    wait_for_changes=False,
    default_args={{
        "retries": {retries},
        "retry_delay": timedelta(seconds={retry_delay}),
        "pre_execute": {pre_execute},
    }},
    merge_kwargs={{"spark_connect_conn_id": "spark_connect_default"}},
)
"""


def fleet_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)


class FleetServices(AirflowServices):
    """The REST client of :class:`AirflowServices` on the fleet's api-server; the fleet's parts
    are not this process's children, so their liveness and logs come from ``dev/fleet.sh``."""

    state: Path
    hosts: tuple[str, ...]
    # Parts a test killed on purpose (a triggerer's death): not a failure of the fleet.
    killed: set[str]

    def check_alive(self) -> None:
        """The control host's parts and the servers run (a test may have killed a worker, or a
        part named in ``killed``)."""
        down = []
        for part in set(CONTROL_PARTS) - self.killed:
            try:
                os.kill(int((self.state / "pids" / part).read_text()), 0)
            except (OSError, ValueError):
                down.append(part)
        if down:
            raise AirflowServiceError(f"fleet parts down: {down}\n{self.logs()}")

    def logs(self, *names: str) -> str:
        parts = []
        for name in names or ("scheduler", *[h for h in self.hosts if h != "control"]):
            path = self.state / "logs" / f"{name}.log"
            text = path.read_text(errors="replace")[-_LOG_TAIL:] if path.exists() else "(no log)"
            parts.append(f"--- {path} ---\n{text}")
        return "\n".join(parts)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """A task's log from the disk of the worker that ran it: the api-server cannot fetch it
        (every worker's log server has a port of its own here, and its host name is no DNS name)."""
        found = []
        for host in self.hosts:
            base = self.state / host / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
            found += [
                f"--- {host}: {path} ---\n{path.read_text(errors='replace')}"
                for path in sorted(base.glob(f"task_id={task_id}/**/attempt={try_number}.log"))
            ]
        return "\n".join(found) or f"(no log of {task_id} try {try_number} on {self.hosts})"

    def deploy(self, name: str, source: str, tmp: Path) -> None:
        """The DAG file ``name``.py on every host (the control host's and each worker's dags folder)."""
        path = tmp / f"{name}.py"
        path.write_text(source)
        done = fleet_script("deploy", str(path), timeout=60)
        assert done.returncode == 0, done.stderr

    def run(self, dag_id: str, timeout: float = 300) -> dict[str, Any]:
        """One run triggered through the REST API, once it has finished."""
        return self.wait_for_run(dag_id, self.trigger(dag_id)["dag_run_id"], timeout)

    def groups(self, dag_id: str, run_id: str, task_id: str = "catch_up") -> list[dict[str, Any]]:
        """The run's mapped ``task_id`` task instances (one per group: ``catch_up``, or the
        grouped snapshot's ``snapshot``), by map index."""
        tis = [ti for ti in self.task_instances(dag_id, run_id) if ti["task_id"] == task_id]
        return sorted(tis, key=lambda ti: ti["map_index"])

    def merged(self, dag_id: str, run_id: str) -> int:
        """The window the run's merge committed (its XCom)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/merge/xcomEntries/return_value"
        return int(self.api("GET", path)["value"]["merged"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> dict[str, Any]:
        """Until the run has finished; the run."""
        deadline = time.monotonic() + timeout
        while True:
            run: dict[str, Any] = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] in ("success", "failed"):
                return run
            if time.monotonic() > deadline:
                raise AirflowServiceError(
                    f"run {run_id} not done after {timeout:.0f} s: {self.task_states(dag_id, run_id)}\n"
                    + self.logs()
                )
            self.check_alive()
            time.sleep(1)


@dataclass(frozen=True)
class Fleet:
    api: FleetServices
    values: dict[str, str]
    s3: S3Settings

    @property
    def bucket(self) -> str:
        return self.values["FLEET_BUCKET"]

    @property
    def connect_url(self) -> str:
        return self.values["FLEET_CONNECT_URL"]

    @property
    def store_url(self) -> str:
        return self.values["FLEET_STORE_URL"]

    def deploy_sync(
        self,
        dag_id: str,
        table: str,
        tmp_path: Path,
        *,
        retries: int = 0,
        retry_delay: int = 1,
        store: str = STORE,
        meet: bool = False,
    ) -> None:
        """:data:`SYNC_DAG` of ``table`` deployed, parsed and unpaused; ``meet``: its groups'
        ``catch_up`` tasks wait for each other (``tests.support.group_meeting``)."""
        source = SYNC_DAG.format(
            dag_id=dag_id,
            table=table,
            bucket=self.bucket,
            store=store,
            retries=retries,
            retry_delay=retry_delay,
            pre_execute="meeting(2)" if meet else None,
        )
        self.api.deploy(dag_id, source, tmp_path)
        self.api.wait_for_dag(dag_id)
        self.api.unpause(dag_id)


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    with machine_lock("fleet"):
        was_running = fleet_script("status", timeout=60).returncode == 0
        started = fleet_script("start", timeout=900)
    assert started.returncode == 0, f"dev/fleet.sh start failed:\n{started.stderr[-5000:]}"
    values = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    state = Path(values["FLEET_STATE_DIR"])
    api = FleetServices(
        AirflowEnv(state / "control" / "airflow"),
        int(values["FLEET_API_URL"].rsplit(":", 1)[1]),
        state / "logs",
    )
    api.state, api.hosts, api.killed = state, tuple(values["FLEET_HOSTS"].split()), set()
    password = json.loads(Path(values["FLEET_PASSWORD_FILE"]).read_text())[values["FLEET_USER"]]
    response = httpx.post(
        f"{values['FLEET_API_URL']}/auth/token", json={"username": values["FLEET_USER"], "password": password}
    )
    assert response.status_code in (200, 201), response.text
    api.token = response.json()["access_token"]
    s3 = S3Settings(
        access_key_id=values["S3_ACCESS_KEY_ID"],
        secret_access_key=Path(values["S3_SECRET_KEY_FILE"]).read_text().strip(),
        endpoint_url=values["S3_ENDPOINT_URL"],
        region=values["S3_REGION"],
        path_style=True,
    )
    try:
        yield Fleet(api, values, s3)
    finally:
        api.client.close()
        if not was_running:
            fleet_script("stop", timeout=300)


@pytest.fixture
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_fleet_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_fleet_test")


@pytest.fixture(scope="session")
def spark(fleet: Fleet) -> Iterator[SparkSession]:
    """A session on the fleet's Spark Connect server: it reads the s3a:// tables with its S3A
    settings, as the merges wrote them."""
    session = SparkSession.builder.remote(fleet.connect_url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def kill_host(fleet: Fleet, part: str) -> list[int]:
    """SIGKILL every process of the fleet's ``part`` (a worker, a triggerer): the pid dev/fleet.sh
    recorded, leader of its own session, and every process descended from it or in its session
    (setproctitle overwrites their environment, so it cannot tell them); their pids."""
    root = int((fleet.api.state / "pids" / part).read_text())
    parent, session = {}, {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            parent[int(proc.name)], session[int(proc.name)] = int(fields[1]), int(fields[3])
    ours = {pid for pid, sid in session.items() if sid == root} | {root}
    grew = True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in ours} - ours
        ours |= more
        grew = bool(more)
    for pid in sorted(ours):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(ours)


def select_count(hook: VitessHook, table: str) -> int:
    with hook.connect_sql() as conn:
        return int(conn.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def assert_synced(
    fleet: Fleet, spark: SparkSession, hook: VitessHook, sync: str, table: str, *, must_hold: int
) -> Counter[int]:
    """``customer.table``'s Delta table of ``sync`` on S3 == ``SELECT *`` through vtgate, and its
    Delta log holds every window with changes once (``must_hold`` among them), no window twice,
    none the store does not know. The windows applied, with their counts."""
    bucket = fleet.bucket
    assert_equal_to_source(
        spark, hook, "customer", table, f"s3a://{bucket}/delta/{sync}/{table}", ["order_id"]
    )
    store = CheckpointStore(fleet.store_url)
    fs, _ = open_location(f"s3a://{bucket}", fleet.s3.storage_options())
    applied = Counter(
        v
        for app, v, _ in delta_txns(f"{bucket}/delta/{sync}/{table}", fs)
        if app.endswith(f":{sync}:{table}")
    )
    _, committed = store.committed(sync)
    with_changes = {
        seq for seq in range(1, committed + 1) if (store.window(sync, seq).stats or {}).get("rows")
    }
    assert applied and max(applied.values()) == 1, f"a window was applied twice: {applied}"
    assert must_hold in with_changes and with_changes <= set(applied) <= set(range(1, committed + 1)), (
        applied,
        with_changes,
    )
    assert store.open_window(sync) is None
    return applied
