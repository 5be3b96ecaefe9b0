"""MoveTables journals as a source shard's ``_vt.resharding_journal`` holds them (text written by
Vitess v0.23's ``journal.String()``, copied from a real cluster's table), and vtgate's plans."""

from __future__ import annotations

import json

from airflow_provider_vitess.exceptions import TablesMovedError, is_permanent
from airflow_provider_vitess.vstream.moves import TableMove, _first_keyspace, moves_in, parse_journal

MOVETABLES = (
    'id:6740760173349126720 tables:"corder" tables:"customer" local_position:"MariaDB/0-88243896-37" '
    'shard_gtids:{keyspace:"customer" shard:"0" gtid:"MariaDB/0-1755488953-76"} '
    'participants:{keyspace:"commerce" shard:"0"}'
)
RESHARD = (
    'id:8200191490597391617 migration_type:SHARDS tables:"/.*" local_position:"MariaDB/0-1755488953-84" '
    'shard_gtids:{keyspace:"customer" shard:"-80" gtid:"MariaDB/0-665530244-53"} '
    'shard_gtids:{keyspace:"customer" shard:"80-" gtid:"MariaDB/0-1852950556-50"} '
    'participants:{keyspace:"customer" shard:"0"}'
)


def test_a_movetables_journal_names_the_moved_tables_and_their_keyspace() -> None:
    journal = parse_journal(MOVETABLES)
    assert moves_in("commerce", ["customer", "corder", "product"], "0", journal) == [
        TableMove("customer", "customer", "0", "MariaDB/0-88243896-37"),
        TableMove("corder", "customer", "0", "MariaDB/0-88243896-37"),
    ]
    # Not this sync's tables, not this keyspace's shard: nothing moved for it.
    assert moves_in("commerce", ["product"], "0", journal) == []
    assert moves_in("commerce", ["customer"], "-80", journal) == []
    assert moves_in("other", ["customer"], "0", journal) == []


def test_a_reshard_journal_moves_no_table() -> None:
    journal = parse_journal(RESHARD)
    assert list(journal.tables) == ["/.*"] and len(journal.shard_gtids) == 2
    assert moves_in("customer", ["customer", "corder"], "0", journal) == []


def test_the_route_keyspace_is_read_from_vtgates_plan() -> None:
    route = '{\n\t"OperatorType": "Route",\n\t"Variant": "Unsharded",\n\t"Keyspace": {\n\t\t"Name": "customer",\n\t\t"Sharded": false\n\t},\n\t"Query": "select 1 from customer"\n}'  # noqa: E501
    assert _first_keyspace(json.loads(route)) == "customer"
    nested = {"OperatorType": "Limit", "Inputs": [{"OperatorType": "Route", "Keyspace": {"Name": "ks2"}}]}
    assert _first_keyspace(nested) == "ks2"
    assert _first_keyspace({"OperatorType": "Projection"}) is None


def test_a_move_is_permanent() -> None:
    assert is_permanent(TablesMovedError("moved"))
