"""The matrix soak (``matrix_soak``): per seed a drawn configuration (target mode per table, shard
groups, column choice, ``max_events``, the sensor) and script (changes, moves, same-second
deletes, key changes, long transactions, ADD COLUMN, a re-snapshot), through the DAG factory in
real Airflow, each mode's oracle after every run.

``make test`` runs the fixed seeds of :data:`FIXED_SEEDS` (short scripts, without the events of
bugs being fixed elsewhere). ``make soak-matrix SEEDS=50`` runs seeds 0-49 with full scripts
(every event drawn) and prints a line per seed and the tally; ``MATRIX_FIRST=n`` starts at seed
n, ``MATRIX_LOG=file`` appends each seed's result (a JSON line) there.
Reproduce one seed: ``MATRIX_FULL=1 pytest -m soak 'tests/integration/test_matrix_soak.py::test_matrix[7]'``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_vitess.hooks.vitess import VitessHook
from tests.conftest import LocalVitess, connection_uri_env, print_past_capture
from tests.integration.airflow_env import make_airflow_env
from tests.integration.matrix_soak import MatrixSoak, Tally, draw

pytestmark = pytest.mark.integration

FULL = os.environ.get("MATRIX_FULL", "") not in ("", "0")
SEEDS = int(os.environ.get("MATRIX_SEEDS", "50")) if FULL else 0  # make test: the fixed seeds only
FIRST = int(os.environ.get("MATRIX_FIRST", "0"))
# make test's seed (its ~90 s of the suite: two DAG runs): the snapshot, then one step making each
# change once. Seed 21 draws soft_delete, changelog and history, shard groups, a hashed column,
# an ADD COLUMN and a long transaction.
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
    plan = draw(seed) if full else draw(seed, steps=FIXED_STEPS, avoid_known_bugs=True, every_event=True)
    airflow = make_airflow_env(tmp_path / "af", vitess, spark_connect=spark_connect)
    soak = MatrixSoak(hook, airflow, tmp_path / "lake", plan)
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
    counts, each column choice, both max_events, the sensor both ways, every event."""
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
    events = {e for p in plans for s in p.steps for e in s.events}
    from tests.integration.modes_workload import EVENTS

    assert events == set(EVENTS)
    assert any(s.add_column for p in plans for s in p.steps) and any(
        s.resnapshot for p in plans for s in p.steps
    )
    fixed = [draw(s, steps=FIXED_STEPS, avoid_known_bugs=True, every_event=True) for s in FIXED_SEEDS]
    assert all(
        s.resnapshot is None or p.config.modes[s.resnapshot] in ("mirror", "changelog")
        for p in fixed
        for s in p.steps
    )
    assert json.loads(json.dumps([p.describe() for p in fixed]))
