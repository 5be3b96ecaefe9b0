"""The README's object-storage DAG, verbatim, through Airflow (``dag.test()``): staging and Delta
both on the local S3 server (``dev/local_s3.sh``: VersityGW), credentials and endpoint from an
Airflow ``aws`` connection. One DAG run snapshots, merges, sees the workload written meanwhile,
catches up and merges again; the Delta tables then equal ``SELECT *`` through vtgate, every
object is in the bucket (nothing on a local path), and the secret key appears in no task log and
no rendered field. Real Vitess, Spark (``s3a://``), Delta, S3 server and Airflow."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.connections import s3_settings
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.object_storage import S3Settings
from airflow_provider_vitess.staging.files import open_location
from tests.support.airflow_env import IVY_CACHE, AirflowEnv, make_airflow_env
from tests.support.customer_workload import run_workload
from tests.support.delta_check import assert_delta_equals_source
from tests.support.local import REPO, LocalS3, LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

SYNC = "vitess_customer_sync"  # the README's DAG id (the sync id defaults to it)
TABLES = ("customer", "corder")
BUCKET = "lake"
ID_BASE = 7_000_000


def readme_dag() -> str:
    """The README's object-storage example: the first Python block under "Using it in a DAG"."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Using it in a DAG", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md has no Python example under 'Using it in a DAG'"
    return match.group(1)


@pytest.fixture(scope="module")
def settings(s3: LocalS3) -> S3Settings:
    return S3Settings(
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
        endpoint_url=s3.endpoint_url,
        region=s3.region,
        path_style=True,
    )


@pytest.fixture(scope="module")
def airflow(
    vitess: LocalVitess, s3: LocalS3, settings: S3Settings, tmp_path_factory: pytest.TempPathFactory
) -> AirflowEnv:
    assert BUCKET in s3.buckets
    # A server left running by an earlier session may hold this sync's objects: start clean.
    fs, _ = open_location(f"s3a://{BUCKET}", settings.storage_options())
    for prefix in (f"{BUCKET}/staging/{SYNC}", f"{BUCKET}/delta/customer"):
        if fs.exists(prefix):
            fs.rm(prefix, recursive=True)
    env = make_airflow_env(tmp_path_factory.mktemp("af-s3"), vitess)
    name, value = s3.connection_env("lake_s3")
    env.env[name] = value
    # The README's DAG names no Ivy cache: spark-submit takes the tests' one from spark-defaults.
    conf_dir = env.home / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"spark.jars.ivy {IVY_CACHE}\n")
    env.env["SPARK_CONF_DIR"] = str(conf_dir)
    env.write_dag("vitess_s3_sync", readme_dag())
    return env


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_s3_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield VitessHook("vitess_s3_test")


