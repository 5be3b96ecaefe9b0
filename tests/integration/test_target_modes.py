"""Target modes through the DAG factory, on the real cluster, Spark and Delta, against the oracle
of a workload that records every state it commits per key (``modes_workload``).

One sync holds one table per mode (each table's mode from ``targets``; the same DML runs on all
of them in the same transactions), merged on Spark Connect with small windows (``max_events``), so moves
between shards and a delete's two halves fall in different windows (and, last, one large
window). Oracles:

* ``mirror`` == ``SELECT *``; a mirror with Change Data Feed: its ``table_changes`` after the
  snapshot, applied to the snapshot, give ``SELECT *``, one commit per window;
* ``soft_delete``: live rows == ``SELECT *``, flagged rows == the keys deleted and not inserted
  again;
* ``history``: per key, the versions in order == the states the workload recorded, intervals
  contiguous (or ended by a delete) and non-overlapping, one current version per live key;
* ``changelog``: per key, the changes in order == the workload's.

Then a merge killed after its Delta commits and before the checkpoint (that run's merge goes
through the real spark-submit, which fails after the job succeeded), and the rerun: each window
once in every table, the oracles hold (the changelog has no window twice). Tables of its own
(``customer.modes_*``; ``modes_meta``: a mirror with metadata columns).
"""

from __future__ import annotations

import itertools
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import load_manifest
from tests.conftest import LocalVitess, connection_uri_env
from tests.integration.airflow_env import (
    CONNECT_UNLESS_SUBMIT,
    AirflowEnv,
    assert_succeeded,
    make_airflow_env,
)
from tests.integration.delta_check import delta_txns, source_rows, spark_session
from tests.integration.modes_workload import ModesWorkload, Record, State, create_tables

pytestmark = pytest.mark.integration

MIRROR, SOFT, HIST, LOG, CDF = "modes_mirror", "modes_soft", "modes_hist", "modes_log", "modes_cdf"
META = "modes_meta"  # a mirror with metadata columns
TABLES = (MIRROR, SOFT, HIST, LOG, CDF, META)
SYNC = "modes_small"
P = "_vitess_"

DAGS = """
import os
from airflow_provider_vitess.dag_factory import vitess_sync_dag

globals()["{sync}"] = vitess_sync_dag(
    "{sync}",
    keyspace="customer",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,
    max_events=80,
    targets={{
        "{soft}": {{"mode": "soft_delete"}},
        "{hist}": {{"mode": "history"}},
        "{log}": {{"mode": "changelog"}},
        "{cdf}": {{"change_data_feed": True}},
        "{meta}": {{"metadata_columns": True}},
    }},
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)

# The same sync, its windows large (no max_events).
globals()["{sync}_connect"] = vitess_sync_dag(
    "{sync}_connect",
    sync_id="{sync}",
    keyspace="customer",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,
    targets={{
        "{soft}": {{"mode": "soft_delete"}},
        "{hist}": {{"mode": "history"}},
        "{log}": {{"mode": "changelog"}},
        "{cdf}": {{"change_data_feed": True}},
        "{meta}": {{"metadata_columns": True}},
    }},
    default_args={{"retries": 0}},
    merge_kwargs={{"spark_connect_conn_id": "spark_connect_default"}},
)

# The same sync, edited to ask another mode of the mirror's existing table.
globals()["{sync}_changed"] = vitess_sync_dag(
    "{sync}_changed",
    sync_id="{sync}",
    keyspace="customer",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes=False,
    max_events=80,
    targets={{
        "{mirror}": {{"mode": "soft_delete"}},
        "{soft}": {{"mode": "soft_delete"}},
        "{hist}": {{"mode": "history"}},
        "{log}": {{"mode": "changelog"}},
        "{cdf}": {{"change_data_feed": True}},
        "{meta}": {{"metadata_columns": True}},
    }},
    default_args={{"retries": 0}},
    merge_kwargs={merge_kwargs},
)
"""

# The real spark-submit, then a failure: the job committed to Delta, the task fails before the
# checkpoint store records the windows MERGED (a kill after the Delta commit).
FAIL_AFTER = """#!/bin/sh
"{real}" "$@"
echo "injected failure after spark-submit (exit $?)" >&2
exit 3
"""


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_modes", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_modes")
        create_tables(hook, TABLES)
        yield hook
        hook.close()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="module")
