"""The checkpoint store against real SQLite, MariaDB and PostgreSQL databases.

Every test runs on all three, each time in a fresh, empty database. The MariaDB and PostgreSQL
servers are started once per session (``databases.py``) and only when a test needs them; a
server that cannot start fails the tests with its log instead of skipping them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import OperationalError

from airflow_provider_vitess.checkpoints import (
    CheckpointStore,
    Part,
    Phase,
    WindowKind,
    WindowState,
    head_revision,
    schema,
)
from airflow_provider_vitess.checkpoints import parts as staged_parts
from airflow_provider_vitess.checkpoints.history import recent_windows
from airflow_provider_vitess.checkpoints.models import VERSION_TABLE, Base, SyncRow
from airflow_provider_vitess.exceptions import CheckpointError, SyncLockedError
from airflow_provider_vitess.vgtid import ShardGtid, TableLastPK, Vgtid
from tests.support.databases import DatabaseServer, start_mariadb, start_postgres
from tests.support.local import REPO

pytestmark = pytest.mark.integration

U1 = "16b1039f-22b6-11ed-b765-0a43f95f28a3"
SYNC = "commerce_to_delta"
TABLES = ["customer", "corder"]


def _vgtid(end: int, *, copying: bool = False) -> Vgtid:
    pks = (TableLastPK("customer", None),) if copying else ()
    return Vgtid(
        (
            ShardGtid("customer", "-80", f"MySQL56/{U1}:1-{end}", pks),
            ShardGtid("customer", "80-", f"MySQL56/{U1}:1-{end + 100}"),
        )
    )


SNAPSHOT_START = Vgtid.for_keyspace("customer", "")
END_1, END_2 = _vgtid(10), _vgtid(20)


def _part(name: str, rows: int = 5, digit: str = "a") -> Part:
    # ``detail`` is the stager's own description; it must come back exactly (nested JSON).
    detail = {"schema_json": '{"fields": []}', "op_counts": {"insert": rows}, "keyspaces": ["customer"]}
    return Part(f"s3://lake/staging/{SYNC}/{name}.parquet", "customer", rows, rows * 100, digit * 64, detail)


# ---------------------------------------------------------------------------------------------
# Fixtures: one server per session, one fresh database per test


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[DatabaseServer]:
    server = start_mariadb()
    print(f"mariadb started in {server.startup_seconds:.1f}s on port {server.port}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[DatabaseServer]:
    server = start_postgres()
    print(f"postgres started in {server.startup_seconds:.1f}s on port {server.port}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "mariadb", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'checkpoints.db'}"
    server: DatabaseServer = request.getfixturevalue(
        f"{'postgres' if request.param == 'postgresql' else 'mariadb'}_server"
    )
    return server.create_database()


@pytest.fixture
def empty_store(db_url: str) -> Iterator[CheckpointStore]:
    store = CheckpointStore(db_url)
    yield store
    store.close()


@pytest.fixture
def store(empty_store: CheckpointStore) -> CheckpointStore:
    empty_store.migrate()
    empty_store.ensure_sync(SYNC, "customer", TABLES, {"target": "s3://lake/customer"})
    return empty_store


class FakeClock:
    """Aware UTC time that only moves when told to: ages a lock without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def _run_concurrently(*calls: Callable[[], object]) -> list[object]:
    results: list[object] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


# ---------------------------------------------------------------------------------------------
# Schema


def test_migrate_is_idempotent_and_uses_its_own_version_table(empty_store: CheckpointStore) -> None:
    assert empty_store.schema_revision() is None
    assert empty_store.migrate() == head_revision() == "0007"
    assert empty_store.migrate() == "0007"
    with empty_store.engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        versions = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    assert names == {
        "vitess_sync_alembic_version",
        "vitess_sync_sync",
        "vitess_sync_window",
        "vitess_sync_window_part",
        "vitess_sync_table_progress",
        "vitess_sync_checkpoint",
        "vitess_sync_lock",
        "vitess_sync_target",
        "vitess_sync_window_version",
        "vitess_sync_window_group",
        "vitess_sync_group_progress",
    }
    assert versions == ["0007"]
    assert empty_store.schema_revision() == "0007"


