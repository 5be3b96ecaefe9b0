"""Provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_vitess import __version__
from airflow_provider_vitess.hooks.connection_config import UI_FIELD_BEHAVIOUR, declared_conn_fields

# vitess:// asset URIs: their check, factory and OpenLineage dataset.
_URIS = "airflow_provider_vitess.lineage.uris"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-vitess",
        "name": "Vitess",
        "description": "Change data capture from Vitess (vtgate VStream) into lakehouse tables.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Vitess",
                "external-doc-url": "https://vitess.io/docs/reference/vreplication/vstream/",
                "tags": ["software"],
            }
        ],
        "hooks": [{"integration-name": "Vitess", "python-modules": ["airflow_provider_vitess.hooks.vitess"]}],
        "operators": [
            {
                "integration-name": "Vitess",
                "python-modules": [
                    "airflow_provider_vitess.operators.capture",
                    "airflow_provider_vitess.operators.merge",
                    "airflow_provider_vitess.operators.follow",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "Vitess", "python-modules": ["airflow_provider_vitess.sensors.changes"]}
        ],
        "triggers": [
            {"integration-name": "Vitess", "python-modules": ["airflow_provider_vitess.triggers.changes"]}
        ],
        "extra-links": [
            "airflow_provider_vitess.plugins.links.VitessSyncStatusLink",
            "airflow_provider_vitess.plugins.links.DeltaTableLink",
            "airflow_provider_vitess.plugins.links.SparkUILink",
        ],
        "plugins": [
            {
                "name": "vitess_status",
                "plugin-class": "airflow_provider_vitess.plugins.status.VitessStatusPlugin",
            }
        ],
        "config": {
            "vitess": {
                "description": "The Vitess provider's settings.",
                "options": {
                    "status_checkpoint_conn_ids": {
                        "description": "Checkpoint stores the status page (Browse -> Vitess syncs) reads: "
                        "comma-separated connection ids, as given to the operators' checkpoint_conn_id; "
                        "'default' is the SQLite file under AIRFLOW_HOME they use without one.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "default,vitess_checkpoints",
                        "default": "default",
                    },
                    "spill_dir": {
                        "description": "Where capture tasks spill what exceeds their memory limits "
                        "(large transactions, changes held for the cross-shard order); empty: the system's "
                        "temporary directory. The operators' spill_dir argument wins over it. Spill files "
                        "are anonymous (unlinked from the start): their space is freed when the task ends, "
                        "however it ends.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/tmp/vitess-spill",
                        "default": "",
                    },
                    "shared_filesystem": {
                        "description": "Under an executor that may run tasks on several hosts (Celery, "
                        "Kubernetes, Edge), a sync's staging and target locations must be object-store "
                        "URLs, and its checkpoint store a database server: a task refuses a local path or "
                        "the SQLite default (SingleHostSettingsError). True declares that every worker "
                        "mounts one shared filesystem at the local paths the DAGs use, so they are allowed "
                        "(a SQLite store is refused even then: its locking does not hold on network "
                        "filesystems).",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                },
            }
        },
        "asset-uris": [
            {
                "schemes": ["vitess"],
                "handler": f"{_URIS}.sanitize_uri",
                "factory": f"{_URIS}.create_asset",
                "to_openlineage_converter": f"{_URIS}.convert_asset_to_openlineage",
            }
        ],
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
