"""The seeded kill soak (``soak.py``): each seed a sync's snapshot, catch-ups and merges under
SIGKILLs and network cuts, rerun after each; target == source, each window once in Delta's log.

``make test`` runs seeds 0-4, each faulting one phase (seed % 3: snapshot, catch-up, merge;
seed 1 with the 100,000-row transaction). ``make soak SEEDS=50`` runs seeds 0-49 in full mode
(every phase faulted, several times, the big transaction in every seed) and prints the tally;
``SOAK_FIRST=n`` starts at seed n; ``SOAK_LOG=file`` also appends each seed's result (a JSON
line) there as it finishes.
Reproduce one seed: ``SOAK_FULL=1 pytest -m soak 'tests/integration/operations/test_soak.py::test_soak[7]'``.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.local import LocalVitess, print_past_capture
from tests.support.soak import PHASES, SeedPlan, Soak, Tally

pytestmark = [pytest.mark.integration, pytest.mark.soak]

FULL = os.environ.get("SOAK_FULL", "") not in ("", "0")
SEEDS = int(os.environ.get("SOAK_SEEDS", "5"))
FIRST = int(os.environ.get("SOAK_FIRST", "0"))  # to split a long soak over several runs
TALLY = Tally()


@pytest.fixture(scope="module")
def proxy(vitess: LocalVitess, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    p = FaultProxy(vitess.grpc_port)
    p.start()
    yield p
    p.stop()
    if TALLY.results:  # past pytest's capture: the tally is the soak's output
        print_past_capture(request.config, "\n" + TALLY.line())


def test_the_small_seeds_cover_every_phase() -> None:
    plans = [SeedPlan.for_seed(s, full=False) for s in range(5)]
    assert {p for plan in plans for p in plan.faulted} == set(PHASES)
    assert sum(plan.big_transaction_round is not None for plan in plans) == 1


@pytest.mark.parametrize("seed", range(FIRST, FIRST + SEEDS))
def test_soak(vitess: LocalVitess, proxy: FaultProxy, tmp_path: Path, seed: int) -> None:
    plan = SeedPlan.for_seed(seed, full=FULL)
    log = os.environ.get("SOAK_LOG")
    try:
        result = Soak(vitess, proxy, tmp_path, plan).run()
    except BaseException:
        if log:  # a long soak's log says at once which seed broke, and how
            with open(log, "a") as f:
                f.write(json.dumps({"seed": seed, "error": traceback.format_exc()[-6000:]}) + "\n")
        raise
    TALLY.results.append(result)
    if log:
        with open(log, "a") as f:
            f.write(result.to_json() + "\n")
    assert sum(result.faults.values()) >= 1, f"seed {seed}: no fault landed ({dict(result.missed)} missed)"
    assert not result.mismatches, f"seed {seed} ({plan}): " + "; ".join(result.mismatches)
    assert result.rows > 0 and result.windows == plan.windows + 1
