"""Airflow itself sees the provider: ``airflow providers list`` and the connection form metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.airflow_env import AirflowEnv, make_airflow_env
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow(vitess: LocalVitess, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    return make_airflow_env(tmp_path_factory.mktemp("af-meta"), vitess)


def test_airflow_providers_list_shows_the_provider(airflow: AirflowEnv) -> None:
    listed = json.loads(airflow.airflow("providers", "list", "-o", "json").stdout)
    ours = [p for p in listed if p["package_name"] == "airflow-provider-vitess"]
    assert len(ours) == 1, [p["package_name"] for p in listed]
    assert ours[0]["version"] == "0.1.0"


def test_the_connection_type_and_its_form_fields_are_registered(airflow: AirflowEnv, tmp_path: Path) -> None:
    script = tmp_path / "fields.py"
    script.write_text(
        "import json\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "pm = ProvidersManager()\n"
        "hook = pm.hooks['vitess']\n"
        "widgets = sorted(k for k in pm.connection_form_widgets if k.startswith('extra__vitess__'))\n"
        "behaviour = pm.field_behaviours.get('vitess', {})\n"
        "print(json.dumps({'hook': hook.hook_class_name if hook else None, 'widgets': widgets,\n"
        "                  'behaviour': behaviour}))\n"
    )
    proc = airflow.python(str(script))
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["hook"] == "airflow_provider_vitess.hooks.vitess.VitessHook"
    # The gRPC port is the connection's own port field, relabelled; the rest are extras.
    assert info["behaviour"]["relabeling"]["port"] == "vtgate gRPC port"
    for field in ("mysql_port", "tablet_type", "cells", "tls_ca", "tls_cert", "tls_key", "timeout_seconds"):
        assert f"extra__vitess__{field}" in info["widgets"], info["widgets"]
    assert "schema" in info["behaviour"]["hidden_fields"]
    assert info["behaviour"]["relabeling"]["host"] == "vtgate host"


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_airflow_plugins_lists_the_status_plugin_once(airflow: AirflowEnv, lazy: str, tmp_path: Path) -> None:
    """Registered once whether Airflow discovers providers lazily (its default: only the entry
    point counts) or eagerly (the provider info's ``plugins`` counts, the entry point stands back)."""
    env = AirflowEnv(airflow.home, {**airflow.env, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy})
    out = env.airflow("plugins", "-o", "json").stdout
    listed = json.loads(out[out.index("[") :])
    ours = [p for p in listed if p["name"] == "vitess_status"]
    assert len(ours) == 1, [p["name"] for p in listed]
    assert "'url_prefix': '/vitess'" in str(ours[0]["fastapi_apps"]), ours[0]
    assert "'url_route': 'vitess-syncs'" in str(ours[0]["external_views"]), ours[0]
    script = tmp_path / "plugin_errors.py"
    script.write_text(
        "import json\nfrom airflow import plugins_manager\n"
        "print(json.dumps(plugins_manager._get_plugins()[1]))\n"
    )
    # Without the checkout on PYTHONPATH: its *.egg-info (from the editable install) would list the
    # entry point a second time, which no installed package does.
    installed = AirflowEnv(env.home, {k: v for k, v in env.env.items() if k != "PYTHONPATH"})
    errors = json.loads(installed.python(str(script)).stdout.strip().splitlines()[-1])
    # Other providers' own plugins may report theirs (the OpenLineage provider registers its
    # plugin twice under eager discovery); ours must not be among them.
    ours_failed = {name: e for name, e in errors.items() if "vitess" in f"{name} {e}".lower()}
    assert ours_failed == {}, errors