def test_a_store_at_0004_with_a_snapshot_under_way_upgrades_and_resumes_it(
    empty_store: CheckpointStore,
) -> None:
    """A store of the previous release, a snapshot window with recorded parts in it, upgraded:
    its parts and resume position read as before (they belong to no group) and it records on."""
    from alembic import command

    with empty_store.engine.begin() as conn:
        config = schema.alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0004")
    assert empty_store.schema_revision() == "0004"
    old = Vgtid.from_json('[{"keyspace":"ks","shard":"-","gtid":""}]')
    at = Vgtid.from_json('[{"keyspace":"ks","shard":"-","gtid":"MariaDB/0-1-5"}]')
    with empty_store.engine.begin() as conn:  # what 0004's code wrote: no group_no column yet
        now = datetime(2026, 11, 28, 12)
        conn.execute(
            text(
                "INSERT INTO vitess_sync_sync (sync_id, keyspace, tables, config, created_at, updated_at) "
                "VALUES ('old', 'ks', '[\"t\"]', '{}', :now, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO vitess_sync_window (sync_id, seq, kind, state, start_vgtid, resume_vgtid, "
                "stats, created_at, updated_at) VALUES ('old', 1, 'snapshot', 'PLANNED', :start, :at, "
                "'{}', :now, :now)"
            ),
            {"start": old.to_json(), "at": at.to_json(), "now": now},
        )
        conn.execute(
            text(
                "INSERT INTO vitess_sync_window_part (sync_id, seq, part_no, path, table_name, row_count, "
                "byte_count, sha256, resume_vgtid, detail, created_at) VALUES ('old', 1, 1, 't/p1', "
                "'t', 10, 100, :sha, :at, '{}', :now)"
            ),
            {"sha": "a" * 64, "at": at.to_json(), "now": now},
        )
    assert empty_store.migrate() == "0007"
    assert [p.path for p in empty_store.parts("old", 1)] == ["t/p1"]
    assert empty_store.parts("old", 1, group=0) == []
    assert empty_store.resume_vgtid("old", 1) == at
    assert empty_store.window_groups("old", 1) == []
    later = Vgtid.from_json('[{"keyspace":"ks","shard":"-","gtid":"MariaDB/0-1-9"}]')
    part = Part(path="t/p2", table="t", rows=5, bytes=50, sha256="b" * 64, detail={})
    assert empty_store.record_parts("old", 1, [part], later, copied={"t": (15, Phase.COPYING)}) == 1
    assert [p.path for p in empty_store.parts("old", 1)] == ["t/p1", "t/p2"]
    assert empty_store.resume_vgtid("old", 1) == later
    assert [(p.table, p.rows_copied) for p in empty_store.progress("old", 1)] == [("t", 15)]


def test_a_store_at_0005_keeps_its_delta_versions_as_table_versions(empty_store: CheckpointStore) -> None:
    """Revision 0006 renames ``delta_version`` to ``table_version`` (the merge writes through a
    table format): the versions a store of the previous release recorded read as before, under
    the new name and, through the provider's reader, the old one; the downgrade renames back."""
    from alembic import command

    config = schema.alembic_config()
    with empty_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0005")
    now = datetime(2026, 12, 4, 12)
    with empty_store.engine.begin() as conn:  # what 0005's code wrote
        conn.execute(
            text(
                "INSERT INTO vitess_sync_sync (sync_id, keyspace, tables, config, created_at, updated_at) "
                "VALUES ('old', 'ks', '[\"t\", \"u\"]', '{}', :now, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO vitess_sync_target (sync_id, table_name, merged_seq, delta_version, updated_at) "
                "VALUES ('old', 't', 4, 17, :now), ('old', 'u', 4, NULL, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO vitess_sync_window_version (sync_id, seq, table_name, delta_version, path, "
                "merged_at) VALUES ('old', 4, 't', 17, '/lake/t', :now)"
            ),
            {"now": now},
        )
    assert empty_store.migrate() == "0007"
    targets = empty_store.target_versions("old")
    assert sorted((v.table, v.merged_seq, v.table_version, v.delta_version) for v in targets.values()) == [
        ("t", 4, 17, 17),
        ("u", 4, None, None),
    ]
    with empty_store.engine.connect() as conn:
        rows = conn.execute(text("SELECT table_name, table_version FROM vitess_sync_window_version")).all()
    assert [tuple(r) for r in rows] == [("t", 17)]
    with empty_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0005")
    with empty_store.engine.connect() as conn:
        back = conn.execute(
            text("SELECT delta_version FROM vitess_sync_target WHERE table_name = 't'")
        ).scalar()
    assert back == 17


