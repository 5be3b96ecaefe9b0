"""Which tables a killed snapshot's rerun may skip: copied on *every* shard up to the checkpoint.

vttablet copies a shard's tables one at a time in sorted order, each shard on its own schedule;
the rerun's ``tables_to_copy`` applies to all shards at once, so a table one shard finished and
another has not begun must stay in it (else that shard's rows of it are never copied).
"""

from __future__ import annotations

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.vgtid import ShardGtid, TableLastPK, Vgtid
from airflow_provider_vitess.vstream.copy_state import CopiedTables

KS = "customer"


SHARDS = {"lo": "-80", "hi": "80-"}
LASTPK = query_pb2.QueryResult(rows=[query_pb2.Row(lengths=[1], values=b"7")]).SerializeToString()


def at(**shards: tuple[str, str | None]) -> Vgtid:
    """A position: lo (-80) / hi (80-) -> (gtid, the table it names in copy, or None)."""
    entries = []
    for name, (gtid, table) in shards.items():
        pks = (TableLastPK(table, LASTPK),) if table else ()
        entries.append(ShardGtid(KS, SHARDS[name], gtid, pks))
    return Vgtid(tuple(entries))


def test_a_table_one_shard_finished_is_not_copied_while_another_shard_has_not_started() -> None:
    copied = CopiedTables(["a", "b"])
    assert copied.at(at(lo=("MariaDB/0-1-5", "a"), hi=("", None))) == set()
    # lo moved on to b: a is over there, but hi has sent no position at all yet.
    assert copied.at(at(lo=("MariaDB/0-1-9", "b"), hi=("", None))) == set()
    # hi has a position but names no table: it may be about to start a (vttablet names the
    # position before a table's first rows), so nothing is known copied there.
    assert copied.at(at(lo=("MariaDB/0-1-9", "b"), hi=("MariaDB/0-2-3", None))) == set()


def test_a_table_is_copied_once_every_shard_is_past_it() -> None:
    copied = CopiedTables(["a", "b", "c"])
    assert copied.at(at(lo=("MariaDB/0-1-9", "b"), hi=("MariaDB/0-2-4", "a"))) == set()
    assert copied.at(at(lo=("MariaDB/0-1-9", "c"), hi=("MariaDB/0-2-7", "b"))) == {"a"}
    assert copied.at(at(lo=("MariaDB/0-1-9", "c"), hi=("MariaDB/0-2-8", "c"))) == {"a", "b"}


def test_a_table_named_in_copy_and_named_no_more_is_over_on_that_shard() -> None:
    copied = CopiedTables(["a", "b"])
    copied.at(at(lo=("MariaDB/0-1-5", "a"), hi=("MariaDB/0-2-5", "b")))
    # lo finished a and has not named b yet (between tables); hi is past a.
    assert copied.at(at(lo=("MariaDB/0-1-6", None), hi=("MariaDB/0-2-6", "b"))) == {"a"}
    # lo never named b (empty on lo, or not begun): b is not known copied there.
    assert copied.at(at(lo=("MariaDB/0-1-8", None), hi=("MariaDB/0-2-8", None))) == {"a"}
    copied.at(at(lo=("MariaDB/0-1-9", "b"), hi=("MariaDB/0-2-8", None)))
    assert copied.at(at(lo=("MariaDB/0-1-10", None), hi=("MariaDB/0-2-9", None))) == {"a", "b"}


def test_tables_an_earlier_run_found_copied_stay_copied_and_only_copying_tables_are_inferred() -> None:
    # The rerun copies b and d only (a and c were copied everywhere before the kill).
    copied = CopiedTables(["b", "d"], copied={"a", "c"})
    assert copied.at(at(lo=("", None), hi=("", None))) == {"a", "c"}
    assert copied.at(at(lo=("MariaDB/0-1-9", "d"), hi=("MariaDB/0-2-9", "d"))) == {"a", "b", "c"}
