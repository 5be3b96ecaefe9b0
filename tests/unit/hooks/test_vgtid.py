from __future__ import annotations

import json

import pytest

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.exceptions import InvalidVgtidError
from airflow_provider_vitess.vgtid import (
    Position,
    ShardGtid,
    TableLastPK,
    Vgtid,
    parse_position,
    position_contains,
    transactions_missing,
)

U1 = "16b1039f-22b6-11ed-b765-0a43f95f28a3"
U2 = "2a3b4c5d-0000-11ee-8c99-0242ac120002"


def _lastpk(pk: int) -> bytes:
    result = query_pb2.QueryResult(
        fields=[query_pb2.Field(name="id", type=query_pb2.INT64, charset=63, flags=49667)],
        rows=[query_pb2.Row(lengths=[len(str(pk))], values=str(pk).encode())],
    )
    return result.SerializeToString(deterministic=True)


COPYING = Vgtid(
    (
        ShardGtid(
            "customer",
            "-80",
            f"MySQL56/{U1}:1-10",
            (TableLastPK("customer", _lastpk(42)), TableLastPK("corder", None)),
        ),
        ShardGtid("customer", "80-", f"MySQL56/{U1}:1-3,{U2}:1-7"),
    )
)


# --- round trips ------------------------------------------------------------------------------


def test_json_round_trip_with_table_pks() -> None:
    text = COPYING.to_json()
    assert Vgtid.from_json(text) == COPYING
    assert Vgtid.from_json(text).to_json() == text
    data = json.loads(text)
    assert [e["shard"] for e in data] == ["-80", "80-"]
    assert data[0]["table_p_ks"][0] == {
        "table_name": "customer",
        "lastpk": {
            "fields": [{"name": "id", "type": "INT64", "charset": 63, "flags": 49667}],
            "rows": [{"lengths": ["2"], "values": "NDI="}],
        },
    }
    assert data[0]["table_p_ks"][1] == {"table_name": "corder"}
    assert data[1]["table_p_ks"] == []


def test_proto_round_trip_with_table_pks() -> None:
    message = COPYING.to_proto()
    assert message.shard_gtids[0].table_p_ks[0].lastpk.rows[0].values == b"42"
    assert not message.shard_gtids[0].table_p_ks[1].HasField("lastpk")
    wire = message.SerializeToString()
    again = Vgtid.from_proto(binlogdata_pb2.VGtid.FromString(wire))
    assert again == COPYING
    assert again.to_proto() == message


def test_empty_lastpk_stays_set_through_proto_and_json() -> None:
    vgtid = Vgtid((ShardGtid("ks", "0", "", (TableLastPK("t", b""),)),))
    assert vgtid.to_proto().shard_gtids[0].table_p_ks[0].HasField("lastpk")
    assert Vgtid.from_proto(vgtid.to_proto()) == vgtid
    assert Vgtid.from_json(vgtid.to_json()) == vgtid


def test_from_json_accepts_protobuf_json_of_vgtid() -> None:
    text = json.dumps({"shard_gtids": [{"keyspace": "commerce", "shard": "0", "gtid": "current"}]})
    assert Vgtid.from_json(text) == Vgtid((ShardGtid("commerce", "0", "current"),))


def test_helpers() -> None:
    assert Vgtid.current("customer", ["-80", "80-"]).to_json() == (
        '[{"keyspace":"customer","shard":"-80","gtid":"current","table_p_ks":[]},'
        '{"keyspace":"customer","shard":"80-","gtid":"current","table_p_ks":[]}]'
    )
    assert Vgtid.for_keyspace("commerce").shard_gtids == (ShardGtid("commerce", "", "current"),)
    assert Vgtid.for_keyspace("commerce", "").is_copying
    assert not Vgtid.for_keyspace("commerce").is_copying
    assert COPYING.is_copying
    assert COPYING.keyspaces == ("customer",)
    assert COPYING.shard("customer", "80-") == COPYING.shard_gtids[1]
    assert COPYING.shard("customer", "-") is None

    done = ShardGtid("customer", "-80", f"MySQL56/{U1}:1-12")
    replaced = COPYING.replace_shard(done)
    assert replaced.shard_gtids == (done, COPYING.shard_gtids[1])
    assert not replaced.is_copying
    added = COPYING.replace_shard(ShardGtid("commerce", "0", "current"))
    assert added.keyspaces == ("customer", "commerce")
    assert COPYING.shard_gtids[0].table_last_pks[0].query_result() == query_pb2.QueryResult.FromString(
        _lastpk(42)
    )


