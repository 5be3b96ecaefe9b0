"""The changes trigger asks vtgate for reshard journals: a reshard must wake a waiting sync (the
sensor's poke asks too; both are checked against a real reshard in test_reshard.py)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.triggers import VitessChangesTrigger
from airflow_provider_vitess.vgtid import ShardGtid, Vgtid
from airflow_provider_vitess.vstream.request import StreamTarget


def test_the_triggers_stream_requests_journal_events(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "vitess", "host": "127.0.0.1", "port": 1, "extra": {"mysql_port": 2}}
    monkeypatch.setenv("AIRFLOW_CONN_VT", json.dumps(conn))
    start = Vgtid((ShardGtid("customer", "0", "MariaDB/0-1-5"),))
    trigger = VitessChangesTrigger(
        vitess_conn_id="vt", keyspace="customer", tables=["corder"], start_vgtid=start.to_json()
    )
    request = trigger._request(StreamTarget.of(VitessHook("vt").config), start)
    assert request.flags.include_reshard_journal_events
    assert request.flags.heartbeat_interval == 10 and [r.match for r in request.filter.rules] == ["corder"]
