"""Extra links on the task page: the sync's status page, its Delta tables, the Spark UI.

Airflow 3 calls ``get_link`` once, when the task finishes in the worker (the operator's templates
rendered, its ``execute`` done), and keeps the URL in XCom for the UI. An empty URL means "not
known" and shows no working button. The classes are listed in the provider info
(``extra-links``) so the API server can resolve them from serialized DAGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_provider_vitess.plugins import STATUS_PAGE_PATH
from airflow_provider_vitess.utils.task import airflow_conf


def _base_url() -> str:
    """The API server's public URL (``[api] base_url``); empty keeps links relative to the UI."""
    return str(airflow_conf().get("api", "base_url", fallback="") or "").rstrip("/")


def status_page_url(base_url: str, sync_id: str | None) -> str:
    """The status page, scrolled to the sync's section."""
    page = f"{base_url}{STATUS_PAGE_PATH}"
    return f"{page}#{quote(sync_id, safe='')}" if sync_id else page


def location_url(location: str | None) -> str:
    """A Delta location as a URL: local paths become ``file://``, URIs stay as they are."""
    if not location:
        return ""
    if urlsplit(location).scheme:
        return location
    return Path(location).resolve().as_uri()


def spark_history_url(history_url: str | None, application_id: str | None) -> str:
    """The application's page on a Spark history server, when both are known."""
    if not history_url or not application_id:
        return ""
    return f"{history_url.rstrip('/')}/history/{quote(application_id, safe='')}/"


class VitessSyncStatusLink(BaseOperatorLink):
    """The sync's section of the status page (Browse -> Vitess syncs)."""

    name = "Vitess sync status"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return status_page_url(_base_url(), getattr(operator, "sync_id", None))


class DeltaTableLink(BaseOperatorLink):
    """Where the merge writes the sync's Delta tables (``<target_location>/<table>``)."""

    name = "Delta tables"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return location_url(getattr(operator, "target_location", None))


class SparkUILink(BaseOperatorLink):
    """The merge's Spark application on the history server given as ``spark_history_url``."""

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return spark_history_url(
            getattr(operator, "spark_history_url", None), getattr(operator, "spark_application_id", None)
        )