def test_a_store_at_0006_keeps_its_versions_as_delta_and_records_formats_after(
    empty_store: CheckpointStore,
) -> None:
    """Revision 0007 records each window version's table format and Iceberg snapshot: a version
    recorded before it reads as Delta without a snapshot (its cut's SQL is Delta's, as before);
    one recorded after it keeps both; the downgrade drops them."""
    from alembic import command

    from airflow_provider_vitess.checkpoints.versions import TableCommit
    from airflow_provider_vitess.consistent_reads import consistent_cut, cut_sql

    config = schema.alembic_config()
    with empty_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
    # What 0006's code wrote: a committed snapshot window and its tables' versions.
    empty_store.ensure_sync("old", "ks", ["t", "u"], {})
    seq = empty_store.plan_window("old", WindowKind.SNAPSHOT, SNAPSHOT_START)
    empty_store.mark_staged("old", seq, END_1, "/stage/old/1/_manifest.json")
    empty_store.mark_merged("old", seq)
    empty_store.commit("old", seq)
    with empty_store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO vitess_sync_window_version (sync_id, seq, table_name, table_version, path, "
                "merged_at) VALUES ('old', 1, 't', 17, '/lake/t', :now), ('old', 1, 'u', 3, '/lake/u', :now)"
            ),
            {"now": datetime(2026, 12, 5, 12)},
        )
    assert empty_store.migrate() == "0007"
    taken = consistent_cut(empty_store, "old")
    assert {
        t: (v.version, v.recorded_format, v.table_format, v.snapshot_id) for t, v in taken.tables.items()
    } == {
        "t": (17, None, "delta", None),
        "u": (3, None, "delta", None),
    }
    assert cut_sql(taken)["t"] == "SELECT * FROM delta.`/lake/t` VERSION AS OF 17"
    # A window merged after the upgrade keeps its format and snapshot (a bigint: Iceberg's ids are).
    seq = empty_store.plan_window("old", WindowKind.CATCHUP, END_1, END_2)
    empty_store.mark_staged("old", seq, END_2, "/stage/old/2/_manifest.json")
    empty_store.mark_merged(
        "old",
        seq,
        {"t": 18},
        paths={"t": "/wh/ns/t"},
        commits={"t": TableCommit("iceberg", 9007199254740993)},
    )
    empty_store.commit("old", seq)
    latest = consistent_cut(empty_store, "old").tables["t"]
    assert (latest.version, latest.table_format, latest.snapshot_id) == (18, "iceberg", 9007199254740993)
    with empty_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0006")
    with empty_store.engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("vitess_sync_window_version")}
    assert not {"table_format", "snapshot_id"} & columns


def test_migrated_schema_matches_the_models(empty_store: CheckpointStore) -> None:
    empty_store.migrate()
    with empty_store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


_MIGRATE = """
import sys
from airflow_provider_vitess.checkpoints import CheckpointStore
store = CheckpointStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # the parent says go once both processes are ready: they start together
print(store.migrate())
"""


