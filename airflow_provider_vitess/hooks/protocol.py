"""What the layers below the Airflow edge need of a Vitess hook, as a protocol.

``capture/`` and ``keys/`` run inside Airflow tasks but import no Airflow module: they are
handed a :class:`~airflow_provider_vitess.hooks.vitess.VitessHook` and type it by this protocol,
so they can be used (and tested) with anything that reaches vtgate the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import sqlalchemy
from sqlalchemy.engine import Engine

from airflow_provider_vitess._proto import vtgate_pb2
from airflow_provider_vitess.hooks.connection_config import VitessConnectionConfig


class VitessClient(Protocol):
    """vtgate's two protocols, as the hook opens them from one Airflow connection."""

    @property
    def config(self) -> VitessConnectionConfig: ...

    @property
    def engine(self) -> Engine: ...

    def connect_sql(self) -> sqlalchemy.Connection: ...

    def open_vstream_raw(
        self, request: vtgate_pb2.VStreamRequest, timeout: float | None = None
    ) -> Iterator[bytes]: ...

    def reset_channel(self) -> None: ...


def quote(hook: VitessClient, identifier: str) -> str:
    """``identifier`` quoted for SQL text in the client's dialect (names never go in unquoted)."""
    return str(hook.engine.dialect.identifier_preparer.quote_identifier(identifier))
