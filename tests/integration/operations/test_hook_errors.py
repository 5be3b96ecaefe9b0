"""Bad input and bad connections fail clearly, within the timeout, and never leak the password."""

from __future__ import annotations

import logging
import secrets
import socket
import ssl
import time

import pytest
import sqlalchemy

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.decoding.events import VgtidEvent
from airflow_provider_vitess.exceptions import InvalidVgtidError, VitessConnectionError, VStreamError
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.vgtid import Vgtid
from airflow_provider_vitess.vstream.reader import VStreamReader
from tests.support.local import LocalVitess, connection_uri_env

pytestmark = pytest.mark.integration


def _use_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, cluster: LocalVitess, **kw: object) -> str:
    name, value = connection_uri_env(conn_id, cluster, **kw.pop("extra", {}))  # type: ignore[arg-type]
    monkeypatch.setenv(name, value)
    return conn_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first_vgtid(hook: VitessHook, keyspace: str) -> binlogdata_pb2.VGtid:
    reader = VStreamReader(lambda r: hook.open_vstream(r, timeout=30), keyspace=keyspace)
    events = reader.events()
    try:
        for event in events:
            if isinstance(event, VgtidEvent):
                return event.vgtid
    finally:
        events.close()
    raise AssertionError("no VGTID event")


def test_malformed_vgtid_is_refused_naming_the_problem() -> None:
    with pytest.raises(InvalidVgtidError, match=r"entry 0 .*'customer'.*shard"):
        Vgtid.from_json('[{"keyspace": "customer", "gtid": "MariaDB/0-1-5"}]')
    with pytest.raises(InvalidVgtidError, match=r"MariaDB.*0-1-x"):
        Vgtid.from_json('[{"keyspace": "customer", "shard": "-80", "gtid": "MariaDB/0-1-x"}]')


def test_unknown_keyspace_is_a_clear_vstream_error(vitess_conn_id: str) -> None:
    hook = VitessHook(vitess_conn_id)
    reader = VStreamReader(lambda r: hook.open_vstream(r, timeout=30), keyspace="no_such_keyspace")
    with pytest.raises(VStreamError, match="no_such_keyspace") as info:
        next(iter(reader.events()))
    assert (
        "INVALID_ARGUMENT" in str(info.value)
        or "NOT_FOUND" in str(info.value)
        or "UNKNOWN" in str(info.value)
    )