def test_two_processes_migrating_at_once_both_succeed(db_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE, db_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [(p.returncode, out.strip()) for p, (out, _) in zip(procs, outputs, strict=True)] == [
        (0, head_revision()),
        (0, head_revision()),
    ], "\n".join(err for _, err in outputs)
    store = CheckpointStore(db_url)
    assert store.schema_revision() == head_revision()
    store.close()


def _fail_upgrade(config: object, revision: str) -> None:
    raise OperationalError("CREATE TABLE vitess_sync_sync ...", {}, Exception("table already exists"))


def test_a_migration_error_after_another_process_finished_is_tolerated(
    empty_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_store.migrate()
    monkeypatch.setattr(schema.command, "upgrade", _fail_upgrade)
    assert empty_store.migrate() == "0007"


def test_a_migration_error_on_an_empty_database_is_raised_at_once(
    empty_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema.command, "upgrade", _fail_upgrade)
    began = time.monotonic()
    with pytest.raises(
        CheckpointError, match=r"migrating the checkpoint store at .* failed: .*already exists"
    ):
        empty_store.migrate()
    assert time.monotonic() - began < 5  # nobody else is migrating: no point waiting


# ---------------------------------------------------------------------------------------------
# Windows and the committed position


def test_happy_path_advances_the_committed_vgtid(store: CheckpointStore) -> None:
    assert store.committed(SYNC) == (None, 0)
    seq = store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
    assert seq == 1
    window = store.open_window(SYNC)
    assert window is not None
    assert (window.seq, window.state, window.kind) == (1, WindowState.PLANNED, WindowKind.SNAPSHOT)
    assert (window.start_vgtid, window.stop_vgtid, window.end_vgtid) == (SNAPSHOT_START, None, None)
    assert window.created_at is not None and window.created_at.tzinfo == timezone.utc

    store.mark_staged(SYNC, 1, END_1, "s3://lake/staging/1/manifest.json", {"events": 42, "bytes": 1000})
    assert store.window(SYNC, 1).state is WindowState.STAGED
    store.mark_staged(SYNC, 1, END_1, "s3://lake/staging/1/manifest.json")  # a retried task: no-op
    report = {"sync_id": SYNC, "windows": [{"seq": 1, "tables": []}]}
    store.mark_merged(SYNC, 1, report=report)
    store.mark_merged(SYNC, 1)  # Delta already had the txn version: no-op
    assert store.committed(SYNC) == (None, 0)  # merged is not committed
    # Kept beside the staging stats: a rerun from MERGED still knows what the merge changed.
    assert store.window(SYNC, 1).stats == {"events": 42, "bytes": 1000, "merge_report": report}
    assert store.commit(SYNC, 1) == END_1
    assert store.committed(SYNC) == (END_1, 1)
    assert store.commit(SYNC, 1) == END_1  # idempotent repeat
    assert store.open_window(SYNC) is None

    committed = store.window(SYNC, 1)
    assert committed.state is WindowState.COMMITTED
    assert committed.end_vgtid == END_1
    assert committed.manifest_path == "s3://lake/staging/1/manifest.json"
    assert committed.stats == {"events": 42, "bytes": 1000, "merge_report": report}

    assert store.plan_window(SYNC, "catchup", END_1, END_2) == 2
    store.mark_staged(SYNC, 2, END_2, "m2.json")
    store.mark_merged(SYNC, 2)
    store.commit(SYNC, 2)
    assert store.committed(SYNC) == (END_2, 2)
    assert store.window(SYNC, 2).stop_vgtid == END_2


def test_a_resnapshot_keeps_the_sync_position_and_catch_up_resumes_there(store: CheckpointStore) -> None:
    store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
    store.mark_staged(SYNC, 1, END_1, "m1.json")
    store.mark_merged(SYNC, 1)
    assert store.commit(SYNC, 1) == END_1
    # Re-snapshot of some tables: it ends later (END_2), but the other tables are at END_1.
    store.ensure_sync(SYNC, "customer", TABLES, {"staging": "s3://lake/staging"})
    assert store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START) == 2
    store.update_progress(SYNC, 2, "customer", phase="copied")
    store.mark_staged(SYNC, 2, END_2, "m2.json")
    store.mark_merged(SYNC, 2)
    assert store.commit(SYNC, 2) == END_1
    assert store.commit(SYNC, 2) == END_1  # idempotent repeat
    assert store.committed(SYNC) == (END_1, 2)
    # ...and the re-copied table's copy position, for the catch-ups that read END_1..END_2 again.
    assert store.sync_config(SYNC) == {
        "staging": "s3://lake/staging",
        "copied_at": {"customer": END_2.to_json()},
    }
    assert store.window(SYNC, 2).end_vgtid == END_2  # the window itself keeps what it read
    assert store.plan_window(SYNC, WindowKind.CATCHUP, END_1, END_2) == 3


def test_a_resnapshot_of_every_table_is_a_new_start(store: CheckpointStore) -> None:
    # The way out of a change no window can stage: copy every table again, and the stream
    # resumes at that copy's end, past the change.
    for seq, end in ((1, END_1), (2, END_2)):
        assert store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START) == seq
        for table in TABLES:
            store.update_progress(SYNC, seq, table, phase="copied")
        store.mark_staged(SYNC, seq, end, f"m{seq}.json")
        store.mark_merged(SYNC, seq)
        assert store.commit(SYNC, seq) == end
    assert store.committed(SYNC) == (END_2, 2)


def test_commit_before_merged_is_refused_and_the_checkpoint_stays(store: CheckpointStore) -> None:
    store.plan_window(SYNC, "snapshot", SNAPSHOT_START)
    with pytest.raises(CheckpointError) as refused:
        store.commit(SYNC, 1)
    assert str(refused.value) == (
        f"sync '{SYNC}' window 1: cannot go from PLANNED to COMMITTED (allowed from PLANNED: FAILED, STAGED)"
    )
    assert store.committed(SYNC) == (None, 0)

    store.mark_staged(SYNC, 1, END_1, "m1.json")
    store.mark_merged(SYNC, 1)
    store.commit(SYNC, 1)
    store.plan_window(SYNC, "catchup", END_1, END_2)
    store.mark_staged(SYNC, 2, END_2, "m2.json")
    with pytest.raises(CheckpointError, match="window 2: cannot go from STAGED to COMMITTED"):
        store.commit(SYNC, 2)
    assert store.committed(SYNC) == (END_1, 1)
    assert store.window(SYNC, 2).state is WindowState.STAGED

    with pytest.raises(CheckpointError, match=r"already STAGED with manifest 'm2\.json'"):
        store.mark_staged(SYNC, 2, END_2, "other.json")  # staged windows are immutable
    store.mark_merged(SYNC, 2)
    with pytest.raises(CheckpointError, match="cannot go from MERGED to FAILED"):
        store.mark_failed(SYNC, 2, "too late: the rows are in Delta")
    with pytest.raises(CheckpointError, match=f"sync '{SYNC}' has no window 7"):
        store.mark_merged(SYNC, 7)


