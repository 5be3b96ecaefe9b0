"""``VitessHook``: an Airflow connection turned into a gRPC VStream client and a SQL engine.

vtgate speaks two protocols and we need both: gRPC for VStream (the change stream) and the
MySQL protocol for ``count(*)``, schema and key queries. One connection describes both, so a
user configures vtgate once. Credentials only ever come from the connection and are never
logged: they travel as gRPC call metadata (vtgate's static auth reads ``username`` and
``password``) and as the MySQL handshake.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import Any, cast

import grpc
import pymysql
import sqlalchemy
from airflow.sdk.bases.hook import BaseHook
from sqlalchemy.engine import URL, Engine

from airflow_provider_vitess._proto import vtgate_pb2, vtgateservice_pb2, vtrpc_pb2
from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.hooks import tls
from airflow_provider_vitess.hooks.channel import channel_options, new_channel, not_answering
from airflow_provider_vitess.hooks.connection_config import (
    EXTRA_FIELDS,
    UI_FIELD_BEHAVIOUR,
    VitessConnectionConfig,
)
from airflow_provider_vitess.vstream.request import StreamTarget

log = logging.getLogger(__name__)

# The gRPC path of Vitess.VStream (``/vtgateservice.Vitess/VStream``), from our protos.
_VSTREAM = vtgateservice_pb2.DESCRIPTOR.services_by_name["Vitess"].methods_by_name["VStream"]
VSTREAM_METHOD = f"/{_VSTREAM.containing_service.full_name}/{_VSTREAM.name}"

# MySQL error numbers that mean "you are not who you say" rather than "cannot reach".
_MYSQL_AUTH_ERRORS = {1044, 1045, 1698}


def _disable_autocommit(dbapi_connection: Any, _record: Any) -> None:
    """Makes SQLAlchemy transactions real transactions on vtgate.

    vtgate's handshake does not report autocommit as on, so pymysql believes it is already off
    and never says so; vtgate then autocommits every statement and a "transaction" of several
    statements reaches the binlog as several transactions.
    """
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET autocommit = 0")


class VitessHook(BaseHook):
    """Talks to one vtgate described by an Airflow connection of type ``vitess``.

    :param vitess_conn_id: the connection id (default ``vitess_default``).
    """

    conn_name_attr = "vitess_conn_id"
    default_conn_name = "vitess_default"
    conn_type = "vitess"
    hook_name = "Vitess"

    def __init__(self, vitess_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vitess_conn_id = vitess_conn_id
        self._channel: grpc.Channel | None = None

    # ----- configuration -------------------------------------------------------------------

    @cached_property
    def config(self) -> VitessConnectionConfig:
        conn = self.get_connection(self.vitess_conn_id)
        return VitessConnectionConfig.from_parts(
            host=conn.host, port=conn.port, login=conn.login, password=conn.password, extra=conn.extra_dejson
        )

    # ----- gRPC ----------------------------------------------------------------------------

    def channel_options(self) -> list[tuple[str, Any]]:
        """gRPC channel options from the connection (message size, keepalive, TLS name)."""
        return channel_options(self.config)

    def get_channel(self) -> grpc.Channel:
        """The hook's gRPC channel to vtgate, opened and checked on first use."""
        if self._channel is not None:
            return self._channel
        cfg = self.config
        channel: grpc.Channel = new_channel(cfg)
        try:
            grpc.channel_ready_future(channel).result(timeout=cfg.timeout_seconds)
        except grpc.FutureTimeoutError:
            channel.close()
            raise not_answering(cfg) from None
        self._channel = channel
        return channel

    def reset_channel(self) -> None:
        """Drops the gRPC channel; the next call connects afresh. For a connection found dead
        (a stream silent past its heartbeats): a call reopened on the same channel would reuse
        the same black-holed TCP connection until keepalive gives it up."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def call_metadata(self) -> list[tuple[str, str]]:
        """The credentials as gRPC call metadata (vtgate's static auth); never log it."""
        cfg = self.config
        if not cfg.user:
            return []
        return [("username", cfg.user), ("password", cfg.password)]

    def vstream_flags(self, **overrides: Any) -> vtgate_pb2.VStreamFlags:
        """VStreamFlags with the connection's cells; ``overrides`` set any other flag field."""
        return StreamTarget.of(self.config).flags(**overrides)

    def open_vstream(
        self, request: vtgate_pb2.VStreamRequest, timeout: float | None = None
    ) -> Iterator[vtgate_pb2.VStreamResponse]:
        """Starts one VStream call; the returned iterator is also a gRPC call (``cancel()``).

        ``timeout`` bounds the whole call (a window's max duration), not the connect.
        """
        call = self._vstream_call(request, timeout, vtgate_pb2.VStreamResponse.FromString)
        return cast(Iterator[vtgate_pb2.VStreamResponse], call)

    def open_vstream_raw(
        self, request: vtgate_pb2.VStreamRequest, timeout: float | None = None
    ) -> Iterator[bytes]:
        """:meth:`open_vstream`, but each response is left serialized (``VStreamReader`` reads
        them through views that do not parse rows: see ``decoding/wire.py``)."""
        # No response deserializer: gRPC hands over the bytes.
        return cast(Iterator[bytes], self._vstream_call(request, timeout, None))

    def _vstream_call(
        self,
        request: vtgate_pb2.VStreamRequest,
        timeout: float | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> Any:
        vstream = self.get_channel().unary_stream(
            VSTREAM_METHOD,
            request_serializer=vtgate_pb2.VStreamRequest.SerializeToString,
            response_deserializer=deserializer,
        )
        # The call is also the iterator of its responses.
        return vstream(self.with_caller(request), timeout=timeout, metadata=tuple(self.call_metadata()))

    def with_caller(self, request: vtgate_pb2.VStreamRequest) -> vtgate_pb2.VStreamRequest:
        """``request`` with the connection's user as caller id, unless it names one."""
        if not request.HasField("caller_id") and self.config.user:
            request.caller_id.CopyFrom(vtrpc_pb2.CallerID(principal=self.config.user))
        return request

    def check_grpc_access(self) -> None:
        """Proves the gRPC credentials with a call that does nothing.

        vtgate authenticates every call before looking at it, and rejects a VStream without a
        VGTID as invalid: so INVALID_ARGUMENT means "credentials accepted", UNAUTHENTICATED not.
        """
        cfg = self.config
        try:
            for _ in self.open_vstream(vtgate_pb2.VStreamRequest(), timeout=cfg.timeout_seconds):
                break
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                return
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise VitessConnectionError(
                    f"vtgate gRPC at {cfg.grpc_target} refused user {cfg.user!r}: wrong user or password "
                    f"({code.name})"
                ) from None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise VitessConnectionError(
                f"vtgate gRPC at {cfg.grpc_target} failed: {code.name if code else 'error'}: {details}"
            ) from None

    # ----- MySQL protocol ------------------------------------------------------------------

    @cached_property
    def engine(self) -> Engine:
        """A SQLAlchemy engine on vtgate's MySQL port (pymysql driver)."""
        cfg = self.config
        # TLS verified against tls_ca or the system roots, for tls_server_name or the host; no
        # password-revealing auth plugin without it (see hooks/tls.py).
        connect_args: dict[str, Any] = {
            "connect_timeout": max(1, round(cfg.timeout_seconds)),
            **tls.pymysql_args(cfg),
        }
        url = URL.create(
            "mysql+pymysql",
            username=cfg.user or None,
            password=cfg.password or None,
            host=cfg.host,
            port=cfg.mysql_port,
            query={"charset": "utf8mb4"},
        )
        engine = sqlalchemy.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        sqlalchemy.event.listen(engine, "connect", _disable_autocommit)
        return engine

    def connect_sql(self) -> sqlalchemy.Connection:
        """A connection to vtgate's MySQL port; failures become errors that say what to fix."""
        cfg = self.config
        try:
            return self.engine.connect()
        except sqlalchemy.exc.OperationalError as exc:
            orig = exc.orig
            code = orig.args[0] if isinstance(orig, pymysql.err.MySQLError) and orig.args else None
            if code in _MYSQL_AUTH_ERRORS:
                raise VitessConnectionError(
                    f"vtgate MySQL at {cfg.mysql_target} refused user {cfg.user!r}: "
                    f"wrong user or password (MySQL error {code})"
                ) from None
            refused = tls.refusal(cfg, orig) if orig is not None else None
            if refused:
                raise VitessConnectionError(f"vtgate MySQL at {cfg.mysql_target}: {refused}") from None
            raise VitessConnectionError(
                f"cannot connect to vtgate MySQL at {cfg.mysql_target}: {orig}"
            ) from None

    # ----- Airflow UI ----------------------------------------------------------------------

    def test_connection(self) -> tuple[bool, str]:
        """Checks both protocols and the credentials on each."""
        try:
            with self.connect_sql() as conn:
                version = conn.execute(sqlalchemy.text("SELECT @@version")).scalar()
            self.check_grpc_access()
        except VitessConnectionError as exc:
            return False, str(exc)
        cfg = self.config
        return True, f"Connected to vtgate {version} (MySQL {cfg.mysql_target}, gRPC {cfg.grpc_target})"

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form for Airflow versions before 3.2, which read it from the hook."""
        from flask_babel import lazy_gettext
        from wtforms import BooleanField, StringField

        widgets: dict[str, Any] = {}
        for name, (label, json_type, _default, help_text) in EXTRA_FIELDS.items():
            field_class = BooleanField if json_type == "boolean" else StringField
            widgets[name] = field_class(lazy_gettext(label), description=help_text)
        return widgets

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return UI_FIELD_BEHAVIOUR

    def close(self) -> None:
        self.reset_channel()
        if "engine" in self.__dict__:
            self.engine.dispose()
