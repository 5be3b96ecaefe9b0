"""What a ``vitess`` Airflow connection says, parsed and checked (pure: no I/O, no Airflow).

A connection holds the vtgate host, its gRPC port in ``port``, login/password, and the rest in
extras. Parsing is separate from the hook so every field's validation is unit tested, and so a
bad value fails with a message naming the field before any network call is made.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess.exceptions import VitessConnectionError

DEFAULT_GRPC_PORT = 15991
DEFAULT_MYSQL_PORT = 15306
TABLET_TYPES = ("PRIMARY", "REPLICA", "RDONLY")

# Extras a user can set: (label, JSON-schema type, default, help). The single source of the
# connection form, declared to Airflow both ways it reads forms (see get_provider_info).
EXTRA_FIELDS: dict[str, tuple[str, str, Any, str]] = {
    "mysql_port": (
        "vtgate MySQL port",
        "integer",
        DEFAULT_MYSQL_PORT,
        "vtgate's MySQL protocol port (count(*), schema and key queries)",
    ),
    "tablet_type": (
        "Tablet type",
        "string",
        "PRIMARY",
        "tablet type VStream and count(*) read from: PRIMARY, REPLICA or RDONLY",
    ),
    "cells": ("Cells", "string", None, "comma-separated cells to stream from (empty: vtgate's own cell)"),
    "tls": ("Use TLS", "boolean", False, "use TLS for gRPC and MySQL"),
    "tls_ca": (
        "TLS CA file",
        "string",
        None,
        "path of the CA certificate(s) that signed vtgate's certificate",
    ),
    "tls_cert": (
        "TLS client certificate file",
        "string",
        None,
        "path of the client certificate (mutual TLS)",
    ),
    "tls_key": ("TLS client key file", "string", None, "path of the client private key (mutual TLS)"),
    "tls_server_name": (
        "TLS server name",
        "string",
        None,
        "name to verify in vtgate's certificate, if not the host",
    ),
    "plaintext_password": (
        "Send the password unencrypted",
        "boolean",
        False,
        "without TLS, allow the password to cross the network in clear (gRPC call metadata)",
    ),
    "max_message_mb": ("Max gRPC message (MiB)", "integer", 64, "largest gRPC message accepted from vtgate"),
    "keepalive_seconds": ("gRPC keepalive (s)", "number", 30, "gRPC keepalive ping interval"),
    "timeout_seconds": (
        "Connect timeout (s)",
        "number",
        30,
        "seconds to wait for vtgate to answer when connecting",
    ),
}

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden_fields": ["schema", "extra"],
    "relabeling": {"host": "vtgate host", "port": "vtgate gRPC port"},
    "placeholders": {"host": "vtgate.example.internal", "port": str(DEFAULT_GRPC_PORT)},
}


def declared_conn_fields() -> dict[str, Any]:
    """The form as Airflow 3.2+ reads it from provider info (``conn-fields``)."""
    fields: dict[str, Any] = {}
    for name, (label, json_type, default, help_text) in EXTRA_FIELDS.items():
        schema: dict[str, Any] = {"type": [json_type, "null"]}
        if default is not None:
            schema["default"] = default
        fields[name] = {"label": label, "description": help_text, "schema": schema}
    return fields


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise VitessConnectionError(f"connection extra {name!r} must be true or false, got {value!r}")


def _as_number(name: str, value: Any, *, minimum: float, integer: bool = False) -> float:
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise VitessConnectionError(f"connection extra {name!r} must be a number, got {value!r}") from None
    if number < minimum:
        raise VitessConnectionError(f"connection extra {name!r} must be at least {minimum}, got {value!r}")
    return number


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (a password sent there stays on it)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class VitessConnectionConfig:
    """Everything needed to reach one vtgate. ``password`` is excluded from ``repr``."""

    host: str
    grpc_port: int = DEFAULT_GRPC_PORT
    mysql_port: int = DEFAULT_MYSQL_PORT
    user: str = ""
    password: str = field(default="", repr=False)
    tablet_type: str = "PRIMARY"
    cells: tuple[str, ...] = ()
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    max_message_bytes: int = 64 * 1024 * 1024
    keepalive_seconds: float = 30.0
    timeout_seconds: float = 30.0

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def mysql_target(self) -> str:
        return f"{self.host}:{self.mysql_port}"

    @classmethod
    def from_parts(
        cls,
        *,
        host: str | None,
        port: int | None,
        login: str | None,
        password: str | None,
        extra: Mapping[str, Any],
    ) -> VitessConnectionConfig:
        """Builds the config from an Airflow connection's parts; raises on anything unusable."""
        if not host:
            raise VitessConnectionError("the vitess connection has no host (vtgate's address)")
        unknown = sorted(set(extra) - set(EXTRA_FIELDS))
        if unknown:
            raise VitessConnectionError(
                f"unknown extra(s) {', '.join(map(repr, unknown))} in the vitess connection; "
                f"known: {', '.join(sorted(EXTRA_FIELDS))}"
            )
        tablet_type = str(extra.get("tablet_type") or "PRIMARY").upper()
        if tablet_type not in TABLET_TYPES:
            raise VitessConnectionError(
                f"connection extra 'tablet_type' must be one of {', '.join(TABLET_TYPES)}, "
                f"got {tablet_type!r}"
            )
        cells = tuple(c.strip() for c in str(extra.get("cells") or "").split(",") if c.strip())
        tls_files = {k: extra.get(k) or None for k in ("tls_ca", "tls_cert", "tls_key")}
        tls = _as_bool("tls", extra.get("tls", False)) or any(tls_files.values())
        if bool(tls_files["tls_cert"]) != bool(tls_files["tls_key"]):
            raise VitessConnectionError("connection extras 'tls_cert' and 'tls_key' must be set together")
        plaintext_ok = _as_bool("plaintext_password", extra.get("plaintext_password", False))
        if password and not tls and not plaintext_ok and not _is_loopback(host):
            # vtgate's static auth reads the password from every gRPC call's metadata.
            raise VitessConnectionError(
                f"the vitess connection to {host!r} has a password but no TLS: every gRPC call would "
                "carry it in clear. Set the extra 'tls' (with 'tls_ca' for a private CA); on a "
                "network you trust, the extra 'plaintext_password': true allows it"
            )
        return cls(
            host=host,
            grpc_port=int(port or DEFAULT_GRPC_PORT),
            mysql_port=int(
                _as_number("mysql_port", extra.get("mysql_port", DEFAULT_MYSQL_PORT), minimum=1, integer=True)
            ),
            user=login or "",
            password=password or "",
            tablet_type=tablet_type,
            cells=cells,
            tls=tls,
            tls_ca=tls_files["tls_ca"],
            tls_cert=tls_files["tls_cert"],
            tls_key=tls_files["tls_key"],
            tls_server_name=extra.get("tls_server_name") or None,
            max_message_bytes=int(
                _as_number("max_message_mb", extra.get("max_message_mb", 64), minimum=4) * 1024 * 1024
            ),
            keepalive_seconds=_as_number("keepalive_seconds", extra.get("keepalive_seconds", 30), minimum=1),
            timeout_seconds=_as_number("timeout_seconds", extra.get("timeout_seconds", 30), minimum=0.1),
        )