def test_planning_while_a_window_is_open_is_refused(store: CheckpointStore) -> None:
    store.plan_window(SYNC, "snapshot", SNAPSHOT_START)
    with pytest.raises(CheckpointError) as refused:
        store.plan_window(SYNC, "snapshot", SNAPSHOT_START)
    assert str(refused.value) == (
        f"sync '{SYNC}': window 1 is PLANNED, not COMMITTED; resume it (open_window) instead of "
        "planning a new window"
    )
    store.mark_staged(SYNC, 1, END_1, "m1.json")
    with pytest.raises(CheckpointError, match="window 1 is STAGED, not COMMITTED"):
        store.plan_window(SYNC, "catchup", END_1)
    open_window = store.open_window(SYNC)
    assert open_window is not None and (open_window.seq, open_window.state) == (1, WindowState.STAGED)

    store.mark_failed(SYNC, 1, "manifest lost")
    assert store.open_window(SYNC) is None
    assert store.window(SYNC, 1).error == "manifest lost"
    assert store.plan_window(SYNC, "snapshot", SNAPSHOT_START) == 2  # seqs are never reused
    store.mark_staged(SYNC, 2, END_1, "m2.json")
    store.mark_merged(SYNC, 2)
    store.commit(SYNC, 2)
    with pytest.raises(
        CheckpointError, match="catch-up window must start at the committed VGTID of window 2"
    ):
        store.plan_window(SYNC, "catchup", END_2)
    with pytest.raises(CheckpointError, match="unknown sync 'nope'"):
        store.plan_window("nope", "snapshot", SNAPSHOT_START)


def test_catch_up_windows_chain_after_staged_ones_and_are_discarded_together(store: CheckpointStore) -> None:
    # A backlog read as several windows by one run: each starts where the STAGED one before it ends.
    end_3 = _vgtid(30)
    store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
    store.mark_staged(SYNC, 1, END_1, "m1.json")
    store.mark_merged(SYNC, 1)
    store.commit(SYNC, 1)
    assert store.next_catchup_start(SYNC) == END_1
    assert store.plan_window(SYNC, "catchup", END_1, end_3) == 2
    with pytest.raises(CheckpointError, match="window 2 is PLANNED, not COMMITTED"):
        store.plan_window(SYNC, "catchup", END_1, end_3)  # a PLANNED window is resumed, not followed
    store.mark_staged(SYNC, 2, END_2, "m2.json")
    assert store.next_catchup_start(SYNC) == END_2
    with pytest.raises(CheckpointError, match=r"after STAGED window 2 must start at its end"):
        store.plan_window(SYNC, "catchup", END_1, end_3)  # an overlap
    with pytest.raises(CheckpointError, match="window 2 is STAGED, not COMMITTED"):
        store.plan_window(SYNC, "snapshot", SNAPSHOT_START)  # only catch-ups chain
    assert store.plan_window(SYNC, "catchup", END_2, end_3) == 3
    store.mark_staged(SYNC, 3, end_3, "m3.json")
    assert [(w.seq, w.state) for w in store.open_windows(SYNC)] == [
        (2, WindowState.STAGED),
        (3, WindowState.STAGED),
    ]
    assert store.open_window(SYNC).seq == 3  # type: ignore[union-attr]

    # Losing window 2 loses the chain after it (window 3 starts where 2 ends): one transaction.
    assert store.discard_unmerged(SYNC, "lost", from_seq=2) == [2, 3]
    assert store.open_windows(SYNC) == []
    assert store.next_catchup_start(SYNC) == END_1
    assert store.plan_window(SYNC, "catchup", END_1, end_3) == 4

    # Committed in order; a MERGED window is never discarded (its rows are in Delta).
    store.mark_staged(SYNC, 4, END_2, "m4.json")
    store.plan_window(SYNC, "catchup", END_2, end_3)
    store.mark_staged(SYNC, 5, end_3, "m5.json")
    store.mark_merged(SYNC, 4)
    with pytest.raises(CheckpointError, match="window 4 is MERGED: it cannot be discarded"):
        store.discard_unmerged(SYNC, "re-snapshot")
    assert store.window(SYNC, 5).state is WindowState.STAGED  # nothing changed
    with pytest.raises(CheckpointError, match="window 4 is MERGED, not COMMITTED"):
        store.plan_window(SYNC, "catchup", end_3, end_3)
    store.commit(SYNC, 4)
    store.mark_merged(SYNC, 5)
    assert store.commit(SYNC, 5) == end_3
    assert store.committed(SYNC) == (end_3, 5)


def test_racing_planners_get_one_window(store: CheckpointStore) -> None:
    other = CheckpointStore(engine=store.engine)
    results = _run_concurrently(
        lambda: store.plan_window(SYNC, "snapshot", SNAPSHOT_START),
        lambda: other.plan_window(SYNC, "snapshot", SNAPSHOT_START),
    )
    assert sorted(map(type, results), key=lambda t: t.__name__) == [CheckpointError, int]
    assert 1 in results
    error = next(r for r in results if isinstance(r, CheckpointError))
    assert "window 1 is PLANNED" in str(error)


