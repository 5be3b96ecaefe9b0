"""Partial binlog row images on a real cluster whose MariaDB logs ``binlog_row_image=NOBLOB``.

The module starts a second local cluster (``dev/local_vitess.sh`` with an extra my.cnf, its own
ports and state directory) so that the setting is the server's, as in production, and no other
test module sees it. Under NOBLOB an UPDATE's after image leaves out the BLOB/TEXT/JSON columns
the statement did not set, and vtgate says so (``RowChange.data_columns``). Before, the staging
and the MERGE wrote those columns as NULL. Now such an update changes only the columns it
carries, in the snapshot's copy (updates streamed while the copy runs) and in catch-up windows:
Delta == ``SELECT *``. What cannot be applied exactly is refused: MINIMAL images at the start of
the sync (the server setting) and when read (a connection that still logs them), and a key
change whose image leaves columns out.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.capture.row_images import row_image_settings
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.exceptions import BinlogSettingsError, PartialRowImageError
from airflow_provider_vitess.merge.job.run import merge
from airflow_provider_vitess.merge.runner import MergeRunner
from airflow_provider_vitess.staging import Manifest, read_table
from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import REPO, LocalVitess, cluster_from_env, machine_lock
from tests.support.mode_oracles import assert_history, delta_dicts, source_dicts

pytestmark = pytest.mark.integration

TABLE = "noblob_docs"
# Copied after TABLE (vttablet copies a shard's tables one by one, in name order): while FILL is
# copied, updates of TABLE are streamed as binlog events of the snapshot's window, at the latest
# in the catch-up before TAIL's copy.
FILL, TAIL = "noblob_fill", "noblob_tail"
ROWS = 2_000
FILL_ROWS = 150_000
BATCH = 5_000


class Noblob:
    """The second cluster: its vtgate, and its mysqld for the server settings."""

    def __init__(self, vitess: LocalVitess, state: Path) -> None:
        self.vitess = vitess
        self.socket = state / "data" / "vt_0000000001" / "mysql.sock"

    def mysqld(self, sql: str) -> str:
        """A statement on the cluster's MariaDB itself (its socket, as vt_dba)."""
        out = subprocess.run(
            ["mariadb", "-S", str(self.socket), "-u", "vt_dba", "-N", "-e", sql],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def set_row_image(self, value: str) -> None:
        """The global setting, and vttablet's idle pool connections closed: a session takes the
        global value when it connects, so the tablets' next connections log with it."""
        self.mysqld(f"SET GLOBAL binlog_row_image = '{value}'")
        for pid in self.mysqld(
            "SELECT id FROM information_schema.processlist WHERE command = 'Sleep' AND id <> CONNECTION_ID()"
        ).split():
            subprocess.run(
                ["mariadb", "-S", str(self.socket), "-u", "vt_dba", "-e", f"KILL {pid}"],
                check=False,
                capture_output=True,
            )


@pytest.fixture(scope="module")
def noblob() -> Iterator[Noblob]:
    base = int(os.environ.get("VITESS_BASE_PORT", "15300")) + 20
    tmp = Path(tempfile.gettempdir())
    state = tmp / "airflow-provider-vitess-noblob"
    cnf = tmp / "airflow-provider-vitess-noblob.cnf"
    cnf.write_text("[mysqld]\nbinlog_row_image = NOBLOB\n")
    cnf.chmod(0o644)  # read by the cluster's own user
    env = {
        **os.environ,
        "VITESS_BASE_PORT": str(base),
        "VITESS_STATE_DIR": str(state),
        "VITESS_EXTRA_MY_CNF": str(cnf),
    }
    script = str(REPO / "dev" / "local_vitess.sh")
    with machine_lock("vitess-noblob"):
        out = subprocess.run([script, "start"], env=env, check=True, capture_output=True, text=True).stdout
        try:
            yield Noblob(cluster_from_env(out), state)
        finally:
            subprocess.run([script, "stop"], env=env, check=False, capture_output=True)


def _table(hook: Any, rows: int) -> None:
    wl.create_sharded_table(
        hook,
        TABLE,
        "(id BIGINT NOT NULL PRIMARY KEY, cid BIGINT NOT NULL, n INT, note TEXT, body BLOB, doc JSON) "
        "DEFAULT CHARSET=utf8mb4",
        "cid",
    )
    for start in range(1, rows + 1, BATCH):
        _insert(hook, range(start, min(start + BATCH, rows + 1)))


def _insert(hook: Any, ids: range | list[int], tag: str = "") -> None:
    values = ", ".join(
        f"({i}, {i % 7 + 1}, 0, 'note {i}{tag}', X'{(f'body {i}{tag}').encode().hex()}', "
        f'\'{{"id": {i}, "tag": "{tag}"}}\')'
        for i in ids
    )
    wl.execute(hook, f"INSERT INTO customer.{TABLE} (id, cid, n, note, body, doc) VALUES {values}")


def _fill_tables(hook: Any) -> None:
    for name, rows in ((FILL, FILL_ROWS), (TAIL, 10)):
        wl.create_sharded_table(
            hook, name, "(id BIGINT NOT NULL PRIMARY KEY, cid BIGINT NOT NULL, v INT)", "cid"
        )
        for start in range(1, rows + 1, 20_000):
            values = ", ".join(
                f"({i}, {i % 7 + 1}, {i})" for i in range(start, min(start + 20_000, rows + 1))
            )
            wl.execute(hook, f"INSERT INTO customer.{name} (id, cid, v) VALUES {values}")


def _sync(hook: Any, tmp_path: Path, tables: tuple[str, ...] = (TABLE,)) -> tuple[wl.Sync, CheckpointStore]:
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    store.migrate()  # the test reads the snapshot's progress while it runs
    sync_id = f"noblob-{uuid.uuid4().hex[:8]}"
    spec = SyncSpec(sync_id, "customer", tables, str(tmp_path / "stage"))
    runner = CaptureRunner(hook, store, spec, holder="test-noblob")
    return wl.Sync(sync_id, "customer", tables, runner, store), store


def _partial_rows(manifest: Manifest) -> int:
    """Staged rows whose after image left columns out."""
    return sum(1 for r in read_table(manifest, TABLE).column("_absent").to_pylist() if r)


def _snapshot_with_updates_during_the_copy(sync: wl.Sync, store: CheckpointStore, hook: Any) -> Manifest:
    """A snapshot during whose copy of FILL the rows of TABLE, copied already, are updated: the
    window streams those updates after the copied rows (NOBLOB images)."""
    outcome: list[Any] = []
    thread = threading.Thread(
        target=lambda: outcome.append(sync.runner.snapshot(checkpoint_every_rows=BATCH))
    )
    thread.start()
    deadline = time.monotonic() + 300
    while not any(p.table == FILL and (p.rows_copied or 0) >= BATCH for p in store.progress(sync.sync_id, 1)):
        assert thread.is_alive() and time.monotonic() < deadline, "the copy ended before the updates"
        time.sleep(0.05)
    wl.execute(
        hook,
        f"UPDATE customer.{TABLE} SET n = n + 1 WHERE id <= 60",  # leaves note, body, doc out
        f"UPDATE customer.{TABLE} SET note = CONCAT(note, ' copy-touched'), n = n + 1 WHERE id <= 20",
        f"UPDATE customer.{TABLE} SET body = X'00ff', n = n + 1 WHERE id BETWEEN 10 AND 30",
        f"UPDATE customer.{TABLE} SET n = n + 1 WHERE id <= 15",
    )
    thread.join(600)
    assert outcome, "the snapshot failed (see the log)"
    store.mark_merged(sync.sync_id, outcome[0].seq)
    store.commit(sync.sync_id, outcome[0].seq)
    manifest: Manifest = outcome[0].manifest
    sync.manifests.append(manifest)
    return manifest


def test_noblob_updates_change_only_the_columns_they_carry(noblob: Noblob, tmp_path: Path) -> None:
    hook = wl.hook_for(noblob.vitess, "vitess_noblob")
    settings = row_image_settings(hook, "customer", "PRIMARY")
    assert {image for image, _ in settings.values()} == {"NOBLOB"}, settings
    _table(hook, ROWS)
    _fill_tables(hook)
    sync, store = _sync(hook, tmp_path, (TABLE, FILL, TAIL))
    root = tmp_path / "delta"
    spark = spark_session()

    snapshot = _snapshot_with_updates_during_the_copy(sync, store, hook)
    assert _partial_rows(snapshot) > 0, "no partial image reached the snapshot: the condition was not made"
    merge(spark, sync.plan(root))
    wl.assert_equal_to_source(spark, hook, "customer", TABLE, str(root / TABLE), ["id"])

    wl.execute(
        hook,
        f"UPDATE customer.{TABLE} SET n = n + 5 WHERE id BETWEEN 100 AND 200",  # skips every blob
        f"UPDATE customer.{TABLE} SET note = 'catch-up note', n = 1 WHERE id BETWEEN 150 AND 160",
        f"UPDATE customer.{TABLE} SET n = 2 WHERE id = 155",  # then skips it again
        f"UPDATE customer.{TABLE} SET body = X'0102', n = 3 WHERE id = 300",
        f"UPDATE customer.{TABLE} SET doc = JSON_SET(doc, '$.tag', 'set'), n = 4 WHERE id = 301",
        f"UPDATE customer.{TABLE} SET note = NULL WHERE id = 302",  # a touched column set to NULL
        f"UPDATE customer.{TABLE} SET n = 5 WHERE id = 302",
        f"DELETE FROM customer.{TABLE} WHERE id = 400",
    )
    _insert(hook, [400], tag=" again")  # re-inserted: its later update must not see the old note
    _insert(hook, [ROWS + 1], tag=" new")
    wl.execute(
        hook,
        f"UPDATE customer.{TABLE} SET n = 6 WHERE id IN (400, {ROWS + 1})",
        f"UPDATE customer.{TABLE} SET n = 7 WHERE id = 15",  # copy-phase rows again
    )
    catch_up = sync.capture()
    assert _partial_rows(catch_up) >= 101 + 6
    merge(spark, sync.plan(root, first=1))
    rows = wl.assert_equal_to_source(spark, hook, "customer", TABLE, str(root / TABLE), ["id"])
    assert rows == ROWS + 1


PLAIN = "rem2_plain"  # a table without BLOB/TEXT columns, in the sync beside TABLE


def _plain_table(hook: Any) -> None:
    wl.create_sharded_table(
        hook, PLAIN, "(id BIGINT NOT NULL PRIMARY KEY, cid BIGINT NOT NULL, v INT)", "cid"
    )
    wl.execute(hook, f"INSERT INTO customer.{PLAIN} (id, cid, v) VALUES (1, 1, 1), (2, 2, 2), (3, 3, 3)")


class Merged:
    """A sync whose windows the merge runner merges, as its merge tasks do (local Spark)."""

    def __init__(self, sync: wl.Sync, root: Path, targets: dict[str, Any] | None = None) -> None:
        self.sync, self.root, self.targets = sync, root, targets

    def merge(self) -> int | None:
        runner = MergeRunner(
            self.sync.store, self.sync.sync_id, str(self.root), self.targets, holder="test-noblob-merge"
        )
        return runner.run(lambda plan: merge(spark_session(), plan)).seq

    def resnapshot(self, *tables: str) -> int:
        """What the snapshot task does with ``{"resnapshot_tables": [...]}``."""
        need = self.sync.runner.snapshot_need(tables)
        return self.sync.runner.snapshot(tables=need.tables, need=need).seq

    def exact(self, hook: Any) -> None:
        for table in self.sync.tables:
            path = str(self.root / table)
            wl.assert_equal_to_source(spark_session(), hook, "customer", table, path, ["id"])


def test_images_the_merge_cannot_complete_are_refused_and_the_remedies_heal(
    noblob: Noblob, tmp_path: Path
) -> None:
    """Each refusal, then its remedy as the error words it, to Delta == ``SELECT *``: the
    setting back on every tablet, the connections reconnected, a re-snapshot of the table (the
    other table of the sync keeps its position and loses nothing)."""
    hook = wl.hook_for(noblob.vitess, "vitess_noblob")
    _table(hook, 20)
    _plain_table(hook)
    sync, _ = _sync(hook, tmp_path, (TABLE, PLAIN))
    merged = Merged(sync, tmp_path / "delta")
    sync.runner.snapshot()
    merged.merge()
    try:
        # The setting of the server: refused before the sync reads.
        noblob.set_row_image("MINIMAL")
        with pytest.raises(BinlogSettingsError) as refused:
            sync.runner.catch_up()
        text = str(refused.value)
        assert "customer/-80 (primary): binlog_row_image=MINIMAL" in text, text
        assert "customer/80- (primary): binlog_row_image=MINIMAL" in text, text
        assert "SET GLOBAL binlog_row_image = 'FULL'" in text, text

        # A connection that still logs MINIMAL after the server went back to NOBLOB: its image
        # is refused when read, never staged.
        wl.execute(hook, f"UPDATE customer.{TABLE} SET n = 9 WHERE id = 3")
        noblob.set_row_image("NOBLOB")  # the remedy's setting; the connections reconnected
        wl.execute(hook, f"UPDATE customer.{PLAIN} SET v = 10 WHERE id = 1")
        with pytest.raises(PartialRowImageError, match="binlog_row_image=MINIMAL") as unreadable:
            sync.runner.catch_up()
        text = str(unreadable.value)
        assert f"table {TABLE!r}" in text and "re-snapshot the table (resnapshot_tables)" in text, text
    finally:
        noblob.set_row_image("NOBLOB")
    merged.resnapshot(TABLE)  # the rest of the remedy
    merged.merge()
    wl.execute(hook, f"UPDATE customer.{TABLE} SET n = 10 WHERE id = 4")  # NOBLOB: a partial image
    sync.runner.catch_up()  # reads PLAIN's change again; TABLE's MINIMAL one is behind its copy
    merged.merge()
    merged.exact(hook)

    # A key change whose image leaves columns out: their values are the old key's row's.
    wl.execute(hook, f"UPDATE customer.{TABLE} SET id = 1000 WHERE id = 4")
    with pytest.raises(PartialRowImageError, match="changes the key") as unreadable:
        sync.runner.catch_up()
    assert "SET GLOBAL binlog_row_image = 'FULL'" in str(unreadable.value)
    try:
        noblob.set_row_image("FULL")
        merged.resnapshot(TABLE)
        merged.merge()
        wl.execute(hook, f"UPDATE customer.{TABLE} SET id = 1001 WHERE id = 5")  # FULL: a whole image
        sync.runner.catch_up()
        merged.merge()
        merged.exact(hook)
    finally:
        noblob.set_row_image("NOBLOB")


def test_the_merges_refusals_of_partial_images_heal_as_the_errors_say(noblob: Noblob, tmp_path: Path) -> None:
    """The merge's refusals of a NOBLOB image it cannot complete, each followed by its remedy to
    ``SELECT *``: a mirror whose row was deleted by someone else (no row to keep the value
    from), and a ``history`` table (a version needs every value)."""
    hook = wl.hook_for(noblob.vitess, "vitess_noblob")
    _table(hook, 20)
    sync, _ = _sync(hook, tmp_path)
    mirror = Merged(sync, tmp_path / "delta")
    sync.runner.snapshot()
    mirror.merge()
    spark_session().sql(f"DELETE FROM delta.`{tmp_path / 'delta' / TABLE}` WHERE id = 6")  # not the sync's
    wl.execute(hook, f"UPDATE customer.{TABLE} SET n = 1 WHERE id = 6")  # leaves note, body, doc out
    sync.runner.catch_up()
    with pytest.raises(Exception, match="the Delta table has no row to keep its value from") as refused:
        mirror.merge()
    assert "Remedy: re-snapshot the table (resnapshot_tables)" in str(refused.value)
    mirror.resnapshot(TABLE)
    mirror.merge()
    mirror.exact(hook)

    (tmp_path / "hist").mkdir()
    sync, _ = _sync(hook, tmp_path / "hist")
    root = tmp_path / "hist" / "delta"
    history = Merged(sync, root, {TABLE: {"mode": "history"}})
    sync.runner.snapshot()
    history.merge()
    wl.execute(hook, f"UPDATE customer.{TABLE} SET n = 2 WHERE id = 7")
    sync.runner.catch_up()
    with pytest.raises(Exception, match="a history version needs every value") as refused:
        history.merge()
    text = str(refused.value)
    assert "set binlog_row_image=FULL" in text, text
    assert "then re-snapshot the table (resnapshot_tables)" in text, text
    try:
        noblob.set_row_image("FULL")  # the connections reconnected
        with pytest.raises(Exception, match="a history version needs every value"):
            history.merge()  # the setting alone: the staged window keeps its partial images
        history.resnapshot(TABLE)
        history.merge()
        wl.execute(hook, f"UPDATE customer.{TABLE} SET n = 3 WHERE id = 8")
        sync.runner.catch_up()
        history.merge()
    finally:
        noblob.set_row_image("NOBLOB")
    assert_history(TABLE, delta_dicts(root / TABLE, spark_session()), source_dicts(hook, "customer", TABLE))
