"""Which executors run a sync's tasks on one host, which locations are a host's own disk, and
what the refusal names (``airflow_provider_vitess.single_host``)."""

from __future__ import annotations

import pytest

from airflow_provider_vitess.exceptions import SingleHostSettingsError, is_permanent
from airflow_provider_vitess.single_host import (
    executor_class,
    is_local_path,
    refuse_single_host_settings,
    runs_on_one_host,
)

SQLITE = "sqlite:////home/airflow/vitess_sync.db"
POSTGRES = "postgresql+psycopg2://u:secret@db/store"


@pytest.mark.parametrize(
    ("executor", "one_host"),
    [
        ("LocalExecutor", True),
        ("airflow.executors.local_executor.LocalExecutor", True),
        ("SequentialExecutor", True),
        ("CeleryExecutor", False),
        ("airflow.providers.celery.executors.celery_executor.CeleryExecutor", False),
        ("KubernetesExecutor", False),
        ("edge:airflow.providers.edge3.executors.EdgeExecutor", False),
        ("mine:my.module.LocalExecutor", True),
    ],
)
def test_executors(executor: str, one_host: bool) -> None:
    assert runs_on_one_host(executor) is one_host


def test_executor_class() -> None:
    assert executor_class(" alias:pkg.mod.CeleryExecutor ") == "CeleryExecutor"


@pytest.mark.parametrize(
    ("location", "local"),
    [
        ("/data/lake", True),
        ("relative/lake", True),
        ("file:///data/lake", True),
        ("C:\\lake", True),
        ("s3://bucket/lake", False),
        ("s3a://bucket/lake", False),
        ("gs://bucket/lake", False),
        ("abfss://c@acct.dfs.core.windows.net/lake", False),
        ("hdfs://nn/lake", False),
    ],
)
def test_local_paths(location: str, local: bool) -> None:
    assert is_local_path(location) is local


def test_one_host_executors_accept_every_setting() -> None:
    refuse_single_host_settings(
        task="t", executor="LocalExecutor", store_url=SQLITE, locations=[("staging_location", "/x")]
    )


def test_a_fleet_refuses_each_single_host_setting_by_name_and_the_message_keeps_no_secret() -> None:
    with pytest.raises(SingleHostSettingsError) as refused:
        refuse_single_host_settings(
            task="snapshot",
            executor="CeleryExecutor",
            store_url=SQLITE,
            locations=[("staging_location", "/data/staging"), ("target_location", "s3://b/delta")],
        )
    text = str(refused.value)
    assert text.startswith("task 'snapshot' runs under CeleryExecutor")
    assert "checkpoint store is a SQLite file" in text and "checkpoint_conn_id" in text
    assert "staging_location '/data/staging' is a path on the worker's disk" in text
    assert "target_location" not in text  # an object store URL is fine
    assert "[vitess] shared_filesystem = True" in text
    assert is_permanent(refused.value)


def test_a_shared_filesystem_allows_paths_but_never_a_sqlite_store() -> None:
    refuse_single_host_settings(
        task="t",
        executor="CeleryExecutor",
        store_url=POSTGRES,
        locations=[("staging_location", "/nfs/staging")],
        shared_filesystem=True,
    )
    with pytest.raises(SingleHostSettingsError, match="SQLite") as refused:
        refuse_single_host_settings(
            task="t", executor="CeleryExecutor", store_url=SQLITE, locations=[], shared_filesystem=True
        )
    assert "is a path on the worker's disk" not in str(refused.value)


def test_a_store_on_a_database_server_and_object_storage_pass_on_a_fleet() -> None:
    refuse_single_host_settings(
        task="t",
        executor="KubernetesExecutor",
        store_url=POSTGRES,
        locations=[("staging_location", "s3://b/staging"), ("target_location", "s3://b/delta")],
    )