def test_ensure_sync_updates_tables_but_never_the_keyspace(store: CheckpointStore) -> None:
    store.ensure_sync(SYNC, "customer", [*TABLES, "product"], {"target": "s3://lake/v2"})
    with store.engine.connect() as conn:
        row = conn.execute(select(SyncRow.keyspace, SyncRow.tables, SyncRow.config)).one()
    assert tuple(row) == ("customer", [*TABLES, "product"], {"target": "s3://lake/v2"})
    with pytest.raises(CheckpointError, match="belongs to keyspace 'customer', not 'commerce'"):
        store.ensure_sync(SYNC, "commerce", TABLES, {})


# ---------------------------------------------------------------------------------------------
# Parts and resume positions


def test_record_parts_keeps_parts_and_the_resume_position_together(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.plan_window(SYNC, "snapshot", SNAPSHOT_START)
    assert store.resume_vgtid(SYNC, 1) is None
    resume_1, resume_2 = _vgtid(3, copying=True), _vgtid(5, copying=True)

    assert store.record_parts(SYNC, 1, [_part("p1"), _part("p2", 7)], resume_1) == 2
    assert store.parts(SYNC, 1) == [_part("p1"), _part("p2", 7)]
    assert store.resume_vgtid(SYNC, 1) == resume_1

    # A retried batch repeats p2 exactly: kept once, the new part and position are recorded.
    assert store.record_parts(SYNC, 1, [_part("p2", 7), _part("p3", 1)], resume_2) == 1
    assert store.parts(SYNC, 1) == [_part("p1"), _part("p2", 7), _part("p3", 1)]
    assert store.resume_vgtid(SYNC, 1) == resume_2

    # A different file under a known path: the whole batch is refused, p4 included.
    with pytest.raises(CheckpointError, match=re.escape(f"part '{_part('p1').path}'")):
        store.record_parts(SYNC, 1, [_part("p4"), _part("p1", digit="b")], _vgtid(9))

    # The database fails after the parts were inserted: they roll back with the position.
    def fail(*args: object) -> None:
        raise RuntimeError("connection lost")

    monkeypatch.setattr(staged_parts, "set_resume", fail)
    with pytest.raises(RuntimeError, match="connection lost"):
        store.record_parts(SYNC, 1, [_part("p5")], _vgtid(9))
    monkeypatch.undo()
    assert store.parts(SYNC, 1) == [_part("p1"), _part("p2", 7), _part("p3", 1)]
    assert store.resume_vgtid(SYNC, 1) == resume_2

    store.mark_staged(SYNC, 1, END_1, "m1.json")
    with pytest.raises(CheckpointError, match="window 1 is STAGED: parts can only be recorded while PLANNED"):
        store.record_parts(SYNC, 1, [_part("p6")], END_1)


# ---------------------------------------------------------------------------------------------
# Progress


def test_progress_fields_update_independently(store: CheckpointStore) -> None:
    store.plan_window(SYNC, "snapshot", SNAPSHOT_START)
    store.update_progress(SYNC, 1, "customer", rows_copied=10)
    [first] = store.progress(SYNC, 1)
    assert (first.table, first.rows_known, first.rows_copied, first.phase) == (
        "customer",
        None,
        10,
        Phase.COPYING,
    )
    assert first.percent is None  # count(*) has not arrived yet

    store.update_progress(SYNC, 1, "customer", rows_known=40)  # the count arrives later
    store.update_progress(SYNC, 1, "corder", rows_known=5_000_000_000, phase="copying")
    customer, corder = sorted(store.progress(SYNC, 1), key=lambda p: p.table, reverse=True)
    assert (customer.rows_known, customer.rows_copied, customer.percent) == (40, 10, 25.0)
    assert (corder.rows_known, corder.rows_copied, corder.percent) == (5_000_000_000, 0, 0.0)

    store.update_progress(
        SYNC, 1, "customer", rows_copied=41, phase=Phase.COPIED, key_columns=["id"], key_source="primary key"
    )
    customer = next(p for p in store.progress(SYNC, 1) if p.table == "customer")
    assert (customer.rows_copied, customer.phase, customer.percent) == (41, Phase.COPIED, 100.0)
    assert (customer.key_columns, customer.key_source) == (["id"], "primary key")
    assert customer.updated_at.tzinfo == timezone.utc
    assert [p.table for p in store.progress(SYNC, 1)] == ["corder", "customer"]

    with pytest.raises(CheckpointError, match=f"sync '{SYNC}' has no window 9"):
        store.update_progress(SYNC, 9, "customer", rows_copied=1)
    with pytest.raises(ValueError, match="'paused' is not a valid Phase"):
        store.update_progress(SYNC, 1, "customer", phase="paused")


# ---------------------------------------------------------------------------------------------
# The lock


def test_a_second_holder_is_refused_with_the_first_holders_name(store: CheckpointStore) -> None:
    first = "dag=vitess_sync run=scheduled__2026-01-02 try=1"
    with store.lock(SYNC, first) as held:
        held.heartbeat()
        with pytest.raises(SyncLockedError) as refused:
            store.acquire_lock(SYNC, "dag=vitess_sync run=manual__x try=1")
        message = str(refused.value)
        assert f"sync '{SYNC}' is locked by '{first}' since " in message
        assert "'dag=vitess_sync run=manual__x try=1' cannot take it" in message
        info = store.lock_holder(SYNC)
        assert info is not None and info.holder == first
        assert info.acquired_at.isoformat() in message
    assert store.lock_holder(SYNC) is None


def test_a_stale_lock_is_taken_over(store: CheckpointStore) -> None:
    clock = FakeClock()
    timed = CheckpointStore(engine=store.engine, clock=clock)
    stale_after = timedelta(minutes=10)
    old = timed.acquire_lock(SYNC, "worker-a", stale_after)
    acquired_at = clock.now

    clock.now += timedelta(minutes=9)
    with pytest.raises(SyncLockedError, match="locked by 'worker-a'"):
        timed.acquire_lock(SYNC, "worker-b", stale_after)
    old.heartbeat()  # keeps it fresh for another 10 minutes
    clock.now += timedelta(minutes=9)
    with pytest.raises(SyncLockedError, match="locked by 'worker-a'"):
        timed.acquire_lock(SYNC, "worker-b", stale_after)

    clock.now += timedelta(minutes=11)  # worker-a stopped heartbeating
    new = timed.acquire_lock(SYNC, "worker-b", stale_after)
    info = timed.lock_holder(SYNC)
    assert info is not None
    assert (info.holder, info.acquired_at, info.heartbeat_at) == ("worker-b", clock.now, clock.now)
    assert info.acquired_at != acquired_at

    with pytest.raises(SyncLockedError, match=r"'worker-a' lost its lock: .* locked by 'worker-b'"):
        old.heartbeat()
    assert old.release() is False  # never deletes the new holder's lock
    assert timed.lock_holder(SYNC) is not None
    assert new.release() is True
    assert timed.lock_holder(SYNC) is None


def test_racing_takers_of_a_stale_lock_get_one_winner(store: CheckpointStore) -> None:
    clock = FakeClock()
    timed = CheckpointStore(engine=store.engine, clock=clock)
    timed.acquire_lock(SYNC, "dead-worker", timedelta(minutes=1))
    clock.now += timedelta(minutes=5)
    results = _run_concurrently(
        *(lambda i=i: timed.acquire_lock(SYNC, f"taker-{i}", timedelta(minutes=1)) for i in range(3))
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, SyncLockedError) for r in results if r not in winners)
    info = timed.lock_holder(SYNC)
    assert info is not None and info.holder == winners[0].holder  # type: ignore[attr-defined]


