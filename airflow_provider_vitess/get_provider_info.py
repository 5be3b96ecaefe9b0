"""Provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_vitess import __version__
from airflow_provider_vitess.hooks.connection_config import UI_FIELD_BEHAVIOUR, declared_conn_fields


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-vitess",
        "name": "Vitess",
        "description": "Change data capture from Vitess (vtgate VStream) into lakehouse tables.",
        "versions": [__version__],
        "hooks": [{"integration-name": "Vitess", "python-modules": ["airflow_provider_vitess.hooks.vitess"]}],
        "connection-types": [
            {
                "connection-type": "vitess",
                "hook-class-name": "airflow_provider_vitess.hooks.vitess.VitessHook",
                "hook-name": "Vitess",
                "conn-fields": declared_conn_fields(),
                "ui-field-behaviour": {k.replace("_", "-"): v for k, v in UI_FIELD_BEHAVIOUR.items()},
            }
        ],
    }
