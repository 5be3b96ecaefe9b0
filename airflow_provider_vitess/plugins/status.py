"""The sync status page: an Airflow 3 plugin mounting a small read-only FastAPI app in the API
server (``/vitess``, linked as Browse -> Vitess syncs) that serves :mod:`.documents` over HTTP.

Airflow mounts plugin apps without its auth dependencies, so every route declares them: a user
Airflow authenticated who may read DAGs, and each sync only for users who may read one of its
DAGs (its errors quote source rows' key values). The stores it reads:
``[vitess] status_checkpoint_conn_ids`` (``docs/status-page.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.database import default_url
from airflow_provider_vitess.checkpoints.urls import url_from_connection
from airflow_provider_vitess.plugins import STATUS_PAGE_PATH, URL_PREFIX, documents

PAGE = Path(__file__).resolve().parent / "page"
DEFAULT_STORE = "default"
_ASSETS = {"status.js": "text/javascript", "status.css": "text/css"}

# One engine per store URL for the server's lifetime (connection pooling), not per request.
_stores: dict[str, CheckpointStore] = {}


def configured_store_names() -> list[str]:
    raw = conf.get("vitess", "status_checkpoint_conn_ids", fallback=DEFAULT_STORE) or DEFAULT_STORE
    return [name.strip() for name in raw.split(",") if name.strip()]


def _store(name: str) -> CheckpointStore:
    if name == DEFAULT_STORE:
        url = default_url()
    else:
        from airflow.models.connection import Connection

        url = url_from_connection(Connection.get_connection_from_secrets(name))
    if url not in _stores:
        _stores[url] = CheckpointStore(url)
    return _stores[url]


def _open_stores() -> tuple[dict[str, CheckpointStore], dict[str, str]]:
    stores: dict[str, CheckpointStore] = {}
    errors: dict[str, str] = {}
    for name in configured_store_names():
        try:
            stores[name] = _store(name)
        except Exception as exc:  # e.g. a connection id that does not exist: say so on the page
            errors[name] = f"{type(exc).__name__}: {exc}"
    return stores, errors


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _may_read(user: Any) -> documents.MayRead:
    """Whether ``user`` may see a sync run by the given DAGs: the auth manager lets the user read
    one of them (per-DAG permissions included; asked per DAG id, so a DAG not parsed into this
    metadata database is judged by its permissions too). A sync without recorded DAGs needs
    every DAG this Airflow knows."""
    manager = get_auth_manager()
    answers: dict[str, bool] = {}

    def readable(dag_id: str) -> bool:
        if dag_id not in answers:
            answers[dag_id] = manager.is_authorized_dag(
                method="GET", details=DagDetails(id=dag_id), user=user
            )
        return answers[dag_id]

    every: list[bool] = []

    def may_read(dags: Sequence[str]) -> bool:
        if dags:
            return any(readable(d) for d in dags)
        if not every:
            from airflow.models.dag import DagModel
            from airflow.utils.session import create_session
            from sqlalchemy import select

            with create_session() as session:
                known = list(session.scalars(select(DagModel.dag_id)))
            every.append(bool(known) and all(readable(d) for d in known))
        return every[0]

    return may_read


app = FastAPI(
    title="Vitess sync status",
    description="Read-only status of the Vitess -> Delta syncs recorded in the checkpoint stores.",
    # Plugin apps do not inherit the API server's auth: without this, anyone could read them.
    dependencies=[Depends(requires_access_dag(method="GET"))],
    # FastAPI's own schema and docs routes would skip those dependencies: served below instead.
    openapi_url=None,
    docs_url=None,
    redoc_url=None,
)


@app.get("/api/openapi.json", include_in_schema=False)
def openapi() -> dict[str, Any]:
    """The API's OpenAPI schema (for users' own dashboards and clients)."""
    return app.openapi()


@app.get("/api/syncs", response_model=documents.Overview)
def list_syncs(user: GetUserDep) -> documents.Overview:
    """Every sync of every configured store that the user may read (see the module), with its
    latest window and committed position."""
    stores, errors = _open_stores()
    result = documents.overview(stores, _now(), _may_read(user))
    result.errors.update(errors)
    return result


@app.get("/api/syncs/{sync_id}", response_model=documents.SyncStatus)
def get_sync(
    sync_id: str,
    user: GetUserDep,
    store: Annotated[
        str | None, Query(description="the store holding it (default: the first that does)")
    ] = None,
    windows: Annotated[int, Query(ge=1, le=documents.MAX_WINDOWS)] = documents.DEFAULT_WINDOWS,
) -> documents.SyncStatus:
    """One sync: tables with keys and snapshot progress, committed position, windows, last error."""
    stores, errors = _open_stores()
    if store is not None:
        if store not in stores:
            raise HTTPException(404, errors.get(store) or f"no checkpoint store {store!r} is configured")
        stores = {store: stores[store]}
    may_read = _may_read(user)
    for name, candidate in stores.items():
        if candidate.schema_revision() is None:
            continue
        # A sync the user may not read is not found: its existence is not told either.
        status = documents.sync_status(candidate, name, sync_id, _now(), windows, may_read)
        if status is not None:
            return status
    raise HTTPException(404, f"no sync {sync_id!r} in the checkpoint stores {', '.join(stores) or '(none)'}")


@app.get("/", include_in_schema=False)
def page() -> FileResponse:
    return FileResponse(PAGE / "index.html", media_type="text/html")


@app.get("/{asset}", include_in_schema=False)
def asset(asset: str) -> FileResponse:
    if asset not in _ASSETS:
        raise HTTPException(404, f"no such file: {asset}")
    return FileResponse(PAGE / asset, media_type=_ASSETS[asset])


class VitessStatusPlugin(AirflowPlugin):
    """Registered by the provider: ``plugins`` in its provider info, and :data:`entry_point`."""

    name = "vitess_status"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Vitess sync status"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "Vitess syncs",
            "href": STATUS_PAGE_PATH,
            "url_route": "vitess-syncs",
            "destination": "nav",
            "category": "browse",
        }
    ]


def _for_entry_point() -> type[VitessStatusPlugin] | None:
    from airflow import settings

    return VitessStatusPlugin if settings.LAZY_LOAD_PROVIDERS else None


# What the ``airflow.plugins`` entry point names. Airflow 3 loads providers' ``plugins`` only with
# ``[core] lazy_discover_providers = False`` (default True), so by default the entry point must
# register the plugin; with eager discovery the provider info does, and a second registration
# would be reported as a plugin import error. ``None`` is skipped silently by the loader.
entry_point = _for_entry_point()