def airflow(
    vitess: LocalVitess, lake: Path, tmp_path_factory: pytest.TempPathFactory, spark_connect: str
) -> AirflowEnv:
    # Merges on Spark Connect; the kill test's run goes through the real spark-submit (wrapped).
    env = make_airflow_env(tmp_path_factory.mktemp("af"), vitess, spark_connect=spark_connect)
    source = DAGS.format(
        sync=SYNC,
        tables=list(TABLES),
        lake=lake,
        mirror=MIRROR,
        soft=SOFT,
        hist=HIST,
        log=LOG,
        cdf=CDF,
        meta=META,
        merge_kwargs=CONNECT_UNLESS_SUBMIT,
    )
    env.write_dag("modes_dags", source)
    return env


@pytest.fixture(scope="module")
def workload(hook: VitessHook) -> ModesWorkload:
    return ModesWorkload(hook, TABLES, seed=29)


def _rows(path: Path) -> list[dict[str, Any]]:
    df = spark_session().read.format("delta").load(str(path))
    return [r.asDict() for r in df.collect()]


def _state(row: dict[str, Any]) -> State:
    return (int(row["vid"]), row["note"], int(row["qty"]))


def _assert_mirror(hook: VitessHook, lake: Path, table: str) -> None:
    rows = _rows(lake / "delta" / table)
    assert all(not c.startswith(P) for c in rows[0]), "a plain mirror has no metadata columns"
    got = {(r["id"], r["vid"], r["note"], r["qty"]) for r in rows}
    assert got == source_rows(hook, "customer", table)


def _assert_mirror_with_metadata(hook: VitessHook, lake: Path, record: Record) -> None:
    rows = _rows(lake / "delta" / META)
    assert list(rows[0])[-4:] == [P + "op", P + "commit_ts", P + "window_seq", P + "synced_at"]
    assert {(r["id"], r["vid"], r["note"], r["qty"]) for r in rows} == source_rows(hook, "customer", META)
    changed = {k for k, cs in record.changes.items() if cs}
    for r in rows:
        assert r[P + "op"] in ("insert", "update") and r[P + "window_seq"] >= 1 and r[P + "synced_at"], r
        # A row the workload changed after the snapshot carries its source commit time.
        assert (r[P + "commit_ts"] is not None) == (r["id"] in changed), r


def _assert_soft_delete(hook: VitessHook, lake: Path, record: Record) -> None:
    rows = _rows(lake / "delta" / SOFT)
    live = {(r["id"], r["vid"], r["note"], r["qty"]) for r in rows if not r[P + "deleted"]}
    assert live == source_rows(hook, "customer", SOFT)
    flagged = {r["id"] for r in rows if r[P + "deleted"]}
    gone = {k for k, states in record.states.items() if states[-1] is None}
    assert flagged == gone, (sorted(flagged - gone)[:5], sorted(gone - flagged)[:5])
    for r in rows:
        assert (r[P + "deleted_at"] is not None) == r[P + "deleted"], r
        assert r[P + "op"] in ("insert", "update", "delete") and r[P + "window_seq"] >= 1, r


def _expected_versions(states: list[State]) -> list[tuple[State, bool]]:
    """Each recorded state that is a row, with whether a delete ended it."""
    out: list[tuple[State, bool]] = []
    for i, s in enumerate(states):
        if s is not None:
            out.append((s, i + 1 < len(states) and states[i + 1] is None))
    return out


def _assert_history(lake: Path, record: Record) -> None:
    rows = _rows(lake / "delta" / HIST)
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(r["id"], []).append(r)
    expected_keys = {k for k, s in record.states.items() if any(x is not None for x in s)}
    assert set(by_key) == expected_keys
    wrong = []
    for key, versions in by_key.items():
        versions.sort(
            key=lambda r: (
                r[P + "valid_from"] is not None,
                r[P + "valid_from"] or 0,
                r[P + "valid_to"] is None,
            )
        )
        got = [(_state(v), v[P + "deleted"]) for v in versions]
        want = _expected_versions(record.states[key])
        # The last version of a deleted key is ended by the delete; a live key's is current.
        if got != want:
            wrong.append((key, got, want))
            continue
        for a, b in itertools.pairwise(versions):
            assert a[P + "valid_to"] is not None and not a[P + "current"], (key, versions)
            if a[P + "deleted"]:
                assert a[P + "valid_to"] <= b[P + "valid_from"], (key, versions)  # a gap: deleted
            else:
                assert a[P + "valid_to"] == b[P + "valid_from"], (key, versions)  # contiguous
        last = versions[-1]
        live = record.states[key][-1] is not None
        assert last[P + "current"] == live and (last[P + "valid_to"] is None) == live, (key, versions)
        assert sum(v[P + "current"] for v in versions) == (1 if live else 0)
    assert not wrong, f"{len(wrong)} keys' versions differ, e.g. {wrong[:3]}"


