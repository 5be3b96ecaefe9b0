"""Fixtures of the sensor room: the watched tables of ``tests/support/changes_sensor.py`` (created
once per module, kept) and the Airflow connection to them (a module that defines its own ``hook``,
as ``test_busy_shard`` does, uses its own)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.changes_sensor import CONN_ID, OTHER, WATCHED
from tests.support.local import LocalVitess, connection_uri_env


@pytest.fixture(scope="module")
def conn_env(vitess: LocalVitess) -> Iterator[tuple[str, str]]:
    name, value = connection_uri_env(CONN_ID, vitess)
    old = os.environ.get(name)
    os.environ[name] = value
    yield name, value
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture(scope="module")
def hook(conn_env: tuple[str, str]) -> Iterator[VitessHook]:
    """The tables exist (created once, kept: their vschema entries outlive a DROP anyway)."""
    hook = VitessHook(CONN_ID)
    body = "(id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(64))"
    with hook.connect_sql() as conn:
        conn.execute(sqlalchemy.text(f"CREATE TABLE IF NOT EXISTS commerce.{OTHER} {body}"))
        for table in (WATCHED, OTHER):
            conn.execute(sqlalchemy.text(f"CREATE TABLE IF NOT EXISTS customer.{table} {body}"))
            try:
                conn.execute(sqlalchemy.text(f"SHOW VSCHEMA VINDEXES ON customer.{table}"))
            except sqlalchemy.exc.DBAPIError:  # not in the vschema yet
                conn.execute(
                    sqlalchemy.text(f"ALTER VSCHEMA ON customer.{table} ADD VINDEX hash(id) USING hash")
                )
    yield hook
    hook.close()
