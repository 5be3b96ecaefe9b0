"""Names of the tables a sync reads and writes, as Asset URIs and OpenLineage datasets.

Source tables: ``vitess://<vtgate host>:<grpc port>/<keyspace>/<table>`` (the ``vitess`` asset
scheme this provider declares), whose OpenLineage dataset is namespace ``vitess://host:port``,
name ``<keyspace>.<table>`` — the shape the MySQL provider gives ``mysql://host:port/db/table``.

Delta tables: their location as a URI Airflow knows (``file://`` for a local path, ``s3://`` for
Spark's ``s3a://``), whose OpenLineage dataset follows the spec's naming for files and object
stores (namespace ``file`` or ``s3://bucket``, name the path).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_vitess.hooks.connection_config import DEFAULT_GRPC_PORT

if TYPE_CHECKING:
    from urllib.parse import SplitResult

SCHEME = "vitess"
# Hadoop's names for S3 and the name every other tool (Airflow's Amazon provider included) uses.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


class DatasetName(NamedTuple):
    """An OpenLineage dataset identity, without depending on the OpenLineage client."""

    namespace: str
    name: str


# -- Vitess source tables ------------------------------------------------------------------------


def vitess_namespace(vtgate: str) -> str:
    """``vitess://host:port`` for a vtgate address ``host:port`` (the connection's gRPC port)."""
    host, _, port = vtgate.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"vtgate address {vtgate!r} is not 'host:port'")
    return f"{SCHEME}://{host.lower()}:{int(port)}"


def vitess_uri(vtgate: str, keyspace: str, table: str) -> str:
    return f"{vitess_namespace(vtgate)}/{keyspace}/{table}"


def vitess_dataset(vtgate: str, keyspace: str, table: str) -> DatasetName:
    return DatasetName(vitess_namespace(vtgate), f"{keyspace}.{table}")


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's asset URI handler for ``vitess://``: a host, a port (vtgate's gRPC default when
    left out) and exactly ``/<keyspace>/<table>``."""
    if not uri.netloc or not uri.hostname:
        raise ValueError("A vitess:// asset URI needs vtgate's host: vitess://host:port/keyspace/table")
    if uri.port is None:
        uri = uri._replace(netloc=f"{uri.hostname}:{DEFAULT_GRPC_PORT}")
    parts = uri.path.strip("/").split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"A vitess:// asset URI names /<keyspace>/<table>, not {uri.path!r}")
    return uri


def convert_asset_to_openlineage(asset: Any, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a ``vitess://`` Asset (the provider's ``to_openlineage_converter``)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    parsed = urllib.parse.urlsplit(asset.uri)
    keyspace, table = parsed.path.strip("/").split("/")
    return Dataset(namespace=f"{SCHEME}://{parsed.netloc}", name=f"{keyspace}.{table}")


def create_asset(
    *, host: str, keyspace: str, table: str, port: int = DEFAULT_GRPC_PORT, extra: Any = None
) -> Any:
    """An Asset for a Vitess table (the provider's asset ``factory``)."""
    from airflow.sdk import Asset

    return Asset(uri=vitess_uri(f"{host}:{port}", keyspace, table), extra=extra)


# -- Delta target tables -------------------------------------------------------------------------


def location_uri(location: str) -> str:
    """A table location (path or URL, as given to Spark) as an Asset URI: ``file:///abs/path``
    for a local path, ``s3://`` for ``s3a://``; no trailing slash."""
    parsed = urllib.parse.urlsplit(location)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a path (one letter: a Windows drive)
        return "file://" + os.path.abspath(location).rstrip("/")
    scheme = _SCHEME_ALIASES.get(parsed.scheme.lower(), parsed.scheme.lower())
    if scheme == "file":
        return "file://" + os.path.abspath(parsed.path).rstrip("/")
    return urllib.parse.urlunsplit(parsed._replace(scheme=scheme, path=parsed.path.rstrip("/")))


def location_dataset(location: str) -> DatasetName:
    """The OpenLineage dataset of a table location: namespace ``file`` and the absolute path,
    or ``<scheme>://<bucket>`` and the key prefix."""
    parsed = urllib.parse.urlsplit(location_uri(location))
    if parsed.scheme == "file":
        return DatasetName("file", parsed.path)
    return DatasetName(f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/"))