def test_the_lock_is_released_when_the_block_raises(store: CheckpointStore) -> None:
    with pytest.raises(RuntimeError, match="merge failed"), store.lock(SYNC, "worker-a"):
        assert store.lock_holder(SYNC) is not None
        raise RuntimeError("merge failed")
    assert store.lock_holder(SYNC) is None
    with store.lock(SYNC, "worker-b"):
        info = store.lock_holder(SYNC)
        assert info is not None and info.holder == "worker-b"


def test_writes_under_a_lock_that_was_taken_over_are_refused_in_their_own_transaction(
    store: CheckpointStore,
) -> None:
    # A holder that stalled past the lock's expiry (no heartbeat) wakes after another took the
    # sync over: each of its writes is refused, and nothing of it is stored.
    clock = FakeClock()
    stalled, taker = (CheckpointStore(engine=store.engine, clock=clock) for _ in range(2))
    stale_after = timedelta(minutes=10)
    with stalled.lock(SYNC, "worker-a", stale_after):
        seq = stalled.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
        stalled.record_parts(SYNC, seq, [_part("p1")], END_1)
        clock.now += timedelta(minutes=11)
        with taker.lock(SYNC, "worker-b", stale_after):
            refused = r"'worker-a' lost its lock: sync '.*' is locked by 'worker-b'.*its {} was refused"
            with pytest.raises(SyncLockedError, match=refused.format("staged parts")):
                stalled.record_parts(SYNC, seq, [_part("p2", digit="b")], END_2)
            with pytest.raises(SyncLockedError, match=refused.format("progress")):
                stalled.update_progress(SYNC, seq, "customer", rows_copied=99)
            with pytest.raises(SyncLockedError, match=refused.format("STAGED mark")):
                stalled.mark_staged(SYNC, seq, END_2, "s3://lake/staging/m.json")
            assert [p.path for p in taker.parts(SYNC, seq)] == [_part("p1").path]
            window = taker.window(SYNC, seq)
            assert (window.state, window.resume_vgtid) == (WindowState.PLANNED, END_1)
            assert taker.progress(SYNC, seq) == []
            # The holder now writes as usual; each write also refreshes its heartbeat.
            clock.now += timedelta(minutes=1)
            taker.record_parts(SYNC, seq, [_part("p2", digit="b")], END_2)
            info = taker.lock_holder(SYNC)
            assert info is not None and (info.holder, info.heartbeat_at) == ("worker-b", clock.now)
        assert stalled.lock_holder(SYNC) is None  # released by its holder only


