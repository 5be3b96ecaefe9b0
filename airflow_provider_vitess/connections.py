"""Settings read from the Airflow connections other than ``vitess``: the checkpoint store's
SQLAlchemy URL, the object store's S3 settings, an Iceberg sync's JDBC catalog (and the check
that they hold wherever the executor runs a task: :func:`refuse_single_host`). Credentials stay in
the connections: they are read at run time, never put in an operator field or a log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.database import default_url
from airflow_provider_vitess.checkpoints.urls import url_from_connection
from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
from airflow_provider_vitess.object_storage import Credentials, S3Settings, hook_extras
from airflow_provider_vitess.single_host import refuse_single_host_settings, runs_on_one_host
from airflow_provider_vitess.utils.task import airflow_conf, executor_of


def store_url(checkpoint_conn_id: str | None) -> str:
    """The store's SQLAlchemy URL: from an Airflow connection (credentials stay there), else
    the default SQLite file under ``AIRFLOW_HOME``."""
    if not checkpoint_conn_id:
        return default_url()
    from airflow.sdk.bases.hook import BaseHook

    return url_from_connection(BaseHook.get_connection(checkpoint_conn_id))


def refuse_single_host(
    context: Mapping[str, Any], checkpoint_conn_id: str | None, locations: Sequence[tuple[str, str]] = ()
) -> None:
    """A task's first step: its store and ``locations`` (``(setting, location)`` pairs) must
    hold wherever its executor may run it (:mod:`airflow_provider_vitess.single_host`). Under a
    single-host executor nothing is looked up: the task reads its store's connection once, later."""
    executor = executor_of(context)
    if runs_on_one_host(executor):
        return
    ti = context.get("ti") or context.get("task_instance")
    refuse_single_host_settings(
        task=str(getattr(ti, "task_id", "?")),
        executor=executor,
        store_url=store_url(checkpoint_conn_id),
        locations=locations,
        shared_filesystem=airflow_conf().getboolean("vitess", "shared_filesystem", fallback=False),
    )


def s3_settings(aws_conn_id: str | None) -> S3Settings | None:
    """Object-storage settings from the Airflow ``aws`` connection, if one is named."""
    if not aws_conn_id:
        return None
    from airflow.sdk.bases.hook import BaseHook

    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson
    return S3Settings.from_connection(
        conn_id=aws_conn_id,
        conn_type=conn.conn_type,
        login=conn.login,
        password=conn.password,
        extra=extra,
        resolved=_hook_credentials(aws_conn_id) if hook_extras(extra) else None,
    )


def iceberg_catalog(conn_id: str | None) -> IcebergCatalog | None:
    """The Iceberg JDBC catalog the Airflow connection ``conn_id`` names, if one is named."""
    if not conn_id:
        return None
    from airflow.sdk.bases.hook import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return IcebergCatalog.from_connection(
        conn_id=conn_id,
        conn_type=conn.conn_type,
        host=conn.host,
        port=conn.port,
        schema=conn.schema,
        login=conn.login,
        password=conn.password,
        extra=conn.extra_dejson,
    )


def _hook_credentials(aws_conn_id: str) -> Credentials | None:
    """The keys the Amazon provider's hook resolves for the connection (an assumed role, a
    profile, a web identity), frozen at the task's start: temporary ones must outlive the task.
    None when the provider is not installed (the settings then refuse the extras, naming it).
    The hook is the provider's own, so a connection behaves as in its operators."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        return None
    # get_credentials masks the secret key and the session token it resolves in the task's logs.
    frozen = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3").get_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


def open_store(checkpoint_conn_id: str | None) -> CheckpointStore:
    store = CheckpointStore(store_url(checkpoint_conn_id))
    store.migrate()
    return store


def hash_salt(hash_salt_conn_id: str | None) -> str:
    """The salt of ``hash_columns``: the password of the named Airflow connection, read at run
    time (Airflow masks a connection's password in task logs once it is read)."""
    from airflow_provider_vitess.exceptions import ColumnChoiceError

    if not hash_salt_conn_id:
        raise ColumnChoiceError(
            "hash_columns are given but no hash_salt_conn_id: name an Airflow connection whose "
            "password is the salt (a long random secret), e.g. hash_salt_conn_id='vitess_hash_salt'"
        )
    from airflow.sdk.bases.hook import BaseHook

    salt = BaseHook.get_connection(hash_salt_conn_id).password
    if not salt:
        raise ColumnChoiceError(
            f"connection {hash_salt_conn_id!r} (hash_salt_conn_id) has no password: set it to the "
            "salt of hash_columns (a long random secret)"
        )
    return str(salt)