def _canonical(changes: list[tuple[str, State, str | None]]) -> list[tuple[str, State]]:
    """Changelog rows of a key as the workload's changes: a delete and an insert on two shards
    next to each other (either order) are one move."""
    out: list[tuple[str, State]] = []
    i = 0
    while i < len(changes):
        op, after, shard = changes[i]
        if i + 1 < len(changes):
            op2, after2, shard2 = changes[i + 1]
            if {op, op2} == {"delete", "insert"} and shard != shard2:
                out.append(("move", after if op == "insert" else after2))
                i += 2
                continue
        out.append((op, after))
        i += 1
    return out


def _assert_changelog(lake: Path, record: Record) -> None:
    rows = _rows(lake / "delta" / LOG)
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r[P + "op"] != "snapshot":
            by_key.setdefault(r["id"], []).append(r)
    snapshot = Counter(r["id"] for r in rows if r[P + "op"] == "snapshot")
    assert all(n == 1 for n in snapshot.values()) and set(snapshot) == {
        k for k, s in record.states.items() if s[0] is not None
    }
    got = {}
    for key, changes in by_key.items():
        changes.sort(key=lambda r: (r[P + "window_seq"], r[P + "order"]))
        got[key] = _canonical(
            [(r[P + "op"], None if r[P + "op"] == "delete" else _state(r), r[P + "shard"]) for r in changes]
        )
    want = {k: [(c.op, c.after) for c in cs] for k, cs in record.changes.items()}
    wrong = [(k, got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)]
    assert not wrong, f"{len(wrong)} keys' changes differ, e.g. {wrong[:3]}"


def _moves_split_by_a_window(lake: Path) -> int:
    """How many moves between shards (a key's delete and insert, next to each other in its
    changes, on two shards) the changelog got in two different windows."""
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in _rows(lake / "delta" / LOG):
        if r[P + "op"] in ("insert", "delete"):
            by_key.setdefault(r["id"], []).append(r)
    split = 0
    for changes in by_key.values():
        changes.sort(key=lambda r: (r[P + "window_seq"], r[P + "order"]))
        for a, b in itertools.pairwise(changes):
            if {a[P + "op"], b[P + "op"]} == {"delete", "insert"} and a[P + "shard"] != b[P + "shard"]:
                split += a[P + "window_seq"] != b[P + "window_seq"]
    return split


def _assert_change_data_feed(hook: VitessHook, lake: Path) -> None:
    """``table_changes`` after the snapshot's version, applied to the snapshot's rows, give the
    source; every change belongs to a window's commit."""
    spark = spark_session()
    path = lake / "delta" / CDF
    txns = delta_txns(path)
    first = min(v for _, _, v in txns)
    state = {
        r["id"]: r
        for r in (
            x.asDict()
            for x in spark.read.format("delta").option("versionAsOf", first).load(str(path)).collect()
        )
    }
    changes = spark.sql(f"SELECT * FROM table_changes('delta.`{path}`', {first + 1})").collect()
    window_versions = {v for _, _, v in txns}
    for c in sorted(changes, key=lambda r: (r["_commit_version"], r["_change_type"] != "delete")):
        assert c["_commit_version"] in window_versions, c
        kind = c["_change_type"]
        row = {k: c[k] for k in ("id", "vid", "note", "qty")}
        if kind == "delete":
            state.pop(row["id"], None)
        elif kind in ("insert", "update_postimage"):
            state[row["id"]] = row
    got = {(r["id"], r["vid"], r["note"], r["qty"]) for r in state.values()}
    assert got == source_rows(hook, "customer", CDF)
    assert changes, "the windows changed the table"


def _assert_all(hook: VitessHook, lake: Path, record: Record) -> None:
    _assert_mirror(hook, lake, MIRROR)
    _assert_mirror_with_metadata(hook, lake, record)
    _assert_soft_delete(hook, lake, record)
    _assert_history(lake, record)
    _assert_changelog(lake, record)
    _assert_change_data_feed(hook, lake)


def _store(airflow: AirflowEnv) -> CheckpointStore:
    return CheckpointStore(f"sqlite:///{airflow.home / 'vitess_sync.db'}")


