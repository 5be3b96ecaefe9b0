"""Parsing of a vitess connection: defaults, every extra, and the errors naming bad fields."""

from __future__ import annotations

import pytest

from airflow_provider_vitess.exceptions import VitessConnectionError
from airflow_provider_vitess.get_provider_info import get_provider_info
from airflow_provider_vitess.hooks.connection_config import EXTRA_FIELDS, VitessConnectionConfig


def _config(**extra: object) -> VitessConnectionConfig:
    if "tls" not in extra and not any(k.startswith("tls_") for k in extra):
        extra.setdefault("plaintext_password", True)
    return VitessConnectionConfig.from_parts(
        host="vtgate", port=None, login="u", password="s3cret", extra=extra
    )


def test_a_password_never_goes_to_another_machine_in_clear() -> None:
    with pytest.raises(
        VitessConnectionError,
        match=r"connection to 'vtgate' has a password but no TLS: every gRPC call would carry it "
        r"in clear\. Set the extra 'tls'.*'plaintext_password': true",
    ):
        VitessConnectionConfig.from_parts(host="vtgate", port=None, login="u", password="s3cret", extra={})
    assert _config(tls=True, plaintext_password=False).tls
    assert not _config(plaintext_password="yes").tls  # knowingly
    for local in ("127.0.0.1", "localhost", "::1", "[::1]"):  # it stays on this machine
        assert VitessConnectionConfig.from_parts(host=local, port=None, login="u", password="p", extra={})
    # No password, nothing to leak (vtgate without authentication).
    assert VitessConnectionConfig.from_parts(host="vtgate", port=None, login=None, password=None, extra={})


def test_defaults() -> None:
    cfg = _config()
    assert (cfg.grpc_target, cfg.mysql_target) == ("vtgate:15991", "vtgate:15306")
    assert (cfg.tablet_type, cfg.tls, cfg.max_message_bytes, cfg.timeout_seconds) == (
        "PRIMARY",
        False,
        64 << 20,
        30,
    )
    assert "s3cret" not in repr(cfg)


def test_every_extra_is_parsed() -> None:
    cfg = _config(
        mysql_port="3307",
        tablet_type="replica",
        cells="zone1, zone2",
        tls="true",
        tls_ca="/ca.pem",
        tls_cert="/c.pem",
        tls_key="/k.pem",
        tls_server_name="vtgate.internal",
        max_message_mb=128,
        keepalive_seconds="15",
        timeout_seconds=2.5,
    )
    assert cfg.mysql_port == 3307 and cfg.tablet_type == "REPLICA" and cfg.cells == ("zone1", "zone2")
    assert (cfg.tls, cfg.tls_ca, cfg.tls_cert, cfg.tls_key) == (True, "/ca.pem", "/c.pem", "/k.pem")
    assert (cfg.tls_server_name, cfg.max_message_bytes) == ("vtgate.internal", 128 << 20)
    assert (cfg.keepalive_seconds, cfg.timeout_seconds) == (15.0, 2.5)


def test_a_ca_file_alone_turns_tls_on() -> None:
    assert _config(tls_ca="/ca.pem").tls is True


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tablet_typ": "PRIMARY"}, r"unknown extra\(s\) 'tablet_typ'"),
        ({"tablet_type": "MASTERX"}, r"'tablet_type' must be one of PRIMARY, REPLICA, RDONLY, got 'MASTERX'"),
        ({"tls": "maybe"}, r"'tls' must be true or false, got 'maybe'"),
        ({"mysql_port": "abc"}, r"'mysql_port' must be a number, got 'abc'"),
        ({"max_message_mb": 1}, r"'max_message_mb' must be at least 4"),
        ({"tls_cert": "/c.pem"}, r"'tls_cert' and 'tls_key' must be set together"),
    ],
)
def test_bad_extras_are_named(extra: dict[str, object], message: str) -> None:
    with pytest.raises(VitessConnectionError, match=message):
        _config(**extra)


def test_missing_host() -> None:
    with pytest.raises(VitessConnectionError, match="no host"):
        VitessConnectionConfig.from_parts(host="", port=1, login=None, password=None, extra={})


def test_provider_info_declares_the_connection_form() -> None:
    info = get_provider_info()
    (conn_type,) = info["connection-types"]
    assert conn_type["connection-type"] == "vitess"
    assert conn_type["hook-class-name"] == "airflow_provider_vitess.hooks.vitess.VitessHook"
    assert set(conn_type["conn-fields"]) == set(EXTRA_FIELDS)
    assert conn_type["conn-fields"]["mysql_port"]["schema"] == {"type": ["integer", "null"], "default": 15306}
    assert conn_type["ui-field-behaviour"]["hidden-fields"] == ["schema", "extra"]
