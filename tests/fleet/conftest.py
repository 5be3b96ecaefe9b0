"""The fleet of ``dev/fleet.sh`` for the fleet tests (``make test-fleet``; not part of ``make test``).

One fleet per test session: started by the first test that needs it (or found running, e.g. a
``make fleet`` a person looks at) and stopped at the end if this session started it. The tests
drive it as a user does: DAG files deployed to each host, runs through the api-server's REST API
(:class:`tests.integration.airflow_services.AirflowServices`' client), objects read from S3,
checkpoints from the PostgreSQL store.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_provider_vitess.object_storage import S3Settings
from tests.conftest import REPO, machine_lock
from tests.integration.airflow_env import AirflowEnv
from tests.integration.airflow_services import AirflowServiceError, AirflowServices

SCRIPT = REPO / "dev" / "fleet.sh"
_LOG_TAIL = 3000


def fleet_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)


class FleetServices(AirflowServices):
    """The REST client of :class:`AirflowServices` on the fleet's api-server; the fleet's parts
    are not this process's children, so their liveness and logs come from ``dev/fleet.sh``."""

    state: Path
    hosts: tuple[str, ...]

    def check_alive(self) -> None:
        if fleet_script("status", timeout=60).returncode != 0:
            raise AirflowServiceError(f"a part of the fleet is down\n{self.logs()}")

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
    api.state, api.hosts = state, tuple(values["FLEET_HOSTS"].split())
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