# --- malformed input ---------------------------------------------------------------------------


def _entry(**kw: object) -> dict[str, object]:
    return {"keyspace": "customer", "shard": "-80", "gtid": "current", **kw}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"keyspace": x}]', "VGTID is not JSON: Expecting value at line 1 column 15"),
        ("", "VGTID is not JSON: Expecting value at line 1 column 1"),
        (
            "42",
            "VGTID JSON must be a list of shard entries (or an object with only 'shard_gtids'), got number",
        ),
        ("[]", "VGTID has no shard entries"),
        ('["x"]', "VGTID entry 0 must be an object, got string: 'x'"),
        (
            json.dumps([_entry(), {"keyspace": "customer", "gtid": "current"}]),
            "VGTID entry 1 (keyspace 'customer') has no 'shard'",
        ),
        (json.dumps([{"shard": "0", "gtid": ""}]), "VGTID entry 0 (shard '0') has no 'keyspace'"),
        (
            json.dumps([_entry(gtid=5)]),
            "VGTID entry 0 (keyspace 'customer', shard '-80') 'gtid' must be a string",
        ),
        (
            json.dumps([_entry(shrd="x")]),
            "has unknown key 'shrd' (expected keyspace, shard, gtid, table_p_ks)",
        ),
        (json.dumps([_entry(keyspace="")]), "VGTID entry 0 (shard '-80') has an empty 'keyspace'"),
        (
            json.dumps([_entry(shard="", gtid=f"MySQL56/{U1}:1")]),
            "VGTID entry 0 (keyspace 'customer') has an empty 'shard' with gtid 'MySQL56/",
        ),
        (
            json.dumps([_entry(), _entry(gtid="")]),
            "VGTID entry 1 (keyspace 'customer', shard '-80') repeats entry 0",
        ),
        (
            json.dumps([_entry(gtid="MySQL56/nope:1-5")]),
            "VGTID entry 0 (keyspace 'customer', shard '-80'): invalid MySQL56 GTID set 'nope:1-5': "
            "'nope' is not a server UUID",
        ),
        (json.dumps([_entry(table_p_ks={})]), "'table_p_ks' must be a list, got object"),
        (json.dumps([_entry(table_p_ks=[{"lastpk": {}}])]), "table_p_ks[0] has no 'table_name'"),
        (
            json.dumps([_entry(table_p_ks=[{"table_name": "t"}, {"table_name": "t"}])]),
            "table_p_ks[1] repeats table 't'",
        ),
        (
            json.dumps([_entry(table_p_ks=[{"table_name": "t", "lastpk": {"rowz": []}}])]),
            "table_p_ks[0] ('t') 'lastpk' is not a query.QueryResult: ",
        ),
        (
            json.dumps([_entry(table_p_ks=[{"table_name": "t", "lastpk": 3}])]),
            "table_p_ks[0] ('t') 'lastpk' must be an object",
        ),
    ],
)
def test_malformed_json(text: str, message: str) -> None:
    with pytest.raises(InvalidVgtidError) as info:
        Vgtid.from_json(text)
    assert message in str(info.value)


def test_error_messages_truncate_huge_input() -> None:
    huge = "MySQL56/" + "x" * 5_000_000
    with pytest.raises(InvalidVgtidError) as info:
        Vgtid.from_json(json.dumps([_entry(gtid=huge)]))
    assert len(str(info.value)) < 700
    assert "(5000008 chars)" not in str(info.value)  # the body is quoted, not the whole position
    assert "...(5000000 chars)" in str(info.value)


