"""TLS to vtgate, verified: the MySQL side's context, its password guard, and the words for a refusal.

One rule for both protocols: a TLS connection to vtgate verifies the certificate, against the
``tls_ca`` extra's CA or else the system trust store, and checks that it carries the name we
expect (``tls_server_name``, else the host). gRPC does that by itself
(``grpc.ssl_channel_credentials``, ``grpc.ssl_target_name_override``); pymysql, given no CA,
would not verify at all, and ``check_hostname=False`` was the only way to ask it for another
name. So the MySQL side gets an :class:`ssl.SSLContext` of ours.

And a password is never sent where someone other than vtgate may read it: on a channel without
verified TLS (``tls`` off; pymysql then still tries TLS, unverified), the auth plugins that
would hand the password over (``mysql_clear_password``, ``dialog``, ``sha256_password`` and
``caching_sha2_password``'s full authentication, whose RSA key comes from whoever answers) are
refused. An on-path attacker asks for exactly those with an auth switch.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from pymysql import _auth
from pymysql.err import OperationalError

from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.hooks.connection_config import VitessConnectionConfig

# pymysql's error number for an auth plugin it cannot use (CR_AUTH_PLUGIN_CANNOT_LOAD).
_CR_AUTH_PLUGIN_CANNOT_LOAD = 2059
# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH / X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = {62, 64}


class _NamedContext(ssl.SSLContext):
    """A client context that checks ``server_name`` in the certificate (and sends it as SNI)
    whatever host the socket was opened to: pymysql always passes the host."""

    server_name: str | None = None

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["server_hostname"] = self.server_name or kwargs.get("server_hostname")
        return super().wrap_socket(sock, *args, **kwargs)


def verified_context(cfg: VitessConnectionConfig, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """The connection's TLS client context: certificate verified (``tls_ca``, else the system
    trust store) and the expected name checked (``tls_server_name``, else the host)."""
    ctx = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.server_name = cfg.tls_server_name
    try:
        if cfg.tls_ca:
            ctx.load_verify_locations(cafile=cfg.tls_ca)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if cfg.tls_cert:
            ctx.load_cert_chain(cfg.tls_cert, keyfile=cfg.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise VitessConnectionError(
            f"cannot load the TLS files of the vitess connection (tls_ca {cfg.tls_ca!r}, tls_cert "
            f"{cfg.tls_cert!r}, tls_key {cfg.tls_key!r}): {exc}"
        ) from None
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def expected_name(cfg: VitessConnectionConfig) -> str:
    return cfg.tls_server_name or cfg.host


def refusal(cfg: VitessConnectionConfig, exc: BaseException) -> str | None:
    """Why vtgate's certificate was refused and what to set, if ``exc`` (or its cause) is a
    certificate verification failure; else None."""
    found: BaseException | None = exc
    while found is not None and not isinstance(found, ssl.SSLCertVerificationError):
        found = getattr(found, "original_exception", None) or found.__cause__ or found.__context__
    if found is None:
        return None
    reason = found.verify_message or str(found)
    if found.verify_code in _NAME_MISMATCH:
        return (
            f"vtgate's TLS certificate does not carry the name {expected_name(cfg)!r} ({reason}): set "
            "the connection's 'tls_server_name' extra to a name the certificate carries, or "
            "connect by that name"
        )
    trusted_by = f"the CA in 'tls_ca' ({cfg.tls_ca})" if cfg.tls_ca else "the system trust store"
    return (
        f"vtgate's TLS certificate is not trusted by {trusted_by} ({reason}): set the connection's "
        "'tls_ca' extra to the file of the CA certificate that signed vtgate's certificate"
    )


def probe(cfg: VitessConnectionConfig, host: str, port: int) -> str | None:
    """A TLS handshake with ``host:port`` the connection's way: why vtgate's certificate is
    refused, or None (accepted, or no TLS answer to judge). For the gRPC side, whose own
    failure is only a channel that never gets ready."""
    ctx = verified_context(cfg, alpn=("h2",))
    try:
        with (
            socket.create_connection((host, port), timeout=min(cfg.timeout_seconds, 10)) as sock,
            ctx.wrap_socket(sock, server_hostname=host),
        ):
            return None
    except (OSError, ssl.SSLError) as exc:
        return refusal(cfg, exc)


class _RefusePassword:
    """An auth plugin that would send the password readable by whoever answers: refused."""

    plugin = ""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def refuse(self) -> OperationalError:
        return OperationalError(
            _CR_AUTH_PLUGIN_CANNOT_LOAD,
            f"the server asked for the password in a form readable on the wire ({self.plugin}) over "
            "a connection without verified TLS; refused so the password cannot leak to an "
            "on-path attacker. If vtgate really authenticates that way, set the connection's "
            "'tls' extra (and 'tls_ca')",
        )

    def authenticate(self, pkt: Any) -> Any:
        raise self.refuse()

    def prompt(self, echo: bool, prompt: bytes) -> bytes:  # the dialog plugin's question
        raise self.refuse()


class _RefuseClear(_RefusePassword):
    plugin = "mysql_clear_password"


class _RefuseDialog(_RefusePassword):
    plugin = "dialog"


class _RefuseSha256(_RefusePassword):
    plugin = "sha256_password"


class _FastCachingSha2(_RefusePassword):
    """caching_sha2_password's scrambled fast path only; its full authentication sends the
    password in clear over TLS, or RSA-encrypted with a key the server (or an attacker) sends."""

    plugin = "caching_sha2_password full authentication"

    def authenticate(self, pkt: Any) -> Any:
        conn = self.conn
        if not conn.password:
            return _auth._roundtrip(conn, b"")
        if pkt.is_auth_switch_request():
            conn.salt = pkt.read_all().rstrip(b"\0")
            pkt = _auth._roundtrip(conn, _auth.scramble_caching_sha2(conn.password, conn.salt))
        if not pkt.is_extra_auth_data():
            raise OperationalError("caching sha2: unknown packet for fast auth")
        pkt.advance(1)
        if pkt.read_uint8() != 3:  # 3: fast auth succeeded; 4: full authentication wanted
            raise self.refuse()
        pkt = conn._read_packet()
        pkt.check_error()
        return pkt


def pymysql_args(cfg: VitessConnectionConfig) -> dict[str, Any]:
    """pymysql's connect arguments for TLS and authentication: a verified context with ``tls``,
    else the password-revealing auth plugins refused."""
    if cfg.tls:
        return {"ssl": verified_context(cfg)}
    return {
        "auth_plugin_map": {
            "mysql_clear_password": _RefuseClear,
            "dialog": _RefuseDialog,
            "sha256_password": _RefuseSha256,
            "caching_sha2_password": _FastCachingSha2,
        }
    }
