"""``make demo``: the example DAG end to end on this machine.

Starts nothing itself except Airflow commands: ``make demo`` has already installed the venv and
started the local Vitess. Then: load a small sample dataset through vtgate, run the example
DAG ``vitess_customer_sync`` through Airflow (first run: snapshot), write a workload, run it
again (incremental catch-up + merge), and print the Delta tables' row counts next to the
source's, with the sync's windows, progress and lag from the checkpoint store.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy

REPO = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("VITESS_DEMO_DIR", REPO / ".demo"))
DAG_ID = "vitess_customer_sync"
SYNC = DAG_ID
KEYSPACE, TABLES = "customer", ("customer", "corder")
IVY = Path.home() / ".cache" / "airflow-provider-vitess" / "ivy"


def cluster_env() -> dict[str, str]:
    out = subprocess.run(
        [str(REPO / "dev" / "local_vitess.sh"), "env"], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def airflow_env(cluster: dict[str, str]) -> dict[str, str]:
    password = Path(cluster["VITESS_PASSWORD_FILE"]).read_text().strip()
    vitess = {
        "conn_type": "vitess",
        "host": cluster["VITESS_HOST"],
        "port": int(cluster["VITESS_GRPC_PORT"]),
        "login": cluster["VITESS_USER"],
        "password": password,
        "extra": {"mysql_port": int(cluster["VITESS_MYSQL_PORT"])},
    }
    bin_dir = Path(sys.executable).parent
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(DEMO / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_VITESS_DEFAULT": json.dumps(vitess),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "VITESS_LAKE": str(DEMO / "lake"),
        # The first run's sensor finds nothing (the workload comes after it): 5 s, not a minute.
        "VITESS_CHANGE_WAIT": "5",
        "VITESS_SPARK_IVY": str(IVY),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


_STEP_BEGAN: list[float] = []  # when the step under way began (empty: none is)


def step(title: str | None) -> None:
    """End the step under way with its time, then begin ``title`` (None: the last step ended)."""
    if _STEP_BEGAN:
        print(f"    ({time.monotonic() - _STEP_BEGAN.pop():.0f} s)", flush=True)
    if title is not None:
        print(f"\n==> {title}", flush=True)
        _STEP_BEGAN.append(time.monotonic())


def load_sample(engine: sqlalchemy.Engine, seed: int = 7) -> None:
    """1,000 customers and 3,000 orders across both shards (replacing earlier demo rows)."""
    rng = random.Random(seed)
    with engine.begin() as conn:
        for table, key in (("corder", "order_id"), ("customer", "customer_id")):
            # vttablet refuses DML over 10,000 rows: the demo's ranges stay below it.
            conn.execute(
                sqlalchemy.text(f"DELETE FROM customer.{table} WHERE {key} BETWEEN 500000 AND 509999")
            )
        conn.execute(
            sqlalchemy.text("INSERT INTO customer.customer (customer_id, email) VALUES (:c, :e)"),
            [{"c": 500000 + i, "e": f"user{i}@example.com"} for i in range(1000)],
        )
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO customer.corder (order_id, customer_id, sku, price) VALUES (:o, :c, :s, :p)"
            ),
            [
                {
                    "o": 500000 + i,
                    "c": 500000 + rng.randrange(1000),
                    "s": f"SKU-{i % 50}".encode(),
                    "p": rng.randint(1, 500),
                }
                for i in range(3000)
            ],
        )


INSERT_ORDER = sqlalchemy.text(
    "INSERT INTO customer.corder (order_id, customer_id, sku, price) VALUES (:o, :c, :s, :p)"
)


def workload(engine: sqlalchemy.Engine, seed: int = 8) -> dict[str, int]:
    """Updates, deletes, inserts and moves between shards: what the incremental run must carry."""
    rng = random.Random(seed)
    counts = {"inserted": 0, "updated": 0, "deleted": 0, "moved": 0}
    with engine.begin() as conn:
        for i in range(200):
            oid = 500000 + rng.randrange(3000)
            roll = rng.random()
            if roll < 0.4:
                conn.execute(
                    sqlalchemy.text("UPDATE customer.corder SET price = price + 1 WHERE order_id = :o"),
                    {"o": oid},
                )
                counts["updated"] += 1
            elif roll < 0.6:
                conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid})
                counts["deleted"] += 1
            elif roll < 0.8:  # vtgate moves a row to another shard as DELETE + INSERT
                conn.execute(sqlalchemy.text("DELETE FROM customer.corder WHERE order_id = :o"), {"o": oid})
                conn.execute(
                    INSERT_ORDER, {"o": oid, "c": 500000 + rng.randrange(1000), "s": b"MOVED", "p": 1}
                )
                counts["moved"] += 1
            else:
                conn.execute(
                    INSERT_ORDER, {"o": 505000 + i, "c": 500000 + rng.randrange(1000), "s": b"NEW", "p": 9}
                )
                counts["inserted"] += 1
    return counts


def run_dag(env: dict[str, str], label: str) -> None:
    log = DEMO / f"{label}.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), "dags", "test", DAG_ID],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=DEMO,
            check=False,
        )
    print(f"    {label}: exit {proc.returncode} in {time.monotonic() - started:.0f} s (log: {log})")
    airflow_db = sqlalchemy.create_engine(f"sqlite:///{DEMO / 'airflow' / 'airflow.db'}")
    with airflow_db.connect() as conn:
        run_id = conn.execute(
            sqlalchemy.text("SELECT run_id FROM dag_run WHERE dag_id = :d ORDER BY id DESC LIMIT 1"),
            {"d": DAG_ID},
        ).scalar_one()
        tasks = conn.execute(
            sqlalchemy.text(
                "SELECT task_id, state, duration FROM task_instance WHERE dag_id = :d AND run_id = :r "
                "ORDER BY start_date"
            ),
            {"d": DAG_ID, "r": run_id},
        ).all()
    airflow_db.dispose()
    for task_id, state, duration in tasks:
        print(f"      {task_id:<17} {state:<8} {duration or 0:6.1f} s")
    if proc.returncode != 0 or any(state == "failed" for _, state, _ in tasks):
        sys.exit(f"the {label} DAG run failed; see {log}")


def summary(engine: sqlalchemy.Engine, env: dict[str, str]) -> None:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.checkpoints import CheckpointStore
    from airflow_provider_vitess.merge.spark_conf import spark_conf

    builder = SparkSession.builder.master("local[2]").appName("vitess-demo")
    for key, value in {**spark_conf(local=True), "spark.jars.ivy": str(IVY)}.items():
        builder = builder.config(key, value)
    # The JVM inherits stdout/stderr when it starts: give it a log file instead of the terminal
    # (Ivy's resolution report and Spark's warnings would bury the result).
    sys.stdout.flush()
    saved = os.dup(1), os.dup(2)
    with (DEMO / "spark-summary.log").open("w") as jvm_log:
        os.dup2(jvm_log.fileno(), 1)
        os.dup2(jvm_log.fileno(), 2)
        try:
            spark = builder.getOrCreate()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    spark.sparkContext.setLogLevel("ERROR")
    print(f"\n{'table':<10} {'source rows':>12} {'delta rows':>12}  equal")
    for table in TABLES:
        with engine.connect() as conn:
            source = conn.execute(sqlalchemy.text(f"SELECT count(*) FROM customer.{table}")).scalar_one()
        delta = spark.read.format("delta").load(str(DEMO / "lake" / "delta" / "customer" / table)).count()
        print(f"{table:<10} {source:>12,} {delta:>12,}  {'yes' if source == delta else 'NO'}")
    store = CheckpointStore(f"sqlite:///{DEMO / 'airflow' / 'vitess_sync.db'}")
    vgtid, seq = store.committed(SYNC)
    print(f"\ncommitted window {seq}; position {vgtid.to_json() if vgtid else None}")
    for n in range(1, seq + 1):
        w = store.window(SYNC, n)
        lag = w.stats.get("shard_lag_transactions", {})
        rows = w.stats.get("rows", 0)
        print(f"window {n}: {w.kind.value:<8} {w.state.value:<9} rows {rows:>6,}  lag {lag or '-'}")
        for p in store.progress(SYNC, n) if w.kind.value == "snapshot" else ():
            pct = "" if p.percent is None else f" ({p.percent:.0f}%)"
            copied, known = p.rows_copied or 0, p.rows_known or 0
            print(f"    {p.table:<10} copied {copied:>6,} of {known:>6,}{pct}  key {p.key_columns}")
    spark.stop()


def asset_events(airflow_db_path: Path) -> None:
    """The asset events the merges emitted (one per Delta table a window changed)."""
    airflow_db = sqlalchemy.create_engine(f"sqlite:///{airflow_db_path}")
    with airflow_db.connect() as conn:
        rows = conn.execute(
            sqlalchemy.text(
                "SELECT a.uri, e.source_task_id, e.extra FROM asset_event e "
                "JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
            )
        ).all()
    airflow_db.dispose()
    for uri, task_id, extra in rows:
        x = json.loads(extra)
        counts = f"+{x.get('rows_inserted')} ~{x.get('rows_updated')} -{x.get('rows_deleted')}"
        print(f"{uri}  <- {task_id}: window {x.get('window_seq')} {x.get('kind')}  rows {counts}")
    if not rows:
        print("no asset events")


def main() -> None:
    started = time.monotonic()
    shutil.rmtree(DEMO, ignore_errors=True)
    (DEMO / "airflow").mkdir(parents=True)
    IVY.mkdir(parents=True, exist_ok=True)
    cluster = cluster_env()
    env = airflow_env(cluster)
    os.environ.update({"AIRFLOW_CONN_VITESS_DEFAULT": env["AIRFLOW_CONN_VITESS_DEFAULT"]})
    from airflow_provider_vitess.hooks.vitess import VitessHook

    engine = VitessHook("vitess_default").engine
    step("loading the sample dataset through vtgate (customer keyspace, shards -80 and 80-)")
    load_sample(engine)
    step("airflow db migrate")
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        check=True,
        capture_output=True,
    )
    step(f"first run of {DAG_ID}: snapshot + merge into Delta")
    run_dag(env, "run1-snapshot")
    step("workload through vtgate")
    print(f"    {workload(engine)}")
    step(f"second run of {DAG_ID}: wait for changes, catch up one window, merge")
    run_dag(env, "run2-incremental")
    step("result")
    summary(engine, env)
    step("asset events (a DAG scheduled on a table's Asset runs after each)")
    asset_events(DEMO / "airflow" / "airflow.db")
    step(None)
    print(f"\n==> dev/demo.py done in {time.monotonic() - started:.0f} s (not counting the build before it)")
    print("\n==> the sync's status page in the Airflow UI")
    home = DEMO / "airflow"
    print(
        f"    AIRFLOW_HOME={home} {Path(sys.executable).parent / 'airflow'} api-server --port 8080\n"
        "    then open http://localhost:8080/plugin/vitess-syncs (Browse -> Vitess syncs); its JSON:\n"
        "    http://localhost:8080/vitess/api/syncs"
    )


if __name__ == "__main__":
    main()
