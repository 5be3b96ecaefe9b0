"""A row moved between shards whose primaries' clocks disagree, split by a window stop.

vtgate moves a row as a DELETE on one shard and an INSERT on the other, two commits
milliseconds apart; a window's stop can fall between them (the INSERT in one window, the DELETE
in the next), and the merge of the DELETE's window then needs the INSERT from the window before
(``merge/job/lookback.py``). Here the DELETE's shard stamps its commits 30 s ahead of the
other's: the two halves are written on the shards' own databases of the cluster's MariaDB, in
the order vtgate writes them (the DELETE first), the DELETE in a session with ``SET TIMESTAMP``
30 s ahead (its binlog events carry that time; no system clock is touched). Merged, the Delta
table must equal ``SELECT *`` through vtgate: the row is on its new shard.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.staging import Manifest, read_table
from tests.support import merge_workload as wl
from tests.support.delta_check import source_rows, spark_session
from tests.support.group_workload import create_orders
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

TABLE = "skew_orders"
SHARDS = ("-80", "80-")
SKEW = 30  # seconds the DELETE's shard is ahead: far past the look-back's few seconds


def _mariadb(vitess: LocalVitess, sql: str) -> str:
    """A statement on the cluster's MariaDB itself (bypassing vtgate), as vt_dba on its socket:
    dev/local_vitess.sh keeps it in the state directory that also holds the cluster's CA."""
    sockets = sorted((Path(vitess.tls_ca).parent.parent / "data").glob("vt_*/mysql.sock"))
    assert sockets, f"no MariaDB socket under {Path(vitess.tls_ca).parent.parent / 'data'}"
    out = subprocess.run(
        ["mariadb", "-S", str(sockets[0]), "-u", "vt_dba", "-N", "-e", sql],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _db(shard: str) -> str:
    """The shard's database in the cluster's MariaDB (vttestserver keeps each shard in one)."""
    return f"`vt_customer_{shard}`"


def _events(manifest: Manifest, key: int) -> list[tuple[str, str, int]]:
    """(shard, op, commit second) of ``key``'s staged rows in a window."""
    rows = sorted(read_table(manifest, TABLE).to_pylist(), key=lambda r: r["_seq"])
    return [
        (r["_shard"], r["_op"], r["_commit_ts"])
        for r in rows
        if key in (r["order_id"], r.get("_before_order_id"))
    ]


def test_a_move_split_by_a_stop_keeps_its_row_when_the_delete_shard_clock_is_ahead(
    vitess: LocalVitess, tmp_path: Path
) -> None:
    hook = wl.hook_for(vitess, "vitess_skew")
    create_orders(hook, f"customer.{TABLE}", range(1, 9))
    held = {s: _mariadb(vitess, f"SELECT order_id FROM {_db(s)}.{TABLE}").split() for s in SHARDS}
    assert held["-80"] and held["80-"], held  # both shards hold rows (hash of customer_id 1..8)
    key, new_customer = int(held["-80"][0]), int(held["80-"][0])  # order_id == customer_id at the start

    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync = wl.new_sync(hook, store, tmp_path / "stage", f"skew-{uuid.uuid4().hex[:8]}", "customer", [TABLE])
    sync.capture(snapshot=True)

    def move() -> None:
        # The DELETE's shard first (as vtgate commits a move), its clock SKEW seconds ahead.
        _mariadb(
            vitess,
            f"SET TIMESTAMP = {int(time.time()) + SKEW}; "
            f"DELETE FROM {_db('-80')}.{TABLE} WHERE order_id = {key}",
        )
        _mariadb(
            vitess,
            f"INSERT INTO {_db('80-')}.{TABLE} (order_id, customer_id, note) "
            f"VALUES ({key}, {new_customer}, 'moved')",
        )

    first = sync.capture_split(move, early_shard="-80")  # the INSERT here, the DELETE next
    second = sync.capture()
    # The condition: the halves in two windows, the DELETE stamped SKEW seconds after the INSERT.
    (inserted,) = _events(first, key)
    (deleted,) = _events(second, key)
    assert inserted[:2] == ("80-", "insert") and deleted[:2] == ("-80", "delete"), (inserted, deleted)
    assert deleted[2] - inserted[2] >= SKEW - 2, (inserted, deleted)

    merge(spark_session(), sync.plan(tmp_path / "delta"))
    want = source_rows(hook, "customer", TABLE)
    assert (key, new_customer, "moved") in want
    delta = spark_session().read.format("delta").load(str(tmp_path / "delta" / TABLE))
    got = {tuple(r) for r in delta.collect()}
    assert got == want, f"missing {sorted(want - got)}, extra {sorted(got - want)}"