def test_from_proto_validates() -> None:
    message = binlogdata_pb2.VGtid()
    message.shard_gtids.add(keyspace="customer", shard="-80", gtid="MariaDB/0-1")
    with pytest.raises(InvalidVgtidError, match=r"'0-1' is not domain-server-sequence"):
        Vgtid.from_proto(message)
    with pytest.raises(InvalidVgtidError, match="VGTID has no shard entries"):
        Vgtid.from_proto(binlogdata_pb2.VGtid())


@pytest.mark.parametrize(
    ("position", "message"),
    [
        ("current", "'current' is a request for the newest position, not a position"),
        (f"{U1}:1-5", "has no flavor prefix (expected 'MySQL56/...' or 'MariaDB/...')"),
        (f"FilePos/{U1}", "unknown GTID flavor 'FilePos'"),
        (f"MySQL56/{U1}", f"invalid MySQL56 GTID set '{U1}': '{U1}' has no interval"),
        (f"MySQL56/{U1}:5-3", "interval '5-3' must satisfy 1 <= start <= end"),
        (f"MySQL56/{U1}:0-3", "interval '0-3' must satisfy 1 <= start <= end"),
        (f"MySQL56/{U1}:1-x", "interval '1-x' is not 'N' or 'N-M' with positive integers"),
        ("MariaDB/0-1-5,0-2-9", "invalid MariaDB GTID set '0-1-5,0-2-9': domain 0 appears twice"),
        ("MariaDB/0-1-x", "'0-1-x' is not domain-server-sequence"),
    ],
)
def test_malformed_positions(position: str, message: str) -> None:
    with pytest.raises(InvalidVgtidError) as info:
        parse_position(position)
    assert message in str(info.value)


# --- positions -----------------------------------------------------------------------------------


def test_mysql56_parse_normalizes() -> None:
    text = f"MySQL56/{U2}:3:1-2, \n{U1.upper()}:7-9:1-5:6, {U1}:20,"
    assert parse_position(text) == Position("MySQL56", uuid_sets=((U1, ((1, 9), (20, 20))), (U2, ((1, 3),))))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (f"MySQL56/{U1}:1-10", f"MySQL56/{U1}:1-10", True),
        (f"MySQL56/{U1}:1-10", f"MySQL56/{U1}:1-9", True),
        (f"MySQL56/{U1}:1-9", f"MySQL56/{U1}:1-10", False),
        # A gap in a that b needs: not reached, even though a's maximum is higher.
        (f"MySQL56/{U1}:1-5:7-20", f"MySQL56/{U1}:1-10", False),
        # Gaps on both sides that line up: reached.
        (f"MySQL56/{U1}:1-5:7-20", f"MySQL56/{U1}:1-5:7-10", True),
        # Adjacent intervals are one run.
        (f"MySQL56/{U1}:1-5:6-10", f"MySQL56/{U1}:3-8", True),
        # Every UUID of b must be covered.
        (f"MySQL56/{U1}:1-10", f"MySQL56/{U1}:1-10,{U2}:1", False),
        (f"MySQL56/{U1}:1-10,{U2}:1-4", f"MySQL56/{U2}:1-4,{U1}:1-10", True),
        (f"MySQL56/{U1}:1-10,{U2}:1-4", f"MySQL56/{U1}:2-3", True),
        # UUIDs compare case-insensitively.
        (f"MySQL56/{U1.upper()}:1-10", f"MySQL56/{U1}:1-10", True),
        # The empty position is contained in everything, and contains only itself.
        (f"MySQL56/{U1}:1", "", True),
        ("", f"MySQL56/{U1}:1", False),
        ("", "", True),
        ("MySQL56/", "", True),
        (f"MySQL56/{U1}:1", "MySQL56/", True),
    ],
)
def test_mysql56_containment(a: str, b: str, expected: bool) -> None:
    assert position_contains(a, b) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("MariaDB/0-1-100", "MariaDB/0-1-100", True),
        ("MariaDB/0-1-100", "MariaDB/0-1-101", False),
        # Server id does not order transactions; sequence per domain does.
        ("MariaDB/0-2-100", "MariaDB/0-1-90", True),
        ("MariaDB/0-1-100,1-1-5", "MariaDB/1-1-5,0-1-99", True),
        ("MariaDB/0-1-100,1-1-5", "MariaDB/0-1-99,1-1-6", False),
        # A domain missing from a.
        ("MariaDB/0-1-100", "MariaDB/0-1-1,2-1-1", False),
        ("MariaDB/0-1-100,2-1-1", "MariaDB/0-1-100", True),
    ],
)
def test_mariadb_containment(a: str, b: str, expected: bool) -> None:
    assert position_contains(a, b) is expected


