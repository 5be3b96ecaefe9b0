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
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.checkpoints import CheckpointStore, WindowState
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import load_manifest
from tests.support.airflow_env import (
    CONNECT_UNLESS_SUBMIT,
    AirflowEnv,
    assert_succeeded,
    failing_after_submit,
    make_airflow_env,
)
from tests.support.delta_check import delta_txns, source_rows, spark_session
from tests.support.local import LocalVitess
from tests.support.mode_oracles import (
    P,
    assert_changelog_changes,
    assert_history,
    assert_history_states,
    assert_mirror,
    assert_soft_delete,
    delta_dicts,
    source_dicts,
)
from tests.support.modes_workload import ModesWorkload, Record, modes_hook
from tests.support.readers import assert_readers_see_what_spark_sees

pytestmark = pytest.mark.integration

MIRROR, SOFT, HIST, LOG, CDF = "modes_mirror", "modes_soft", "modes_hist", "modes_log", "modes_cdf"
META = "modes_meta"  # a mirror with metadata columns
TABLES = (MIRROR, SOFT, HIST, LOG, CDF, META)
SYNC = "modes_small"

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


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess) -> Iterator[VitessHook]:
    with modes_hook(vitess, "vitess_modes", TABLES) as hook:
        yield hook


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
    return delta_dicts(path)


def _source(hook: VitessHook, table: str) -> list[dict[str, Any]]:
    return source_dicts(hook, "customer", table)


def _assert_mirror_with_metadata(hook: VitessHook, lake: Path, record: Record) -> None:
    rows = _rows(lake / "delta" / META)
    assert list(rows[0])[-4:] == [P + "op", P + "commit_ts", P + "window_seq", P + "synced_at"]
    assert_mirror(META, rows, _source(hook, META))
    changed = {k for k, cs in record.changes.items() if cs}
    for r in rows:
        assert r[P + "op"] in ("insert", "update") and r[P + "window_seq"] >= 1 and r[P + "synced_at"], r
        # A row the workload changed after the snapshot carries its source commit time.
        assert (r[P + "commit_ts"] is not None) == (r["id"] in changed), r


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
    mirror = _rows(lake / "delta" / MIRROR)
    assert all(not c.startswith(P) for c in mirror[0]), "a plain mirror has no metadata columns"
    assert_mirror(MIRROR, mirror, _source(hook, MIRROR))
    _assert_mirror_with_metadata(hook, lake, record)
    gone = {k for k, states in record.states.items() if states[-1] is None}
    assert_soft_delete(SOFT, _rows(lake / "delta" / SOFT), _source(hook, SOFT), gone)
    assert_history_states(HIST, _rows(lake / "delta" / HIST), record)
    assert_changelog_changes(LOG, _rows(lake / "delta" / LOG), record)
    _assert_change_data_feed(hook, lake)
    for table in sorted((lake / "delta").iterdir()):  # every mode's table, with the defaults
        assert_readers_see_what_spark_sees(table.name, table)


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
    wrapper = failing_after_submit(real, tmp_path)
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


def test_windows_committed_then_discarded_with_their_staging_lost_are_not_appended_twice(
    airflow: AirflowEnv, hook: VitessHook, lake: Path, workload: ModesWorkload, tmp_path: Path
) -> None:
    """A merge killed after its Delta commits, then the windows' staged files lost: the store
    discards the windows and the next catch-up reads their changes again. The history and
    changelog tables hold them already, so merging the new windows would append them twice: the
    merge is refused naming the table and the re-snapshot, nothing is written, and the
    re-snapshot it names heals. (Last in the module: the sync is re-snapshotted.)"""
    store = _store(airflow)
    workload.round()
    wrapper = failing_after_submit(_spark_submit(), tmp_path)
    failing = AirflowEnv(airflow.home, {**airflow.env, "VITESS_TEST_SPARK_SUBMIT": str(wrapper)})
    killed = failing.run_dag(SYNC)
    assert killed["tasks"]["merge"] == "failed", killed["tasks"]
    staged = [w.seq for w in store.open_windows(SYNC) if w.state is WindowState.STAGED]
    held = {v for app, v, _ in delta_txns(lake / "delta" / HIST) if app.endswith(f":{HIST}")}
    assert set(staged) & held, (staged, held)
    for seq in staged:  # lost: the store cannot merge them, and discards them
        shutil.rmtree(lake / "staging" / SYNC / f"window={seq:010d}")
    logs = {
        t: sorted(p.name for p in (lake / "delta" / t / "_delta_log").glob("*.json")) for t in (HIST, LOG)
    }
    for _ in range(3):  # the catch-up, then the merge, each discards lost windows it meets
        run = airflow.run_dag(SYNC)
        if (
            "was staged but" not in run["log"]
            and "discarding it and reading its changes again" not in run["log"]
        ):
            break
    assert run["tasks"]["merge"] == "failed", run["tasks"]
    assert f"table '{HIST}'" in run["log"] and "which the checkpoint store discarded" in run["log"]
    assert "a history table would hold them twice" in run["log"]
    after = {
        t: sorted(p.name for p in (lake / "delta" / t / "_delta_log").glob("*.json")) for t in (HIST, LOG)
    }
    assert after == logs, "nothing was written to the tables that hold the discarded windows"

    healed = airflow.run_dag(SYNC, conf={"resnapshot_tables": [HIST, LOG]})
    assert_succeeded(healed, "snapshot", "merge_snapshot", "catch_up", "merge")
    assert_mirror(MIRROR, _rows(lake / "delta" / MIRROR), _source(hook, MIRROR))
    assert_history(HIST, _rows(lake / "delta" / HIST), _source(hook, HIST))
