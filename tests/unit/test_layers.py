"""The layers below the Airflow edge import no Airflow module (they run, and test, without it)."""

from __future__ import annotations

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