def test_each_mode_through_the_dag_factory(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, workload: ModesWorkload
) -> None:
    workload.initial(40)
    assert_succeeded(airflow.run_dag(SYNC), "snapshot", "merge_snapshot", "catch_up", "merge")
    for i in range(4):
        workload.round(big=i == 1)
    run = airflow.run_dag(SYNC)
    assert_succeeded(run, "snapshot", "merge_snapshot", "catch_up", "merge")
    assert _store(airflow).committed(SYNC)[1] >= 4, "small windows: a chain of several"
    assert _moves_split_by_a_window(lake) >= 1, "no move's two halves fell in different windows"
    _assert_all(hook, lake, workload.record)


def test_a_merge_killed_after_its_delta_commits_is_rerun_and_leaves_each_window_once(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, workload: ModesWorkload, tmp_path: Path
) -> None:
    store = _store(airflow)
    before = store.committed(SYNC)[1]
    for _ in range(2):
        workload.round()
    real = _spark_submit()
    wrapper = tmp_path / "spark-submit-then-fail"
    wrapper.write_text(FAIL_AFTER.format(real=real))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    failing = AirflowEnv(airflow.home, {**airflow.env, "VITESS_TEST_SPARK_SUBMIT": str(wrapper)})
    killed = failing.run_dag(SYNC)
    assert killed["tasks"]["merge"] == "failed", killed["tasks"]
    assert "injected failure after spark-submit (exit 0)" in killed["log"]
    staged = [w for w in store.open_windows(SYNC) if w.state is WindowState.STAGED]
    assert staged and store.committed(SYNC)[1] == before, "the windows are in Delta, not committed"
    seqs = [w.seq for w in staged]
    for table in (HIST, LOG):  # the killed run's commits hold the windows with rows already
        held = {v for app, v, _ in delta_txns(lake / "delta" / table) if app.endswith(f":{table}")}
        with_rows = {seq for seq in seqs if _has_rows(lake, seq, table)}
        assert with_rows and with_rows <= held, (table, seqs, with_rows, held)

    rerun = airflow.run_dag(SYNC)
    assert_succeeded(rerun, "snapshot", "merge_snapshot", "catch_up", "merge")
    assert "already_applied" in rerun["log"]
    assert store.committed(SYNC)[1] >= max(seqs)
    for table in TABLES:
        counts = Counter(v for _, v, _ in delta_txns(lake / "delta" / table))
        assert all(n == 1 for n in counts.values()), (table, counts)
    _assert_all(hook, lake, workload.record)


def test_a_mode_change_on_an_existing_target_is_refused_and_nothing_is_written(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, workload: ModesWorkload
) -> None:
    store = _store(airflow)
    workload.round()
    logs = {t: sorted(p.name for p in (lake / "delta" / t / "_delta_log").glob("*.json")) for t in TABLES}
    refused = airflow.run_dag(f"{SYNC}_changed")
    assert refused["tasks"]["merge"] == "failed", refused["tasks"]
    assert (
        f"table '{MIRROR}': the Delta table at {lake / 'delta' / MIRROR} was built in mode 'mirror' "
        "(no metadata columns), and the merge asks for mode 'soft_delete' (metadata columns _vitess_*); "
        "a table's target mode cannot change, so nothing was written"
    ) in refused["log"]
    assert (
        "a new target location" in refused["log"]
        and '{"resnapshot_tables": ["modes_mirror"]}' in refused["log"]
    )
    after = {t: sorted(p.name for p in (lake / "delta" / t / "_delta_log").glob("*.json")) for t in TABLES}
    assert after == logs, "no table got a commit"
    assert any(w.state is WindowState.STAGED for w in store.open_windows(SYNC))
    # Back to the modes the tables were built in: the staged windows merge, exact.
    assert_succeeded(airflow.run_dag(SYNC), "snapshot", "merge_snapshot", "catch_up", "merge")
    _assert_all(hook, lake, workload.record)


def test_the_modes_in_one_large_window(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, workload: ModesWorkload
) -> None:
    """The same sync's next changes in one large window (no ``max_events``): the oracles hold."""
    before = _store(airflow).committed(SYNC)[1]
    for i in range(2):
        workload.round(big=i == 0)
    assert_succeeded(airflow.run_dag(f"{SYNC}_connect"), "snapshot", "merge_snapshot", "catch_up", "merge")
    assert _store(airflow).committed(SYNC)[1] > before
    _assert_all(hook, lake, workload.record)


def _has_rows(lake: Path, seq: int, table: str) -> bool:
    manifest = load_manifest(str(lake / "staging"), SYNC, seq)
    assert manifest is not None
    tm = manifest.tables.get(table)
    return tm is not None and bool(tm.parts)


def _spark_submit() -> Path:
    import shutil
    import sys

    found = shutil.which("spark-submit")
    return Path(found) if found else Path(sys.executable).parent / "spark-submit"