def _workload_after_first_commit(airflow: AirflowEnv, hook: VitessHook, done: threading.Event) -> None:
    """Writes to the source once the snapshot is merged, while the run's sensor waits."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            committed = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}").committed(SYNC)[1]
        except Exception:  # the run has not created its store yet
            committed = 0
        if committed >= 1:
            run_workload(hook, 2, id_base=ID_BASE, customers=40, orders=80, rounds=60, tag="s3")
            done.set()
            return
        time.sleep(1)


def _task_logs(airflow: AirflowEnv, result: dict[str, Any]) -> str:
    """What the run printed (dag.test logs every task to its console) and any task log files."""
    logs = [result["log"]]
    for path in sorted((airflow.home / "logs").rglob("*")):
        if path.is_file():
            logs.append(path.read_text(errors="replace"))
    return "\n".join(logs)


def _around(text: str, secret: str) -> list[str]:
    """Where ``secret`` occurs in ``text``: some context each side, the secret itself masked."""
    found = [m.start() for m in re.finditer(re.escape(secret), text)]
    return [text[max(0, i - 300) : i + len(secret) + 100].replace(secret, "<SECRET>") for i in found[:5]]


def _local_copies(*roots: Path) -> list[str]:
    """Staged windows or Delta logs on a local disk under ``roots`` (there should be none)."""
    found = []
    for root in roots:
        for dirpath, dirnames, _ in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".venv", ".git", "node_modules")]
            found += [
                os.path.join(dirpath, d) for d in dirnames if d == "_delta_log" or d.startswith("window=")
            ]
    return found


def test_the_readme_dag_syncs_through_s3_with_the_connections_credentials(
    airflow: AirflowEnv, hook: VitessHook, s3: LocalS3, settings: S3Settings
) -> None:
    # What the checkout already holds (a `make demo`'s `.demo/lake`, a developer's runs) is not
    # this test's: only folders the run adds count.
    local_before = set(_local_copies(airflow.home, REPO))
    run_workload(hook, 1, id_base=ID_BASE, customers=40, orders=80, rounds=60, tag="s3")  # for the snapshot
    wrote = threading.Event()
    writer = threading.Thread(target=_workload_after_first_commit, args=(airflow, hook, wrote), daemon=True)
    writer.start()
    result = airflow.run_dag(SYNC)
    writer.join(timeout=5)
    assert wrote.is_set(), "the workload never ran: the snapshot was not committed"
    states = result["tasks"]
    assert all(states[t] == "success" for t in states), f"{states}\n{result['log'][-6000:]}"
    assert set(states) == {"snapshot", "merge_snapshot", "wait_for_changes", "catch_up", "merge"}

    store = CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")
    _, seq = store.committed(SYNC)
    assert seq == 2 and store.window(SYNC, 2).kind.value == "catchup"
    assert (
        store.window(SYNC, 2).manifest_path
        == f"s3a://{BUCKET}/staging/{SYNC}/window=0000000002/_manifest.json"
    )

    # The oracle: each Delta table, read back from the bucket, equals SELECT * through vtgate.
    fs, _ = open_location(f"s3a://{BUCKET}", settings.storage_options())
    with tempfile.TemporaryDirectory(prefix="s3-delta-") as copy:
        fs.get(f"{BUCKET}/delta/customer", copy, recursive=True)
        assert_delta_equals_source(hook, "customer", TABLES, Path(copy) / "customer")

    # The objects are in the bucket, served by the S3 server (its posix backend holds them).
    objects = fs.find(f"{BUCKET}/")
    staged = sorted(o for o in objects if o.startswith(f"{BUCKET}/staging/"))
    assert f"{BUCKET}/staging/{SYNC}/window=0000000002/_manifest.json" in staged, staged
    # Retention reached the bucket with the connection's credentials: the snapshot's staged copy
    # goes once a later window is committed (it used to stay: the merge's retention had no keys).
    assert not [o for o in staged if f"/{SYNC}/window=0000000001/" in o], staged
    for table in TABLES:
        log = [o for o in objects if o.startswith(f"{BUCKET}/delta/customer/{table}/_delta_log/")]
        assert len([o for o in log if o.endswith(".json")]) >= 2, log  # the snapshot and the catch-up
        data = [
            o for o in objects if o.startswith(f"{BUCKET}/delta/customer/{table}/") and o.endswith(".parquet")
        ]
        assert data, f"{table}: no data files in the bucket"
        assert (s3.data_dir / data[0]).is_file()
    assert any(o.endswith(".parquet") and "/staging/" in o for o in objects)
    added = sorted(set(_local_copies(airflow.home, REPO)) - local_before)
    assert not added, f"staged windows or Delta logs on a local disk: {added}"

    # The secret key is in no log line and no rendered template field.
    logs = _task_logs(airflow, result)
    assert "Spark-Submit cmd" in logs and "staged catch-up window(s) 2:" in logs  # the logs are the real ones
    secret = s3.secret_access_key
    assert secret not in logs, f"the secret key is in the logs: {_around(logs, secret)}"
    db = sqlite3.connect(airflow.home / "airflow.db")
    try:
        rendered = db.execute("SELECT task_id, rendered_fields FROM rendered_task_instance_fields").fetchall()
    finally:
        db.close()
    assert {task for task, _ in rendered} >= {"merge", "catch_up"}, rendered
    assert not [task for task, fields in rendered if secret in str(fields)]


def test_a_profile_connection_reaches_the_bucket_through_the_amazon_providers_hook(
    s3: LocalS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``aws`` connection naming a profile, no keys of its own: the Amazon provider's hook
    resolves the profile's keys and staging's s3fs reaches the bucket with them; a profile with
    a wrong secret is refused by the server (the resolved keys are the ones used). The merge job's
    S3A takes the same settings, through the environment the README test checks."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[lake]\naws_access_key_id = {s3.access_key_id}\naws_secret_access_key = {s3.secret_access_key}\n"
        f"[wrong]\naws_access_key_id = {s3.access_key_id}\naws_secret_access_key = not-the-secret\n"
    )
    (tmp_path / "config").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for profile in ("lake", "wrong"):
        extra = {"profile_name": profile, "endpoint_url": s3.endpoint_url, "region_name": s3.region}
        monkeypatch.setenv(
            f"AIRFLOW_CONN_PROFILE_{profile.upper()}", json.dumps({"conn_type": "aws", "extra": extra})
        )
    settings = s3_settings("profile_lake")
    assert settings is not None
    assert (settings.access_key_id, settings.secret_access_key) == (s3.access_key_id, s3.secret_access_key)
    key = f"{BUCKET}/profile-check/{uuid.uuid4().hex}.txt"
    fs, _ = open_location(f"s3a://{BUCKET}", settings.storage_options())
    fs.pipe(key, b"resolved by the hook")
    assert (s3.data_dir / key).read_bytes() == b"resolved by the hook"  # the server's posix backend
    fs.rm(key)
    wrong = s3_settings("profile_wrong")
    assert wrong is not None
    wrong_fs, _ = open_location(f"s3a://{BUCKET}", wrong.storage_options())
    with pytest.raises(PermissionError):
        wrong_fs.pipe(key, b"refused")
    assert not (s3.data_dir / key).exists()
