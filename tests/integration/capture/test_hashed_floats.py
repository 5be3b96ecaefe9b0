"""A hashed FLOAT or DOUBLE value hashes the same whether the copy or the binlog carried it.

vttablet renders a FLOAT column's value in the copy phase (a SELECT) as MySQL prints a float
(``1.1``) and in a row event from the binlog as the float widened to a double
(``1.100000023841858``), a DOUBLE's likewise: hashed as sent, one value got two hashes, so a
hashed column no longer joined or grouped across the snapshot and the changes. The hash is taken
of a canonical text of the number (:mod:`airflow_provider_vitess.staging.hashing`). Real vtgate,
the copy and the binlog of the same rows.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from airflow_provider_vitess.capture.columns import TableColumns
from airflow_provider_vitess.capture.runner import CaptureRunner, SyncSpec
from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.staging import read_table
from tests.support import merge_workload as wl
from tests.support.local import LocalVitess

pytestmark = pytest.mark.integration

TABLE = "hashfloat_values"
SALT = "a salt of the test's"
# FLOAT values whose float text differs from their double text, DOUBLE values with long texts.
VALUES = [(1, 1.1, 0.1), (2, 0.1, 1 / 3), (3, 3.14159, 1e-7), (4, -123456.79, 2.5e300), (5, 1e-7, 6.02e23)]


def _setup(hook: wl.VitessHook) -> None:
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} "
        "(id BIGINT NOT NULL PRIMARY KEY, f FLOAT, d DOUBLE, note VARCHAR(16))",
        f"INSERT INTO commerce.{TABLE} (id, f, d, note) VALUES "
        + ", ".join(f"({i}, {f!r}, {d!r}, 'copied')" for i, f, d in VALUES),
    )


def test_a_hashed_float_hashes_alike_in_the_copy_and_the_binlog(vitess: LocalVitess, tmp_path: Path) -> None:
    hook = wl.hook_for(vitess, "vitess_hashfloat")
    _setup(hook)
    store = CheckpointStore(f"sqlite:///{tmp_path}/store.db")
    sync_id = f"hashfloat-{uuid.uuid4().hex[:8]}"
    spec = SyncSpec(
        sync_id,
        "commerce",
        (TABLE,),
        str(tmp_path / "stage"),
        columns={TABLE: TableColumns(hash=("f", "d"))},
        hash_salt=SALT,
    )
    runner = CaptureRunner(hook, store, spec, holder="test-hashfloat")
    snapshot = runner.snapshot()
    store.mark_merged(sync_id, snapshot.seq)
    store.commit(sync_id, snapshot.seq)
    wl.execute(hook, f"UPDATE commerce.{TABLE} SET note = 'streamed'")
    window = runner.catch_up()

    copied = {r["id"]: (r["f"], r["d"]) for r in read_table(snapshot.manifest, TABLE).to_pylist()}
    streamed = {
        r["id"]: (r["f"], r["d"])
        for r in read_table(window.manifest, TABLE).to_pylist()
        if r["_op"] == "update"
    }
    assert set(copied) == set(streamed) == {i for i, _, _ in VALUES}
    differ = {i: (copied[i], streamed[i]) for i in copied if copied[i] != streamed[i]}
    assert not differ, f"{len(differ)} rows hash their unchanged floats two ways: {differ}"
    # The hash is the documented one: of Python's repr of the number the column stages as
    # unhashed (a FLOAT as the server prints it, six significant digits).
    want_f = hashlib.sha256((SALT + "1.1").encode()).hexdigest()
    want_d = hashlib.sha256((SALT + "0.1").encode()).hexdigest()
    assert copied[1] == (want_f, want_d)
    assert copied[4][0] == hashlib.sha256((SALT + "-123457.0").encode()).hexdigest()
    # 0.1 and 1e-7, each a FLOAT and a DOUBLE: one text, one hash.
    assert len({v for pair in copied.values() for v in pair}) == 8
