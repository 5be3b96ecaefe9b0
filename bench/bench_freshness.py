"""Benchmark: how long a committed source row takes to be visible in Delta, per sync mode.

Not a test; prints figures. A writer commits ``--rate`` rows a second into ``commerce.bench_fresh``
(``id``, ``written_at DATETIME(6)`` = the source's ``NOW(6)``): one row per transaction up to 10 a
second, above that a transaction of ``rate / 10`` rows every 0.1 s. For
``--minutes`` each, one after another, a DAG from the factory syncs it through Airflow's own
scheduler, dag-processor and triggerer (LocalExecutor), merges on Spark Connect:

* ``on_changes``: ``on_changes=True`` (continuous, behind the deferred changes sensor);
* ``follow``: the same with ``follow_seconds=600``: once the sensor sees a change, one task
  catches up and merges round after round while changes keep coming;
* ``every 1 min`` and ``every 5 min``: ``schedule`` of 1 and 5 minutes, the sensor in front.

Per row: the latency from its commit to the Delta commit (``commitInfo.timestamp`` of the first
version holding it: versions are read after the run, ``max(id)`` at each). Per mode: p50, p95 and
max, and the breakdown of a run's time by its tasks as Airflow records them: the gap after the
previous run, the run's start to its sensor (the snapshot tasks, which find nothing to copy), the
sensor's wait, the scheduling gap to the catch-up, the catch-up, the merge and its commit.

    .venv/bin/python bench/bench_freshness.py [--minutes 10] [--rate 1] [--modes on_changes,1,5]

Run it alone on a quiet machine: it takes ``len(modes) * minutes`` plus a few minutes of start-up.
Target on this 2-core machine (issue 42): ``on_changes`` p50 <= 5 s and p95 <= 10 s, at 1 and at
100 changes a second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import sqlalchemy  # noqa: E402

from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from tests.support.airflow_env import CONNECT_MERGE, make_airflow_env  # noqa: E402
from tests.support.airflow_services import AirflowServices, airflow_services  # noqa: E402
from tests.support.delta_check import spark_session  # noqa: E402
from tests.support.local import connection_uri_env, start_cluster  # noqa: E402
from tests.support.merge_workload import execute  # noqa: E402

TABLE = "bench_fresh"
DAG_FILE = """
import os
from datetime import timedelta
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{dag_id}",
    keyspace="commerce",
    tables=["{table}"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    {schedule}
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""
SCHEDULES = {
    "on_changes": "on_changes=True,",
    "follow": "on_changes=True, follow_seconds=600,",
    "1": "schedule=timedelta(minutes=1),",
    "5": "schedule=timedelta(minutes=5),",
}


# The baseline the targets are measured against: ``on_changes`` on 2026-11-28 (one row every 2 s).
BASELINE = {"p50": 10.8, "p95": 16.9}
TARGET = {"p50": 5.0, "p95": 10.0}


class Writer(threading.Thread):
    """``rate`` rows a second until stopped: a transaction of one row every ``1 / rate`` s, or
    of ``rate / 10`` rows every 0.1 s above 10 a second."""

    def __init__(self, hook: VitessHook, rate: float, first_id: int) -> None:
        super().__init__(daemon=True)
        self.hook, self.next_id = hook, first_id
        self.interval = max(1.0 / rate, 0.1)
        self.per_commit = max(1, round(rate * self.interval))
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.hook.connect_sql() as conn:
            due = time.monotonic()
            while True:
                due += self.interval
                if self.stopping.wait(max(0.0, due - time.monotonic())):
                    return
                ids = range(self.next_id, self.next_id + self.per_commit)
                conn.execute(
                    sqlalchemy.text(f"INSERT INTO commerce.{TABLE} (id, written_at) VALUES (:i, NOW(6))"),
                    [{"i": i} for i in ids],
                )
                conn.commit()
                self.next_id += self.per_commit


def _delta_versions(delta: Path) -> list[tuple[int, float]]:
    """(version, commit time in epoch seconds) of every commit in the table's log."""
    out = []
    for path in sorted((delta / "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                out.append((int(path.stem), info["timestamp"] / 1000.0))
    return out


def _latencies(spark: Any, delta: Path, written: dict[int, float], since: float) -> list[float]:
    """Per row written after ``since``: its Delta commit time minus its source commit time."""
    visible: dict[int, float] = {}
    for version, committed in _delta_versions(delta):
        top = spark.read.format("delta").option("versionAsOf", version).load(str(delta)).agg({"id": "max"})
        high = top.collect()[0][0] or 0
        for row_id, at in written.items():
            if row_id <= high and row_id not in visible and at >= since:
                visible[row_id] = committed - at
    return sorted(visible.values())


def _breakdown(api: AirflowServices, dag_id: str) -> dict[str, float]:
    """Medians over the runs that merged: the gap after the previous run, the run's start to its
    sensor, the sensor's wait, the gap to the catch-up, the catch-up, the merge; and the cycle."""
    parts: dict[str, list[float]] = {
        "cycle": [],
        "between runs": [],
        "to sensor": [],
        "wait for change": [],
        "scheduling": [],
        "capture": [],
        "merge+commit": [],
    }

    def t(ti: dict[str, Any], key: str) -> float:
        return datetime.fromisoformat(ti[key]).timestamp()

    previous: dict[str, Any] | None = None
    runs = sorted((r for r in api.dag_runs(dag_id) if r.get("start_date")), key=lambda r: r["start_date"])
    for run in runs:
        tis = {t["task_id"]: t for t in api.task_instances(dag_id, run["dag_run_id"])}
        merge, catch_up, sensor = tis.get("merge"), tis.get("catch_up"), tis.get("wait_for_changes")
        follow = tis.get("follow")  # one task catches up and merges, in rounds
        if follow is not None:
            merge = catch_up = follow
        before, previous = previous, run
        if not merge or merge["state"] != "success" or not catch_up or not sensor:
            continue
        if before is not None and before.get("end_date") and run.get("end_date"):
            parts["cycle"].append(t(run, "end_date") - t(before, "end_date"))
            parts["between runs"].append(t(run, "start_date") - t(before, "end_date"))
        parts["to sensor"].append(t(sensor, "start_date") - t(run, "start_date"))
        parts["wait for change"].append(t(sensor, "end_date") - t(sensor, "start_date"))
        parts["scheduling"].append(t(catch_up, "start_date") - t(sensor, "end_date"))
        if follow is not None:
            rounds = _follow_rounds(api, dag_id, run["dag_run_id"])
            parts.setdefault("follow rounds", []).append(rounds)
            followed = t(follow, "end_date") - t(follow, "start_date")
            parts.setdefault("s per round", []).append(followed / rounds)
            continue
        parts["capture"].append(t(catch_up, "end_date") - t(catch_up, "start_date"))
        parts["merge+commit"].append(t(merge, "end_date") - t(catch_up, "end_date"))
    return {k: statistics.median(v) for k, v in parts.items() if v}


def _follow_rounds(api: AirflowServices, dag_id: str, run_id: str) -> int:
    """How many rounds the run's follow task ran (its XCom)."""
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/follow/xcomEntries/return_value"
    value = api.api("GET", path, params={"deserialize": "true"})["value"]
    return int((json.loads(value) if isinstance(value, str) else value)["rounds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1.0, help="source rows a second")
    parser.add_argument("--modes", default="on_changes,1,5")
    parser.add_argument("--connect-url", help="a running Spark Connect server (default: start one)")
    args = parser.parse_args()
    cluster = start_cluster()
    name, value = connection_uri_env("vitess_bench_fresh", cluster)
    os.environ[name] = value
    hook = VitessHook("vitess_bench_fresh")
    execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, written_at DATETIME(6) NOT NULL)",
    )
    results: list[tuple[str, list[float], dict[str, float]]] = []
    with _connect_server(args.connect_url) as connect_url:
        first_id = 1
        for mode in args.modes.split(","):
            first_id = _run_mode(hook, cluster, connect_url, mode, args, first_id, results)
    _print(results)
    return 0


def _run_mode(
    hook: VitessHook,
    cluster: Any,
    connect_url: str,
    mode: str,
    args: argparse.Namespace,
    first_id: int,
    results: list[tuple[str, list[float], dict[str, float]]],
) -> int:
    """One mode's DAG for ``args.minutes`` of writes; appends its figures, returns the next id."""
    with tempfile.TemporaryDirectory(prefix=f"bench-fresh-{mode}-") as tmp:
        root = Path(tmp)
        lake = root / "lake"
        dag_id = f"bench_fresh_{mode}"
        env = make_airflow_env(root, cluster, spark_connect=connect_url)
        env.write_dag(
            dag_id,
            DAG_FILE.format(
                dag_id=dag_id,
                table=TABLE,
                lake=lake,
                schedule=SCHEDULES[mode],
                merge_kwargs=CONNECT_MERGE,
            ),
        )
        with airflow_services(env) as api:
            api.wait_for_dag(dag_id)
            api.unpause(dag_id)
            time.sleep(60)  # the first run's snapshot and its merge
            since = time.time()
            writer = Writer(hook, args.rate, first_id)
            writer.start()
            time.sleep(args.minutes * 60)
            writer.stopping.set()
            writer.join()
            first_id = writer.next_id
            time.sleep(360 if mode == "5" else 90)  # the last rows' run
            api.pause(dag_id)
            breakdown = _breakdown(api, dag_id)
        written = _written(hook)
        latencies = _latencies(spark_session(), lake / "delta" / TABLE, written, since)
        results.append((mode, latencies, breakdown))
    return first_id


def _written(hook: VitessHook) -> dict[int, float]:
    """Every row's source commit time (the servers run in UTC), in pages: vtgate refuses a result
    of more than 10,000 rows."""
    written: dict[int, float] = {}
    after = 0
    with hook.connect_sql() as conn:
        while True:
            page = conn.execute(
                sqlalchemy.text(
                    f"SELECT id, written_at FROM commerce.{TABLE} WHERE id > :after ORDER BY id LIMIT 5000"
                ),
                {"after": after},
            ).all()
            if not page:
                return written
            written.update((int(r[0]), r[1].replace(tzinfo=timezone.utc).timestamp()) for r in page)
            after = int(page[-1][0])


def _print(results: list[tuple[str, list[float], dict[str, float]]]) -> None:
    print(f"\n{'mode':<12} {'rows':>6} {'p50 s':>7} {'p95 s':>7} {'max s':>7}  breakdown (median s per run)")
    for mode, lat, parts in results:
        if not lat:
            print(f"{mode:<12} no row became visible")
            continue
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        shown = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        print(f"{mode:<12} {len(lat):>6} {statistics.median(lat):>7.1f} {p95:>7.1f} {lat[-1]:>7.1f}  {shown}")
    print(
        f"target (issue 42): on_changes p50 <= {TARGET['p50']:g} s, p95 <= {TARGET['p95']:g} s; "
        f"baseline (2026-11-28, a row every 2 s): p50 {BASELINE['p50']:g} s, p95 {BASELINE['p95']:g} s"
    )


@contextmanager
def _connect_server(given: str | None) -> Iterator[str]:
    """``given``, or a Spark Connect server of dev/spark_connect.sh with a token (as the tests
    start one), stopped at the end."""
    if given:
        yield given
        return
    import secrets
    import subprocess
    from urllib.parse import quote

    from tests.support.databases import free_port

    token = secrets.token_hex(12)
    with tempfile.TemporaryDirectory(prefix="bench-fresh-connect-") as state:
        env = {
            **os.environ,
            "SPARK_CONNECT_PORT": str(free_port()),
            "SPARK_CONNECT_STATE_DIR": state,
            "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
        }
        script = str(REPO / "dev" / "spark_connect.sh")
        started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, check=True)
        try:
            yield f"{started.stdout.strip().splitlines()[-1]}/;token={quote(token)}"
        finally:
            subprocess.run([script, "stop"], env=env, capture_output=True, check=False)


if __name__ == "__main__":
    raise SystemExit(main())