def test_a_sync_copied_from_the_sqlite_default_into_another_database_goes_on_there(
    empty_store: CheckpointStore, tmp_path: Path
) -> None:
    """The documented move of a store (``store_copy``): every window, part, progress, target
    and the checkpoint arrive unchanged, the next window is numbered after them, and a second
    copy is refused without writing."""
    from airflow_provider_vitess.checkpoints.transfer import copy_syncs

    old = CheckpointStore(f"sqlite:///{tmp_path / 'vitess_sync.db'}")
    old.migrate()
    old.ensure_sync(SYNC, "customer", TABLES, {"target": "s3://lake/customer"})
    old.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
    old.update_progress(SYNC, 1, "customer", phase=Phase.COPIED, rows_copied=7, rows_known=7)
    old.record_parts(SYNC, 1, [_part("customer/part-0.parquet")], _vgtid(5, copying=True))
    old.mark_staged(SYNC, 1, END_1, "m1.json", {"events": 7})
    old.mark_merged(SYNC, 1, targets={"customer": 3, "corder": None})
    old.commit(SYNC, 1)
    old.plan_window(SYNC, WindowKind.CATCHUP, END_1, END_2)
    old.ensure_sync("other", "commerce", ["product"], {})

    counts = copy_syncs(old, empty_store, [SYNC])
    assert counts["vitess_sync_sync"] == 1 and counts["vitess_sync_window"] == 2
    assert counts["vitess_sync_window_part"] == 1 and counts["vitess_sync_table_progress"] == 1
    new = empty_store
    assert new.committed(SYNC) == (END_1, 1)
    assert new.window(SYNC, 1) == old.window(SYNC, 1)
    assert new.parts(SYNC, 1) == old.parts(SYNC, 1)
    assert new.progress(SYNC, 1) == old.progress(SYNC, 1)
    assert new.target_versions(SYNC) == old.target_versions(SYNC)
    assert new.sync_config(SYNC) == old.sync_config(SYNC)
    open_window = new.open_window(SYNC)
    assert open_window is not None and (open_window.seq, open_window.state) == (2, WindowState.PLANNED)
    with pytest.raises(CheckpointError, match=r"already holds sync\(s\) \['commerce_to_delta'\]"):
        copy_syncs(old, new, [SYNC])
    assert new.committed("other") == (None, 0)  # not asked for: not copied
    with pytest.raises(CheckpointError, match=r"holds no sync \['nope'\]"):
        copy_syncs(old, new, ["nope"])
    old.close()


def test_old_windows_records_are_pruned_but_each_tables_latest_progress_stays(store: CheckpointStore) -> None:
    store.plan_window(SYNC, WindowKind.SNAPSHOT, SNAPSHOT_START)
    for table in TABLES:
        store.update_progress(
            SYNC, 1, table, phase=Phase.COPIED, key_columns=["id"], key_source="primary key"
        )
    store.record_parts(SYNC, 1, [_part("customer/part-0.parquet")], _vgtid(5, copying=True))
    store.mark_staged(SYNC, 1, END_1, "m1.json")
    store.mark_merged(SYNC, 1)
    store.commit(SYNC, 1)
    end = END_1
    for seq in range(2, 16):
        store.plan_window(SYNC, WindowKind.CATCHUP, end, _vgtid(10_000))
        store.update_progress(SYNC, seq, "customer", phase=Phase.STREAMING)  # corder: quiet
        end = _vgtid(10 + seq)
        store.mark_staged(SYNC, seq, end, f"m{seq}.json")
        store.mark_merged(SYNC, seq)
        store.commit(SYNC, seq)
    store.plan_window(SYNC, WindowKind.CATCHUP, end, _vgtid(10_000))  # open: never pruned

    assert store.prune_windows(SYNC, keep=5) == list(range(2, 12))
    kept = sorted(w.seq for w in recent_windows(store.engine, SYNC, 100))
    assert kept == [1, 12, 13, 14, 15, 16]  # corder's latest progress is window 1's
    assert {p.table for p in store.progress(SYNC, 1)} == set(TABLES)
    assert store.parts(SYNC, 1) != []
    assert store.committed(SYNC) == (end, 15)
    assert store.prune_windows(SYNC, keep=5) == []