def test_unreachable_vtgate_fails_within_timeout_naming_host_and_port(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    dead = LocalVitess(vitess.host, port, port, vitess.user, vitess.password, vitess.tls_ca)
    hook = VitessHook(_use_connection(monkeypatch, "vitess_dead", dead, extra={"timeout_seconds": 2}))
    started = time.monotonic()
    with pytest.raises(VitessConnectionError, match=rf"127\.0\.0\.1:{port} did not answer within 2s"):
        hook.get_channel()
    assert time.monotonic() - started < 4
    with pytest.raises(
        VitessConnectionError, match=rf"cannot connect to vtgate MySQL at 127\.0\.0\.1:{port}"
    ):
        hook.connect_sql()
    ok, message = hook.test_connection()
    assert not ok and f"127.0.0.1:{port}" in message


def test_wrong_credentials_are_named_on_both_protocols(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = LocalVitess(vitess.host, vitess.grpc_port, vitess.mysql_port, vitess.user, "not-the-password", "")
    hook = VitessHook(_use_connection(monkeypatch, "vitess_wrong", wrong))
    with pytest.raises(
        VitessConnectionError, match=r"MySQL at .* refused user 'airflow': wrong user or password"
    ):
        hook.connect_sql()
    with pytest.raises(
        VitessConnectionError, match=r"gRPC at .* refused user 'airflow': wrong user or password"
    ):
        hook.check_grpc_access()
    ok, message = hook.test_connection()
    assert (ok, "wrong user or password" in message) == (False, True)


def test_tls_to_vtgate_with_the_cluster_ca(vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch) -> None:
    hook = VitessHook(
        _use_connection(monkeypatch, "vitess_tls", vitess, extra={"tls": True, "tls_ca": vitess.tls_ca})
    )
    ok, message = hook.test_connection()
    assert ok, message
    vgtid = _first_vgtid(hook, "customer")
    assert {sg.shard for sg in vgtid.shard_gtids} == {"-80", "80-"}


def test_tls_without_a_ca_verifies_against_the_system_roots(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No CA given: the system trust store does not know the cluster's throwaway CA, so both
    # protocols refuse vtgate's certificate (MySQL once connected without verifying it).
    hook = VitessHook(
        _use_connection(monkeypatch, "vitess_badtls", vitess, extra={"tls": True, "timeout_seconds": 2})
    )
    untrusted = r"certificate is not trusted by the system trust store .*set the connection's 'tls_ca' extra"
    with pytest.raises(
        VitessConnectionError, match=rf"vtgate MySQL at 127\.0\.0\.1:\d+: vtgate's TLS {untrusted}"
    ):
        hook.connect_sql()
    with pytest.raises(
        VitessConnectionError, match=rf"vtgate gRPC at 127\.0\.0\.1:\d+: vtgate's TLS {untrusted}"
    ):
        hook.get_channel()


def test_tls_server_name_is_checked_not_skipped(vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch) -> None:
    # The right CA, but a name the certificate (localhost, 127.0.0.1) does not carry: refused on
    # both protocols (MySQL once turned its name check off when a name was given).
    extra = {
        "tls": True,
        "tls_ca": vitess.tls_ca,
        "tls_server_name": "vtgate.other.example",
        "timeout_seconds": 2,
    }
    hook = VitessHook(_use_connection(monkeypatch, "vitess_othername", vitess, extra=extra))
    other = r"certificate does not carry the name 'vtgate\.other\.example' .*'tls_server_name'"
    with pytest.raises(VitessConnectionError, match=rf"vtgate MySQL at .*: vtgate's TLS {other}"):
        hook.connect_sql()
    with pytest.raises(VitessConnectionError, match=rf"vtgate gRPC at .*: vtgate's TLS {other}"):
        hook.get_channel()
    ok, message = hook.test_connection()
    assert not ok and "does not carry the name" in message


def test_tls_with_the_ca_and_the_certificates_name(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Connected by address, verified for the name the certificate carries.
    extra = {"tls": True, "tls_ca": vitess.tls_ca, "tls_server_name": "localhost"}
    hook = VitessHook(_use_connection(monkeypatch, "vitess_named", vitess, extra=extra))
    ok, message = hook.test_connection()
    assert ok, message
    with hook.connect_sql() as conn:
        sock = conn.connection.dbapi_connection._sock  # type: ignore[union-attr]
        # pymysql's socket: TLS, verified for the given name.
        assert isinstance(sock, ssl.SSLSocket) and sock.server_hostname == "localhost"
        assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    vgtid = _first_vgtid(hook, "customer")
    assert {sg.shard for sg in vgtid.shard_gtids} == {"-80", "80-"}


def _read_packet(sock: socket.socket) -> tuple[int, bytes]:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    length, seq = int.from_bytes(header[:3], "little"), header[3]
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return seq, body


def _packet(seq: int, body: bytes) -> bytes:
    return len(body).to_bytes(3, "little") + bytes([seq]) + body


def _on_path_attacker(vtgate_port: int, listener: socket.socket, captured: list[bytes]) -> None:
    """Between the client and vtgate: forwards vtgate's real greeting with its TLS capability
    taken off (so the client stays in the clear), then answers the client's login with an auth
    switch to mysql_clear_password and keeps whatever the client sends."""
    client, _ = listener.accept()
    with client, socket.create_connection(("127.0.0.1", vtgate_port)) as server:
        client.settimeout(10)
        seq, greeting = _read_packet(server)
        version_end = greeting.index(b"\0", 1)
        flags_at = version_end + 1 + 4 + 8 + 1
        flags = int.from_bytes(greeting[flags_at : flags_at + 2], "little") & ~0x0800  # CLIENT_SSL
        greeting = greeting[:flags_at] + flags.to_bytes(2, "little") + greeting[flags_at + 2 :]
        client.sendall(_packet(seq, greeting))
        seq, _login = _read_packet(client)
        client.sendall(_packet(seq + 1, b"\xfemysql_clear_password\0" + b"\0" * 21))
        try:
            while chunk := client.recv(65536):
                captured.append(chunk)
        except OSError:
            pass


def test_no_cleartext_password_to_an_on_path_attacker(
    vitess: LocalVitess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    captured: list[bytes] = []
    attacker = threading.Thread(
        target=_on_path_attacker, args=(vitess.mysql_port, listener, captured), daemon=True
    )
    attacker.start()
    port = listener.getsockname()[1]
    via = LocalVitess(vitess.host, vitess.grpc_port, port, vitess.user, vitess.password, vitess.tls_ca)
    hook = VitessHook(_use_connection(monkeypatch, "vitess_mitm", via, extra={"timeout_seconds": 5}))
    with pytest.raises(
        VitessConnectionError,
        match=r"asked for the password in a form readable on the wire \(mysql_clear_password\)",
    ):
        hook.connect_sql()
    attacker.join(15)
    listener.close()
    assert not attacker.is_alive()
    assert vitess.password.encode() not in b"".join(captured)


def test_password_never_appears_in_logs(
    vitess: LocalVitess,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_password = "wrong-" + secrets.token_hex(8)
    good = VitessHook(_use_connection(monkeypatch, "vitess_good", vitess))
    bad = VitessHook(
        _use_connection(
            monkeypatch,
            "vitess_bad",
            LocalVitess(vitess.host, vitess.grpc_port, vitess.mysql_port, vitess.user, wrong_password, ""),
        )
    )
    messages = [good.test_connection()[1], bad.test_connection()[1], repr(good.config), repr(bad.config)]
    _first_vgtid(good, "commerce")
    for hook in (good, bad):
        logging.getLogger("test").info("hook %r config %s", hook, hook.config)
    out, err = capfd.readouterr()
    everything = "\n".join([caplog.text, out, err, *messages])
    # The capture did see the hook's own log lines (so the checks below can fail).
    assert (
        f"Connecting to vtgate gRPC at 127.0.0.1:{vitess.grpc_port} (plaintext) as 'airflow'" in caplog.text
    )
    assert vitess.password not in everything
    assert wrong_password not in everything
