"""One gRPC channel set-up for both clients of vtgate: the blocking hook and the asyncio one.

From a connection's config: the channel options (message size, keepalives, TLS server name),
the TLS credentials (CA, client certificate for mutual TLS) and the error when vtgate does not
answer in time. ``grpc`` and ``grpc.aio`` take the same arguments, so the module is a parameter:
a trigger reaches vtgate exactly the way a task's hook does.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import grpc

from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.hooks import tls
from airflow_provider_vitess.hooks.connection_config import VitessConnectionConfig

log = logging.getLogger(__name__)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise VitessConnectionError(f"cannot read the {what} file {path!r}: {exc.strerror}") from None


def tls_credentials(cfg: VitessConnectionConfig) -> grpc.ChannelCredentials:
    """TLS credentials of the connection: its CA, and a client certificate for mutual TLS."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(cfg.tls_ca, "TLS CA") if cfg.tls_ca else None,
        private_key=_read(cfg.tls_key, "TLS client key") if cfg.tls_key else None,
        certificate_chain=_read(cfg.tls_cert, "TLS client certificate") if cfg.tls_cert else None,
    )


def channel_options(cfg: VitessConnectionConfig) -> list[tuple[str, Any]]:
    """gRPC channel options from the connection (message size, keepalive, TLS name)."""
    options: list[tuple[str, Any]] = [
        # VStream responses batch many rows; gRPC's 4 MiB default is too small for wide rows.
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        # Keepalive pings find a dead or black-holed link under a stream (the stream calls
        # carry no deadline). vtgate answers pings more frequent than its
        # --grpc_keepalive_enforcement_policy_min_time (10 s by default), or any ping while
        # no call is open, with GOAWAY "too_many_pings", and gRPC then doubles the ping
        # interval for good: measured through a fault proxy, a 2 s keepalive took 68 s to
        # notice a stall, a 10 s one ~20 s. So: no pings without a call.
        ("grpc.keepalive_time_ms", int(cfg.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(max(cfg.keepalive_seconds, 10) * 1000)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if cfg.tls_server_name:
        options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
    return options


def new_channel(cfg: VitessConnectionConfig, module: ModuleType = grpc) -> Any:
    """An unchecked channel to vtgate's gRPC port: ``module`` is ``grpc`` or ``grpc.aio``."""
    log.info(
        "Connecting to vtgate gRPC at %s (%s%s) as %r",
        cfg.grpc_target,
        "TLS" if cfg.tls else "plaintext",
        ", asyncio" if module is not grpc else "",
        cfg.user,
    )
    if cfg.tls:
        return module.secure_channel(cfg.grpc_target, tls_credentials(cfg), options=channel_options(cfg))
    return module.insecure_channel(cfg.grpc_target, options=channel_options(cfg))


def not_answering(cfg: VitessConnectionConfig) -> VitessConnectionError:
    """The error of a channel that was not ready within the connection's timeout. With TLS, a
    handshake of our own says whether vtgate's certificate is why (gRPC only times out)."""
    refused = tls.probe(cfg, cfg.host, cfg.grpc_port) if cfg.tls else None
    if refused:
        return VitessConnectionError(f"vtgate gRPC at {cfg.grpc_target}: {refused}")
    hint = " (is it TLS-only? set the 'tls' extra)" if not cfg.tls else " (check the TLS CA and name)"
    return VitessConnectionError(
        f"vtgate gRPC at {cfg.grpc_target} did not answer within {cfg.timeout_seconds:g}s{hint}"
    )
