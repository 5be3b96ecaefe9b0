"""The matrix soak (``matrix_soak``): per seed a drawn configuration (target mode per table, shard
groups, column choice, ``max_events``, the sensor, a follow task) and script (changes, moves, same-second
deletes, key changes, long transactions, ADD COLUMN, MODIFY COLUMN, a re-snapshot, a key
override and its re-snapshot, a task killed at a drawn point and rerun, a shard group's task
failed and run again alone), through the DAG factory in real Airflow, each mode's oracle and the
consistent cut after every run.

``make test`` runs the fixed seeds of :data:`FIXED_SEEDS` (short scripts without a kill: a
killed task's rerun waits 2 minutes for its lock to go stale). ``make soak-matrix SEEDS=50``
runs seeds 0-49 with full scripts (every event drawn) and prints a line per seed and the
tally; ``MATRIX_FIRST=n`` starts at seed n, ``MATRIX_LOG=file`` appends each seed's result (a
JSON line) there.
Reproduce one seed:
``MATRIX_FULL=1 pytest -m soak 'tests/integration/operations/test_matrix_soak.py::test_matrix[7]'``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging.hashing import hasher
from tests.support.airflow_env import make_airflow_env
from tests.support.local import LocalVitess, connection_uri_env, print_past_capture
from tests.support.matrix_soak import MODES, WIDENED, MatrixSoak, Tally, draw
from tests.support.mode_oracles import (
    as_target,
    assert_changelog,
    assert_cut_consistent,
    assert_history,
    assert_mirror,
    assert_soft_delete,
    current_rows,
)

pytestmark = pytest.mark.integration

FULL = os.environ.get("MATRIX_FULL", "") not in ("", "0")
SEEDS = int(os.environ.get("MATRIX_SEEDS", "50")) if FULL else 0  # make test: the fixed seeds only
FIRST = int(os.environ.get("MATRIX_FIRST", "0"))
# make test's seed (its ~160 s of the suite: two DAG runs): the snapshot, then one step making
# each change once. Seed 21 draws soft_delete, changelog and history, shard groups, a hashed
# column, an ADD COLUMN, a MODIFY COLUMN (qty INT -> BIGINT) and a long transaction.
FIXED_SEEDS = (21,)
FIXED_STEPS = 1
TALLY = Tally()


@pytest.fixture(scope="module")
def hook(vitess: LocalVitess, request: pytest.FixtureRequest) -> Iterator[VitessHook]:
    name, value = connection_uri_env("vitess_matrix", vitess)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        hook = VitessHook("vitess_matrix")
        yield hook
        hook.close()
    if TALLY.results:  # past pytest's capture: the lines and the tally are the soak's output
        print_past_capture(
            request.config, "\n" + "\n".join([r.line() for r in TALLY.results] + [TALLY.line()])
        )


def _run(
    seed: int, vitess: LocalVitess, hook: VitessHook, tmp_path: Path, spark_connect: str, full: bool
) -> None:
    plan = draw(seed) if full else draw(seed, steps=FIXED_STEPS, every_event=True, no_kill=True)
    airflow = make_airflow_env(tmp_path / "af", vitess, spark_connect=spark_connect)
    soak = MatrixSoak(hook, airflow, tmp_path / "lake", plan, spark_connect)
    log = os.environ.get("MATRIX_LOG")
    try:
        result = soak.run()
    finally:
        if soak.result is not None:
            TALLY.results.append(soak.result)
            if log:
                with open(log, "a") as f:
                    f.write(soak.result.to_json() + "\n")
    assert result.runs >= len(plan.steps) + 1


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_matrix_fixed_seed(
    vitess: LocalVitess, hook: VitessHook, tmp_path: Path, spark_connect: str, seed: int
) -> None:
    _run(seed, vitess, hook, tmp_path, spark_connect, full=False)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(FIRST, FIRST + SEEDS))
def test_matrix(vitess: LocalVitess, hook: VitessHook, tmp_path: Path, spark_connect: str, seed: int) -> None:
    _run(seed, vitess, hook, tmp_path, spark_connect, full=True)


def test_the_plans_are_the_seeds_and_cover_the_matrix() -> None:
    """A seed draws one plan (reproducible), and fifty seeds draw every mode, both group
    counts, each column choice, both max_events, the sensor both ways, a follow task (killed in
    some seeds) and none, every event, each
    operator event (a re-snapshot and a key override of a table in every mode) and each fault."""
    assert draw(7) == draw(7) and draw(7) != draw(8)
    plans = [draw(s) for s in range(50)]
    configs = [p.config for p in plans]
    assert {m for c in configs for m in c.modes.values()} == {"mirror", "soft_delete", "history", "changelog"}
    assert {c.capture_parallelism for c in configs} == {1, 2}
    assert {c.column_choice for c in configs} == {"none", "include", "exclude", "hash"}
    assert {c.max_events is None for c in configs} == {True, False} and {c.sensor for c in configs} == {
        True,
        False,
    }
    assert {c.follow for c in configs} == {True, False}
    assert not any(c.follow and (c.capture_parallelism != 1 or not c.sensor) for c in configs)
    kills = ("kill_after_rows", "kill_at_merge_phase")
    assert any(p.config.follow and any(set(s.faults or ()) & set(kills) for s in p.steps) for p in plans), (
        "no seed kills a follow task"
    )
    events = {e for p in plans for s in p.steps for e in s.events}
    from tests.support.modes_workload import EVENTS

    assert events == set(EVENTS)
    steps = [(p, s) for p in plans for s in p.steps]
    assert any(s.add_column for _, s in steps)
    assert {s.modify for _, s in steps} == {None, *WIDENED}
    assert {p.config.modes[s.resnapshot] for p, s in steps if s.resnapshot} == set(MODES)
    assert {p.config.modes[s.key_override] for p, s in steps if s.key_override} == set(MODES)
    faults = [f for p in plans for f in (p.snapshot_faults, *(s.faults for s in p.steps)) if f]
    assert {next(iter(f)) for f in faults} == {
        "kill_after_rows", "kill_before_record", "kill_at_merge_phase", "fail_group"
    }  # fmt: skip
    assert {f["kill_at_merge_phase"][0] for f in faults if "kill_at_merge_phase" in f} == {
        "writing",
        "committed",
    }
    assert any(p.snapshot_faults for p in plans)
    fixed = [draw(s, steps=FIXED_STEPS, every_event=True, no_kill=True) for s in FIXED_SEEDS]
    assert not any(p.snapshot_faults for p in fixed) and not any(
        s.faults and "fail_group" not in s.faults for p in fixed for s in p.steps
    )
    assert json.loads(json.dumps([p.describe() for p in fixed]))


def _v(
    key: int, note: str, start: int | None, end: int | None, *, deleted: bool = False
) -> dict[str, object]:
    return {
        "id": key, "note": note, "_vitess_valid_from": start, "_vitess_valid_to": end,
        "_vitess_current": end is None, "_vitess_deleted": deleted,
    }  # fmt: skip


def _c(key: int, note: str | None, op: str, seq: int, order: int, shard: str) -> dict[str, object]:
    return {
        "id": key,
        "note": note,
        "_vitess_op": op,
        "_vitess_window_seq": seq,
        "_vitess_order": order,
        "_vitess_shard": shard,
    }


def test_the_oracles_catch_what_they_are_for() -> None:
    """The soak's oracles on hand-made rows (no server): each shape passes, and each known way of
    being wrong fails (else a green soak would say nothing)."""
    source = [{"id": 1, "note": "b"}]
    history = [_v(1, "a", None, 10), _v(1, "b", 10, None), _v(2, "x", None, 12, deleted=True)]
    assert_history("h", history, source)
    with pytest.raises(AssertionError, match="current versions"):  # a deleted key left current (item 0)
        assert_history("h", [*history[:2], _v(2, "x", None, None)], source)
    with pytest.raises(AssertionError, match="overlap"):
        assert_history("h", [_v(1, "a", None, 11), _v(1, "b", 10, None)], source)
    with pytest.raises(AssertionError, match="gap"):
        assert_history("h", [_v(1, "a", None, 9), _v(1, "b", 10, None)], source)
    # A move, the INSERT half first, then a delete of another key: replayed, the source.
    log = [
        _c(1, "a", "snapshot", 1, 0, "-80"),
        _c(2, "x", "snapshot", 1, 1, "80-"),
        _c(1, "b", "insert", 2, 0, "80-"),
        _c(1, None, "delete", 2, 1, "-80"),
        _c(2, None, "delete", 2, 2, "80-"),
    ]
    assert_changelog("c", log, source)
    with pytest.raises(AssertionError, match="only in the source"):  # the move's INSERT half lost
        assert_changelog("c", [r for r in log if r["_vitess_op"] != "insert"], source)
    soft = [
        {
            "id": 1,
            "note": "b",
            "_vitess_deleted": False,
            "_vitess_deleted_at": None,
            "_vitess_op": "update",
            "_vitess_window_seq": 2,
        },
        {
            "id": 2,
            "note": "x",
            "_vitess_deleted": True,
            "_vitess_deleted_at": 5,
            "_vitess_op": "delete",
            "_vitess_window_seq": 2,
        },
    ]
    assert_soft_delete("s", soft, source, gone={2})
    with pytest.raises(AssertionError, match="deleted, not flagged"):  # a tombstone erased (item 5)
        assert_soft_delete("s", soft[:1], source, gone={2})
    hashed = as_target([{"id": 1, "note": "b", "extra": None}], hashed={"note": hasher("s")})
    assert hashed == [{"id": 1, "note": hasher("s")(b"b"), "extra": None}]
    assert_mirror("m", [{"id": 1, "note": hasher("s")(b"b")}], hashed)  # a column added, NULL: no loss
    with pytest.raises(AssertionError, match="hold values"):
        assert_mirror("m", [{"id": 1}], hashed)
    # A key override (id, vid): a moved key's tombstone beside its live row; a live key flagged fails.
    moved = [
        {**soft[0], "vid": 7, "_vitess_deleted": True, "_vitess_deleted_at": 4},
        {**soft[0], "vid": 8},
        soft[1] | {"vid": 9},
    ]
    assert_soft_delete("s", moved, [{"id": 1, "note": "b", "vid": 8}], gone={2}, key=["id", "vid"])
    with pytest.raises(AssertionError, match="deleted, not flagged"):  # id 2's tombstone lost
        assert_soft_delete("s", moved[:2], [{"id": 1, "note": "b", "vid": 8}], gone={2}, key=["id", "vid"])
    # The cut: each mode's rows as the source they say; a table a window behind is caught.
    at_cut = {
        "h": current_rows("history", history),
        "s": current_rows("soft_delete", soft),
        "c": current_rows("changelog", log),
    }
    assert at_cut["h"] == [{"id": 1, "note": "b"}]
    assert_cut_consistent("cut", at_cut, ["id", "note"])
    with pytest.raises(AssertionError, match="at the cut differ"):
        assert_cut_consistent("cut", {**at_cut, "m": [{"id": 1, "note": "a"}]}, ["id", "note"])


def test_a_seed_ended_by_an_error_is_logged_as_failed_not_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed that an error or Ctrl-C ends (not an oracle's assertion) is a failure in its line,
    the tally and MATRIX_LOG: before, its result kept ``failure`` None and read "ok" (seed 28 of
    session 25, interrupted, was logged as passed). No server: the run fails at its first step."""
    from tests.support import matrix_soak

    def no_server(*_: object) -> None:
        raise ConnectionError("vtgate is not there")

    monkeypatch.setattr(matrix_soak, "create_tables", lambda *_: None)
    monkeypatch.setattr(MatrixSoak, "_write_dag", lambda self: None)
    monkeypatch.setattr(matrix_soak.ModesWorkload, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(matrix_soak.ModesWorkload, "initial", no_server, raising=False)
    soak = MatrixSoak(None, None, Path("/nonexistent"), draw(28), "sc://unused")  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        soak.run()
    assert soak.result is not None
    assert soak.result.failure == "at the snapshot: ConnectionError: vtgate is not there"
    assert "| FAILED at the snapshot: ConnectionError" in soak.result.line()
    assert json.loads(soak.result.to_json())["failure"] == soak.result.failure
    assert Tally([soak.result]).line().startswith("matrix soak tally: 1 seeds, 0 ok, 1 failed (seeds [28])")
