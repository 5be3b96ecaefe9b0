"""A seeded model of one table's keys across a reshard, for the job tier: the source's truth and
the staged windows a sync would read of it, to check the merge's per-key rules against.

Shard ``0`` is split into ``-80`` and ``80-`` at one instant; from then on a row lives on the new
shard its customer hashes to (its row copied there without an event). One writer runs
transactions one after another, as ``test_reshard``'s workload does: a delete and re-insert with a
new customer (a move between shards after the switch), a delete, an update; a transaction's
shards commit one after another, in either order. Every shard stamps its commits with one clock,
in seconds. Windows stop at instants drawn over the run, so a stop can fall between the two
commits of a move; each window's look-back is the one :mod:`.lookback` reads of windows that
reached their stop: of the window before, each shard's events within ``CONTEXT_SECONDS`` of
that shard's newest one there, and of every earlier window the events from ``CONTEXT_SECONDS``
before the window's first commit on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from airflow_provider_vitess.merge.job.lookback import CONTEXT_SECONDS
from tests.support.staged_frames import numbered

T0 = 1_800_000_000
OLD, NEW = "0", ("-80", "80-")
RETIRED = {OLD: NEW}
STEPS = (0, 0, 1, 2, 3, 6)  # seconds between two transactions
KEYS_PER_SCENARIO = 2
# A staged row as tests.support.staged_frames.SCHEMA has it: op, shard, commit second, _seq, id,
# v, _before_id.
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Event:
    op: str
    shard: str
    ts: int
    key: int
    v: str | None
    before: int | None
    at: float  # the real instant it committed (orders the events; a stop falls between two)


@dataclass
class Scenario:
    """A few keys' life: the values a snapshot copied, the events, and the source's state at the
    end (None: the key is gone)."""

    copied: dict[int, str]
    events: list[Event]
    final: dict[int, str | None]


@dataclass
class Run:
    """Many scenarios over one switch and one set of window stops."""

    switch_at: int
    scenarios: list[Scenario]
    stops: list[float]

    @cached_property
    def windows(self) -> list[list[Event]]:
        """Each window's events in commit order: those before its stop and at or after the one
        before."""
        out: list[list[Event]] = [[] for _ in range(len(self.stops) + 1)]
        for s in self.scenarios:
            for e in s.events:
                out[sum(1 for stop in self.stops if e.at >= stop)].append(e)
        return out

    @property
    def copied(self) -> dict[int, str]:
        return {k: v for s in self.scenarios for k, v in s.copied.items()}

    @property
    def final(self) -> dict[int, str | None]:
        return {k: v for s in self.scenarios for k, v in s.final.items()}


def _home(customer: int, switched: bool) -> str:
    return NEW[customer % 2] if switched else OLD


def _scenario(rng: random.Random, base: int, switch_at: int, transactions: int) -> Scenario:
    state: dict[int, tuple[str, int, str] | None] = {}
    switched = switch_at <= T0
    copied = {}
    for key in range(base, base + KEYS_PER_SCENARIO):
        state[key] = None
        if rng.random() < 0.5:
            customer = rng.randint(0, 3)
            state[key] = (_home(customer, switched), customer, f"s{key}")
            copied[key] = f"s{key}"
    events: list[Event] = []
    t, n = T0, 0
    for _ in range(transactions):
        t += rng.choice(STEPS)
        if t >= switch_at and not switched:
            switched = True
            for key, row in state.items():
                if row is not None:  # the reshard's copy: no event
                    state[key] = (_home(row[1], True), row[1], row[2])
        tx: list[tuple[str, str, int, str | None, int | None]] = []
        for _ in range(rng.randint(1, 3)):
            key = base + rng.randrange(KEYS_PER_SCENARIO)
            row, r = state[key], rng.random()
            n += 1
            value = f"{key}-{n}"
            if r < 0.35:  # DELETE, then INSERT with a new customer: a move once they hash apart
                customer = rng.randint(0, 3)
                if row is not None:
                    tx.append(("delete", row[0], key, None, key))
                tx.append(("insert", _home(customer, switched), key, value, None))
                state[key] = (_home(customer, switched), customer, value)
            elif r < 0.6:
                if row is not None:
                    tx.append(("delete", row[0], key, None, key))
                    state[key] = None
            elif row is not None:
                tx.append(("update", row[0], key, value, key))
                state[key] = (row[0], row[1], value)
        # The transaction's shards commit one after another, in either order.
        shards = list(dict.fromkeys(e[1] for e in tx))
        rng.shuffle(shards)
        earlier_in_second = sum(1 for e in events if e.ts == t)
        ordered = [e for s in shards for e in tx if e[1] == s]
        for j, (op, shard, key, after, before) in enumerate(ordered):
            at = t + 0.01 * (earlier_in_second + 1) + 0.0001 * j
            events.append(Event(op, shard, t, key, after, before, at))
    final = {k: (row[2] if row else None) for k, row in state.items()}
    return Scenario(copied, events, final)


def draw(seed: int, scenarios: int = 40, transactions: int = 20) -> Run:
    """The seed's run: its switch, its scenarios (keys 100 apart) and its windows."""
    rng = random.Random(seed)
    switch_at = T0 + rng.randint(0, transactions)
    drawn = [_scenario(rng, 100 * j, switch_at, transactions) for j in range(scenarios)]
    count = rng.choice([2, 3, 4])
    stops = sorted(T0 + rng.random() * transactions * 1.2 for _ in range(count - 1))
    return Run(switch_at, drawn, stops)


def staged(run: Run, w: int, back: int = 0) -> list[Row]:
    """Window ``w``'s staged rows, ``_seq`` 1, 2, ... in commit order (each shard's binlog order);
    ``back``: as the context of the window that many later."""
    return numbered(((e.op, e.shard, e.ts, e.key, e.v, e.before) for e in run.windows[w]), back)


def context(run: Run, w: int) -> list[Row]:
    """The look-back's events of window ``w`` (module docstring), ``_seq`` shifted per window back."""
    mine = run.windows[w]
    if not mine:
        return []
    since = min(e.ts for e in mine) - CONTEXT_SECONDS
    out = []
    for back in range(1, w + 1):
        earlier = staged(run, w - back, back)
        newest: dict[str, int] = {}
        for r in earlier:
            newest[r[1]] = max(newest.get(r[1], 0), r[2])
        for r in earlier:
            shard, ts = r[1], r[2]
            if ts >= since or (back == 1 and ts >= newest[shard] - CONTEXT_SECONDS):
                out.append(r)
    return out


def retired(run: Run, w: int) -> dict[str, tuple[str, ...]]:
    """The reshard's retired shard once window ``w`` ends after the switch."""
    ends = run.stops[w] if w < len(run.stops) else float("inf")
    return dict(RETIRED) if ends > run.switch_at else {}


def covered(run: Run, w: int) -> dict[str, int]:
    """Every shard read to the window's stop: its newest commit second."""
    top = max((e.ts for e in run.windows[w]), default=T0)
    return dict.fromkeys((OLD, *NEW), top)
