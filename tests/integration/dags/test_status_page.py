"""Acceptance: the sync status page in the Airflow UI, in a real headless Chromium (Debian's),
against a real ``airflow api-server`` with the provider's plugin, after a sync ran a snapshot and
two catch-up windows through ``dag.test()`` (real Vitess, Spark and Delta).

Checks that Airflow's authentication guards the plugin's API and page (no token: 401, a forged
one: 403), that the JSON documents hold the store's values, and that the browser renders them:
table names and keys, snapshot percentages, window states. Screenshots go to ``.artifacts/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from airflow_provider_vitess.checkpoints import CheckpointStore, history
from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.support.airflow_env import CONNECT_MERGE, AirflowEnv, make_airflow_env
from tests.support.airflow_services import AirflowServices, airflow_services
from tests.support.browser import ARTIFACTS, chromium
from tests.support.customer_workload import run_workload
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration

SYNC = "status_page_sync"
TABLES = ("customer", "corder")
ID_BASE = 9_000_000

DAG_FILE = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{sync}",
    keyspace="customer",
    tables=["customer", "corder"],
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,  # every run catches up: window 1 snapshot, then one window a run
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""


def _ok(result: dict[str, Any]) -> None:
    bad = {t: s for t, s in result["tasks"].items() if s != "success"}
    assert result["state"] == "success" and not bad, f"{result['tasks']}\n{result['log'][-5000:]}"


@pytest.fixture(scope="module")
def synced(vitess: LocalVitess, spark_connect: str, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    """An Airflow installation whose sync has committed a snapshot and two catch-up windows."""
    root = tmp_path_factory.mktemp("status")
    env = make_airflow_env(root, vitess, spark_connect=spark_connect)
    env.write_dag(SYNC, DAG_FILE.format(sync=SYNC, lake=root / "lake", merge_kwargs=CONNECT_MERGE))
    name, value = connection_uri_env("vitess_status_test", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_status_test")
        run_workload(hook, 1, id_base=ID_BASE, customers=30, orders=60, rounds=40, tag="status")
        _ok(env.run_dag(SYNC))  # snapshot (window 1) + merge, catch-up (window 2) + merge
        run_workload(hook, 2, id_base=ID_BASE, customers=30, orders=60, rounds=40, tag="status")
        _ok(env.run_dag(SYNC))  # catch-up (window 3) + merge
    return env


@pytest.fixture(scope="module")
def api(synced: AirflowEnv) -> Iterator[AirflowServices]:
    with airflow_services(synced, services=()) as running:  # the api-server is all the page needs
        yield running


def test_the_plugin_api_refuses_requests_without_a_valid_token(api: AirflowServices) -> None:
    for path in ("/vitess/api/syncs", f"/vitess/api/syncs/{SYNC}", "/vitess/", "/vitess/api/openapi.json"):
        anonymous = api.request("GET", path, auth=False)
        assert anonymous.status_code == 401, (path, anonymous.status_code, anonymous.text)
        forged = api.client.get(api.base_url + path, headers={"Authorization": "Bearer not-a-jwt"})
        assert forged.status_code == 403, (path, forged.status_code, forged.text)
        cookie = api.client.get(api.base_url + path, headers={"Cookie": "_token=not-a-jwt"})
        assert cookie.status_code == 403, (path, cookie.status_code, cookie.text)
    assert api.request("GET", "/vitess/api/openapi.json").json()["info"]["title"] == "Vitess sync status"


def test_the_json_api_serves_the_checkpoint_store(api: AirflowServices, synced: AirflowEnv) -> None:
    overview = api.api("GET", "/vitess/api/syncs")
    assert overview["errors"] == {}
    assert [(s["sync_id"], s["store"], s["committed_seq"]) for s in overview["syncs"]] == [
        (SYNC, "default", 3)
    ]

    status = api.api("GET", f"/vitess/api/syncs/{SYNC}", params={"windows": 10})
    store = CheckpointStore(f"sqlite:///{synced.home / 'vitess_sync.db'}")
    assert [(w["seq"], w["kind"], w["state"]) for w in status["windows"]] == [
        (3, "catchup", "COMMITTED"),
        (2, "catchup", "COMMITTED"),
        (1, "snapshot", "COMMITTED"),
    ]
    for window in status["windows"]:
        stored = store.window(SYNC, window["seq"])
        assert window["rows"] == stored.stats["rows"]
        assert window["duration_seconds"] > 0
    assert set(status["windows"][0]["shard_lag"]) == {"customer/-80", "customer/80-"}
    progress = {p.table: p for p in store.progress(SYNC, 1)}
    assert [
        (t["table"], t["key_columns"], t["rows_copied"], t["percent"]) for t in status["table_status"]
    ] == [
        ("customer", ["customer_id"], progress["customer"].rows_copied, 100.0),
        ("corder", ["order_id"], progress["corder"].rows_copied, 100.0),
    ]
    committed, seq = store.committed(SYNC)
    assert committed is not None and status["committed"]["vgtid"] == committed.to_json() and seq == 3
    assert 0 <= status["committed"]["age_seconds"] < 3600
    point = history.checkpoint(store.engine, SYNC)
    assert point is not None and point.as_of is not None
    assert datetime.fromisoformat(status["committed"]["as_of"]) == point.as_of
    assert 0 <= status["committed"]["seconds_behind"] < 3600
    assert status["last_error"] is None and status["lock"] is None
    missing = api.request("GET", "/vitess/api/syncs/no_such_sync")
    assert missing.status_code == 404 and "no_such_sync" in missing.text


def _wait_loaded(browser: WebDriver) -> None:
    WebDriverWait(browser, 30).until(
        lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") in ("true", "error")
    )
    body = browser.find_element(By.TAG_NAME, "body")
    assert body.get_attribute("data-loaded") == "true", body.text


def _rendered(browser: WebDriver) -> dict[str, Any]:
    section = browser.find_element(By.CSS_SELECTOR, f'section[data-sync="{SYNC}"]')
    tables = {}
    for row in section.find_elements(By.CSS_SELECTOR, "table.tables tbody tr"):
        tables[row.get_attribute("data-table")] = (
            row.find_element(By.CSS_SELECTOR, "td.key").text,
            row.find_element(By.CSS_SELECTOR, ".progress-label").text,
        )
    windows = [
        (row.get_attribute("data-seq"), row.find_elements(By.TAG_NAME, "td")[1].text,
         row.find_element(By.CSS_SELECTOR, "[data-state]").text)
        for row in section.find_elements(By.CSS_SELECTOR, "table.windows tbody tr")
    ]  # fmt: skip
    return {"text": section.text, "tables": tables, "windows": windows}


def test_the_page_renders_the_sync_in_the_airflow_ui(api: AirflowServices, synced: AirflowEnv) -> None:
    status = api.api("GET", f"/vitess/api/syncs/{SYNC}")
    copied = {t["table"]: t["rows_copied"] for t in status["table_status"]}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        browser.get(api.base_url + "/vitess/")
        assert "Not authenticated" in browser.find_element(By.TAG_NAME, "body").text

        # Airflow's UI session: the JWT in the ``_token`` cookie, as its login page leaves it.
        browser.add_cookie({"name": "_token", "value": api.token, "path": "/"})
        browser.get(api.base_url + "/vitess/")
        _wait_loaded(browser)
        page = _rendered(browser)
        assert page["tables"] == {
            "customer": ("customer_id", f"{copied['customer']:,} of {copied['customer']:,} (100.0%)"),
            "corder": ("order_id", f"{copied['corder']:,} of {copied['corder']:,} (100.0%)"),
        }, page
        assert page["windows"] == [
            ("3", "catchup", "COMMITTED"),
            ("2", "catchup", "COMMITTED"),
            ("1", "snapshot", "COMMITTED"),
        ], page
        assert "committed window 3" in page["text"] and "keyspace customer" in page["text"], page["text"]
        point = history.checkpoint(
            CheckpointStore(f"sqlite:///{synced.home / 'vitess_sync.db'}").engine, SYNC
        )
        assert point is not None and point.as_of is not None
        assert f"data as of {point.as_of:%Y-%m-%d %H:%M:%S} UTC" in page["text"], page["text"]
        browser.save_screenshot(str(ARTIFACTS / "status-page-standalone.png"))

        # The same page inside Airflow's UI, from the external view's route (Browse -> Vitess syncs).
        browser.get(api.base_url + "/plugin/vitess-syncs")
        frame = WebDriverWait(browser, 60).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, 'iframe[src$="/vitess/"]'))
        )
        browser.switch_to.frame(frame)
        _wait_loaded(browser)
        assert _rendered(browser)["windows"][0] == ("3", "catchup", "COMMITTED")
        browser.switch_to.default_content()
        nav = (
            browser.find_element(By.TAG_NAME, "nav").text if browser.find_elements(By.TAG_NAME, "nav") else ""
        )
        time.sleep(1)  # let the UI finish its own fade-ins before the picture
        browser.save_screenshot(str(ARTIFACTS / "status-page.png"))
    assert (ARTIFACTS / "status-page.png").stat().st_size > 10_000, nav
