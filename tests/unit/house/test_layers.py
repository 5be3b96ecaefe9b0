"""The layers below the Airflow edge import no Airflow module (they run, and test, without it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "airflow_provider_vitess.capture.runner",
        "airflow_provider_vitess.vstream.window",
        "airflow_provider_vitess.vstream.changes",
        "airflow_provider_vitess.vstream.position",
        "airflow_provider_vitess.decoding.copyrows",
        "airflow_provider_vitess.decoding.events",
    ],
)
def test_a_lower_layer_imports_no_airflow_module(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{module} pulls in {out.strip()}"


def test_loading_the_sensor_imports_no_capture_or_staging_code() -> None:
    """The DAG processor and the triggerer load the sensor for every DAG that has one: it needs
    the stream and the store, not the capture runner, the stager or pyarrow."""
    code = (
        "import json, sys, airflow_provider_vitess.sensors.changes; "
        "print('LOADED ' + json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow' "
        "or m.startswith(('airflow_provider_vitess.capture', 'airflow_provider_vitess.staging')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # Airflow 3.2 logs to stdout as the import sets up its logging (alembic's plugin lines).
    [loaded] = [line for line in out.splitlines() if line.startswith("LOADED ")]
    assert json.loads(loaded.removeprefix("LOADED ")) == []