def test_comparing_flavors_or_current_fails() -> None:
    with pytest.raises(InvalidVgtidError, match="cannot compare positions of different flavors"):
        position_contains(f"MySQL56/{U1}:1", "MariaDB/0-1-1")
    with pytest.raises(InvalidVgtidError, match="'current' is a request"):
        position_contains("current", f"MySQL56/{U1}:1")


def test_transactions_missing() -> None:
    assert transactions_missing(f"MySQL56/{U1}:1-5:8", f"MySQL56/{U1}:1-10,{U2}:1-3") == 4 + 3
    assert transactions_missing(f"MySQL56/{U1}:1-20", f"MySQL56/{U1}:1-10") == 0
    assert transactions_missing("MariaDB/0-1-90", "MariaDB/0-1-100,1-1-4") == 10 + 4
    assert transactions_missing("", "") == 0


# --- has_reached ---------------------------------------------------------------------------------


def _vg(*entries: tuple[str, str, str]) -> Vgtid:
    return Vgtid(tuple(ShardGtid(*e) for e in entries))


STOP = _vg(("customer", "-80", f"MySQL56/{U1}:1-10"), ("customer", "80-", f"MySQL56/{U2}:1-50"))


def test_has_reached_across_shards() -> None:
    both = _vg(("customer", "-80", f"MySQL56/{U1}:1-12"), ("customer", "80-", f"MySQL56/{U2}:1-50"))
    assert both.has_reached(STOP)
    one_behind = _vg(("customer", "-80", f"MySQL56/{U1}:1-12"), ("customer", "80-", f"MySQL56/{U2}:1-49"))
    assert not one_behind.has_reached(STOP)
    # Extra shards in self do not matter.
    extra = both.replace_shard(ShardGtid("commerce", "0", "MariaDB/0-1-1"))
    assert extra.has_reached(STOP)


def test_has_reached_missing_shard_is_false() -> None:
    only_one = _vg(("customer", "-80", f"MySQL56/{U1}:1-100"))
    assert not only_one.has_reached(STOP)


def test_has_reached_while_copying_is_false() -> None:
    reached = _vg(("customer", "-80", f"MySQL56/{U1}:1-12"), ("customer", "80-", f"MySQL56/{U2}:1-50"))
    copying = reached.replace_shard(
        ShardGtid("customer", "80-", f"MySQL56/{U2}:1-50", (TableLastPK("t", _lastpk(1)),))
    )
    assert not copying.has_reached(STOP)


def test_has_reached_rejects_unresolved_stop() -> None:
    with pytest.raises(InvalidVgtidError, match="is not a resolved position"):
        STOP.has_reached(Vgtid.for_keyspace("customer"))
    with pytest.raises(InvalidVgtidError, match="is not a resolved position"):
        STOP.has_reached(Vgtid.current("customer", ["-80"]))
    with pytest.raises(InvalidVgtidError, match="different flavors"):
        STOP.has_reached(_vg(("customer", "-80", "MariaDB/0-1-1")))
