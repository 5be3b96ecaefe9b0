"""The matrix soak (issue 38 item 9): per seed, a drawn configuration and a drawn script of source
changes and operator events, run through the DAG factory in real Airflow (merges on Spark
Connect), every target checked by its mode's oracle (``mode_oracles``) after every DAG run.

The configuration: a target mode per table (three tables, three of the four modes), shard groups
(``capture_parallelism`` 1 or 2), a column choice on one table's non-key column ``note`` (none,
include the others, exclude it, hash it), ``max_events`` small or unbounded, the changes sensor on
or off, and with the sensor and one group a ``follow`` task (``on_changes`` and
``follow_seconds``: rounds of catch-up and merge in one task, killed mid-round too). The script:
steps, each optional operator events (``ADD COLUMN``, ``MODIFY COLUMN`` widening ``qty`` INT ->
BIGINT or ``note`` VARCHAR(64) -> VARCHAR(128), a re-snapshot of one table, a key override of one
table (``key_overrides`` ``id, vid`` written into the DAG, then the documented remedy
``{"resnapshot_tables": [t]}``), a fault in the step's DAG run: a SIGKILL of the process running
its tasks at a drawn point (rows staged, a group's part written, a merge's write started or
committed) and the killed task's rerun once its lock is stale, or with shard groups one group's
``catch_up`` failing and that map index cleared and run again alone) and source changes
(``modes_workload.EVENTS``: inserts, updates, deletes, moves between shards with either half
first, key changes, same-second delete and re-insert, a key written and deleted in one second by
two transactions, a large and a long transaction), then a DAG run and the oracles, and the
consistent cut at the committed position: every table read at its cut version holds the same rows
(the same statements ran on each in the same transactions). The first step is the snapshot (killed
too, in some seeds).

A failure names the seed, the configuration, the script and the step whose check failed (the
steps before it passed theirs: the script up to it is the shortest prefix that fails).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.groups import group_lock_id
from airflow_provider_vitess.checkpoints.locking import TASK_STALE_AFTER
from airflow_provider_vitess.consistent_reads import consistent_cut
from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.job.connect import remote_sessions
from airflow_provider_vitess.staging.hashing import hasher
from tests.support.airflow_env import CONNECT_MERGE, AirflowEnv
from tests.support.mode_oracles import (
    as_target,
    assert_changelog,
    assert_cut_consistent,
    assert_each_window_once,
    assert_history,
    assert_mirror,
    assert_soft_delete,
    current_rows,
    delta_dicts,
    source_dicts,
)
from tests.support.modes_workload import ModesWorkload, create_tables

TABLES = ("mx_0", "mx_1", "mx_2")
MODES = ("mirror", "soft_delete", "history", "changelog")
COLUMN_CHOICES = ("none", "include", "exclude", "hash")
SALT = "mx-salt-7f3a"
SALT_CONN = "mx_hash_salt"
SMALL_MAX_EVENTS = 25
SENSOR_TIMEOUT = 30
FOLLOW_SECONDS = 5  # a follow task's rounds after its first: the step's changes are in by then
# Changes a step draws from (``big`` and ``long_transaction`` rarer, and last: they take many keys).
COMMON_EVENTS = (
    "insert", "update", "delete", "move", "move_insert_first", "key_change", "delete_reinsert",
    "write_then_delete",
)  # fmt: skip
WIDENED = ("qty", "note")  # the columns MODIFY COLUMN widens (modes_workload.modify_column)
OVERRIDE_KEY = ["id", "vid"]  # a key override: the key plus the vindex column
# The columns every table shows in clear whatever the column choice: the cut's comparison.
CUT_COLUMNS = ("id", "vid", "qty")


@dataclass(frozen=True)
class Config:
    seed: int
    modes: dict[str, str]
    capture_parallelism: int
    column_choice: str  # one of COLUMN_CHOICES, on ``column_table``'s column ``note``
    column_table: str
    max_events: int | None
    sensor: bool
    follow: bool = False  # on_changes and follow_seconds: a follow task catches up and merges

    def summary(self) -> str:
        cols = "" if self.column_choice == "none" else f" {self.column_choice}({self.column_table}.note)"
        return (
            " ".join(f"{t}={m}" for t, m in self.modes.items())
            + f" groups={self.capture_parallelism}{cols} max_events={self.max_events or 'unbounded'}"
            + f" sensor={'on' if self.sensor else 'off'}"
            + (" follow" if self.follow else "")
        )


@dataclass(frozen=True)
class Step:
    events: tuple[str, ...]
    add_column: str | None = None
    resnapshot: str | None = None
    modify: str | None = None  # a column of WIDENED
    key_override: str | None = None  # a table: OVERRIDE_KEY, then re-snapshotted
    faults: dict[str, Any] | None = None  # the run's (capture_child.install_faults)

    def summary(self) -> str:
        ops = (
            ([f"ADD COLUMN {self.add_column}"] if self.add_column else [])
            + ([f"MODIFY COLUMN {self.modify}"] if self.modify else [])
            + ([f"key override {self.key_override}"] if self.key_override else [])
            + ([f"resnapshot {self.resnapshot}"] if self.resnapshot else [])
            + ([f"faults {json.dumps(self.faults)}"] if self.faults else [])
        )
        return "; ".join([*ops, ",".join(self.events)])


@dataclass
class Plan:
    config: Config
    initial_rows: int
    steps: list[Step]
    snapshot_faults: dict[str, Any] | None = None

    def describe(self, upto: int | None = None) -> str:
        steps = self.steps if upto is None else self.steps[: upto + 1]
        faults = f" (faults {json.dumps(self.snapshot_faults)})" if self.snapshot_faults else ""
        lines = [
            f"seed {self.config.seed}: {self.config.summary()}; {self.initial_rows} rows, then the "
            f"snapshot{faults}"
        ]
        lines += [f"  step {i + 1}: {s.summary()}" for i, s in enumerate(steps)]
        return "\n".join(lines)


def _kill(rng: random.Random, groups: int, rows: int) -> dict[str, Any]:
    """A SIGKILL at a drawn point of a run: after ``1..rows`` rows staged, a group's part written
    before it is recorded (shard groups), a merge's write started or its commit done."""
    kinds = ["rows", "writing", "committed"] + (["before_record"] if groups > 1 else [])
    kind = rng.choice(kinds)
    if kind == "rows":
        return {"kill_after_rows": rng.randint(1, rows)}
    if kind == "before_record":
        return {"kill_before_record": True}
    return {"kill_at_merge_phase": [kind, rng.randint(1, 3)]}


def draw(seed: int, *, steps: int | None = None, every_event: bool = False, no_kill: bool = False) -> Plan:
    """The seed's configuration and script (module docstring); ``steps`` fixes their number,
    ``every_event`` has each step make each change once, ``no_kill`` draws no SIGKILL (a kill's
    rerun waits for the killed task's lock to go stale: 2 minutes)."""
    rng = random.Random(seed)
    modes = dict(zip(TABLES, rng.sample(MODES, len(TABLES)), strict=True))
    config = Config(
        seed=seed,
        modes=modes,
        capture_parallelism=rng.choice((1, 2)),
        column_choice=rng.choice(COLUMN_CHOICES),
        column_table=rng.choice(TABLES),
        max_events=rng.choice((SMALL_MAX_EVENTS, None)),
        sensor=rng.random() < 0.5,
    )
    # Drawn apart, so that the seeds drawn before the follow task existed keep their plans.
    if config.sensor and config.capture_parallelism == 1 and random.Random(f"follow {seed}").random() < 0.7:
        config = replace(config, follow=True)
    n = steps if steps is not None else rng.randint(3, 5)
    initial_rows = rng.randint(30, 60)
    snapshot_faults = None if no_kill or rng.random() >= 0.2 else _kill(rng, config.capture_parallelism, 40)
    script: list[Step] = []
    widen = list(WIDENED)
    overridden = False
    for i in range(n):
        if every_event:  # each common event once, in a drawn order
            events = ["insert", *rng.sample(COMMON_EVENTS, len(COMMON_EVENTS))]
        else:
            events = ["insert"] + [rng.choice(COMMON_EVENTS) for _ in range(rng.randint(4, 9))]
        events += [e for e in ("long_transaction", "big") if rng.random() < 0.3]
        add = f"extra_{i}" if rng.random() < 0.25 else None
        resnap = rng.choice(TABLES) if i > 0 and rng.random() < 0.3 else None
        modify = widen.pop(rng.randrange(len(widen))) if widen and rng.random() < 0.3 else None
        override = rng.choice(TABLES) if not overridden and rng.random() < 0.2 else None
        overridden = overridden or override is not None
        faults: dict[str, Any] | None = None
        fault = rng.random()
        if config.capture_parallelism > 1 and fault < 0.25:
            faults = {"fail_group": rng.choice((0, 1))}
        elif not no_kill and 0.25 <= fault < 0.5:
            faults = _kill(rng, config.capture_parallelism, 20)
        script.append(Step(tuple(events), add, resnap, modify, override, faults))
    return Plan(config, initial_rows, script, snapshot_faults)


DAG = """
from airflow_provider_vitess.dag_factory import vitess_sync_dag

dag = vitess_sync_dag(
    "{sync}",
    keyspace="customer",
    tables={tables!r},
    staging_location="{lake}/staging",
    target_location="{lake}/delta",
    schedule=None,
    wait_for_changes={sensor},
    on_changes={follow},
    follow_seconds={follow_seconds},
    sensor_timeout={sensor_timeout},
    max_events={max_events},
    capture_parallelism={parallelism},
    targets={targets!r},
    include_columns={include!r},
    exclude_columns={exclude!r},
    hash_columns={hashed!r},
    hash_salt_conn_id={salt_conn!r},
    key_overrides={overrides!r},
    default_args={{"retries": 0}},
    merge_kwargs={merge},
)
"""


@dataclass
class SeedResult:
    seed: int
    config: str
    steps: int
    runs: int = 0
    seconds: float = 0.0
    failure: str | None = None  # the failed step and the oracle's message
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        result = "ok" if self.failure is None else "FAILED " + self.failure.splitlines()[0][:300]
        return (
            f"matrix seed {self.seed}: {self.config} | steps {self.steps}, runs {self.runs} | {result} | "
            f"{self.seconds:.0f} s"
            + (
                f" ({' '.join(f'{k} {v:.0f}' for k, v in self.extra['timings'])})"
                if self.extra.get("timings")
                else ""
            )
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Tally:
    results: list[SeedResult] = field(default_factory=list)

    def line(self) -> str:
        bad = [r.seed for r in self.results if r.failure]
        total = sum(r.seconds for r in self.results)
        return (
            f"matrix soak tally: {len(self.results)} seeds, {len(self.results) - len(bad)} ok, "
            f"{len(bad)} failed" + (f" (seeds {bad})" if bad else "") + f", {total:.0f} s"
        )


class MatrixSoak:
    """Runs one seed's plan; raises ``AssertionError`` naming the seed, configuration, script and
    the step that failed (its result also carries it)."""

    def __init__(
        self, hook: VitessHook, airflow: AirflowEnv, lake: Path, plan: Plan, spark_connect: str
    ) -> None:
        """``spark_connect``: the server the merges run on, which the checks read Delta with too
        (no Spark of the test's own to start: the fixed seed's share of ``make test``)."""
        self.hook, self.airflow, self.lake, self.plan = hook, airflow, lake, plan
        self.spark_connect = spark_connect
        self.config = plan.config
        self.sync = f"mx_seed_{self.config.seed}"
        self.result: SeedResult | None = None
        self.timings: list[tuple[str, float]] = []  # seconds of each DAG run and check
        self.keys: dict[str, list[str]] = {}  # the key overrides written into the DAG
        self.unseen: dict[str, set[int]] = {}  # per table: keys a re-snapshot never saw
        self.faults: dict[str, int] = {}  # "landed ..." / "missed ..." -> count

    def run(self) -> SeedResult:
        c = self.config
        self.result = result = SeedResult(c.seed, c.summary(), len(self.plan.steps))
        started = time.monotonic()
        create_tables(self.hook, TABLES)
        self._write_dag()
        workload = ModesWorkload(self.hook, TABLES, seed=c.seed)
        step_name = "the snapshot"
        try:
            workload.initial(self.plan.initial_rows)
            result.runs += self._run_and_check(
                workload, conf=None, snapshot=True, faults=self.plan.snapshot_faults
            )
            for i, step in enumerate(self.plan.steps):
                step_name = f"step {i + 1} ({step.summary()})"
                if step.add_column:
                    workload.add_column(step.add_column)
                if step.modify:
                    workload.modify_column(step.modify)
                if step.key_override:  # the DAG changed, then the remedy the docs name
                    self.keys[step.key_override] = OVERRIDE_KEY
                    self._write_dag()
                born = workload.next_id
                workload.step(step.events)
                again = sorted({t for t in (step.resnapshot, step.key_override) if t})
                # Keys born and deleted between the last merge and a re-snapshot's copy never
                # reach the table: the copy is the one difference (docs/target-modes.md), so no
                # tombstone of them in a soft_delete.
                for t in again:
                    self.unseen.setdefault(t, set()).update(
                        k for k in range(born, workload.next_id) if workload.record.now(k) is None
                    )
                conf = {"resnapshot_tables": again} if again else None
                result.runs += self._run_and_check(workload, conf=conf, faults=step.faults)
        except AssertionError as exc:
            result.failure = f"at {step_name}: {exc}"
            upto = None if step_name == "the snapshot" else self.plan.steps.index(step)
            raise AssertionError(
                f"matrix soak seed {c.seed} failed at {step_name}; the script up to it (the earlier "
                f"steps' checks passed):\n{self.plan.describe(upto)}\n{exc}"
            ) from exc
        except BaseException as exc:  # an error, a timeout, Ctrl-C: the seed did not pass either
            result.failure = f"at {step_name}: {type(exc).__name__}: {exc}"
            raise
        finally:
            result.seconds = time.monotonic() - started
            result.extra["timings"] = self.timings
            result.extra["faults"] = self.faults
        return result

    def _write_dag(self) -> None:
        c, t = self.config, self.config.column_table
        choice = c.column_choice
        self.airflow.env[f"AIRFLOW_CONN_{SALT_CONN.upper()}"] = json.dumps(
            {"conn_type": "generic", "password": SALT}
        )
        source = DAG.format(
            sync=self.sync,
            tables=list(TABLES),
            lake=self.lake,
            sensor=c.sensor,
            follow=c.follow,
            follow_seconds=FOLLOW_SECONDS if c.follow else None,
            sensor_timeout=SENSOR_TIMEOUT,
            max_events=c.max_events,
            parallelism=c.capture_parallelism,
            targets={table: {"mode": mode} for table, mode in c.modes.items()},
            include={t: ["id", "vid", "qty"]} if choice == "include" else {},
            exclude={t: ["note"]} if choice == "exclude" else {},
            hashed={t: ["note"]} if choice == "hash" else {},
            salt_conn=SALT_CONN if choice == "hash" else None,
            overrides={t: {"source_unique_key_columns": k} for t, k in self.keys.items()},
            merge=CONNECT_MERGE,
        )
        self.airflow.write_dag(self.sync, source)

    def _run_and_check(
        self,
        workload: ModesWorkload,
        conf: dict[str, Any] | None,
        snapshot: bool = False,
        faults: dict[str, Any] | None = None,
    ) -> int:
        """One DAG run (``faults`` injected in it, :meth:`_faulted`) and the oracles. With shard
        groups and ``max_events`` a run reads one window (each group's read bounded), so the run
        is repeated while it commits windows and the targets are behind; returns the number of
        runs."""
        runs, committed = 0, self._committed()
        while True:
            t0 = time.monotonic()
            date = datetime.now(UTC).isoformat()
            result = self.airflow.run_dag(self.sync, conf=conf or {}, logical_date=date, faults=faults)
            if faults:
                result = self._faulted(result, faults, conf, date)
            self.timings.append(("run", round(time.monotonic() - t0, 1)))
            runs += 1
            failed = {t: s for t, s in result["tasks"].items() if s not in ("success", "skipped")}
            assert result["state"] == "success" and not failed, (
                f"DAG run {result['state']}: tasks {result['tasks']}\n{str(result['log'])[-4000:]}"
            )
            if runs == 1:  # a run with the sensor finds no change after a first snapshot
                merge = "follow" if self.config.follow else "merge"
                must = ["merge_snapshot"] if snapshot else [merge] + (["merge_snapshot"] if conf else [])
                idle = {t: result["tasks"].get(t) for t in must if result["tasks"].get(t) != "success"}
                assert not idle, f"the run's merges did not run: {result['tasks']}"
            faults = None
            try:
                t0 = time.monotonic()
                self.check(workload)
                self.timings.append(("check", round(time.monotonic() - t0, 1)))
                return runs
            except AssertionError:
                now = self._committed()
                behind_by_design = self.config.capture_parallelism > 1 and self.config.max_events
                if not behind_by_design or now == committed or runs >= 8:
                    raise
                committed, conf = now, None

    def _faulted(
        self, result: dict[str, Any], faults: dict[str, Any], conf: dict[str, Any] | None, date: str
    ) -> dict[str, Any]:
        """The run after its fault: a kill that landed (the process running the tasks died) is
        resumed once the killed task's lock is stale, the killed task and its downstream run
        again; a failed group's map index is cleared and run again alone (the other group's
        task instance keeps its success and does not run again). A fault that did not land (the
        run never reached its point) is counted as missed."""
        what = next(iter(faults))
        if result.get("killed"):
            self._await_stale_locks()
        elif "fail_group" in faults and result["state"] == "failed":
            group = faults["fail_group"]
            task = _failed_group_task(result, group)
            mapped = {int(g): s for g, s in result["mapped"][task].items()}  # JSON keys
            assert all(s == "success" for g, s in mapped.items() if g != group), (
                f"{task} group {group} failed, the others not successful: {result['mapped']}\n"
                f"{result['log'][-3000:]}"
            )
        else:
            self.faults[f"missed {what}"] = self.faults.get(f"missed {what}", 0) + 1
            return result
        self.faults[f"landed {what}"] = self.faults.get(f"landed {what}", 0) + 1
        resumed = self.airflow.run_dag(self.sync, conf=conf or {}, logical_date=date, resume=True)
        if "fail_group" in faults:
            task = _failed_group_task(result, faults["fail_group"])
            others = [int(g) for g in result["mapped"][task] if int(g) != faults["fail_group"]]
            rerun = [g for g in others if f"task_id={task} map_index={g}" in resumed["log"]]
            assert not rerun, f"{task} groups {rerun} ran again with the failed one: {resumed['log'][-3000:]}"
        return resumed

    def _await_stale_locks(self) -> None:
        """A killed task keeps the sync's lock (or its group's) until no heartbeat for
        ``TASK_STALE_AFTER``: its rerun waits as Airflow's retry delay would."""
        db = self.airflow.home / "vitess_sync.db"
        store = CheckpointStore(f"sqlite:///{db}")
        ids = [self.sync, *(group_lock_id(self.sync, g) for g in range(self.config.capture_parallelism))]
        while True:
            beats = [h.heartbeat_at for i in ids if (h := store.lock_holder(i)) is not None]
            fresh = [b for b in beats if datetime.now(UTC) - b < TASK_STALE_AFTER + timedelta(seconds=2)]
            if not fresh:
                return
            time.sleep(2)

    def _committed(self) -> int:
        """The sync's committed window seq (0 before the first run made the store)."""
        db = self.airflow.home / "vitess_sync.db"
        return CheckpointStore(f"sqlite:///{db}").committed(self.sync)[1] if db.exists() else 0

    def check(self, workload: ModesWorkload) -> None:
        gone = {k for k, states in workload.record.states.items() if states[-1] is None}
        with remote_sessions(self.spark_connect) as new_session:
            spark = new_session()
            sources: dict[str, list[dict[str, Any]]] = {}
            for table, mode in self.config.modes.items():
                path = self.lake / "delta" / table
                rows = delta_dicts(path, spark)
                source = self._as_target(table, source_dicts(self.hook, "customer", table))
                what = f"{table} ({mode})"
                if mode == "mirror":
                    assert_mirror(what, rows, source)
                elif mode == "soft_delete":
                    seen = gone - self.unseen.get(table, set())
                    assert_soft_delete(what, rows, source, seen, key=self.keys.get(table, ["id"]))
                elif mode == "history":
                    assert_history(what, rows, source)
                else:
                    assert_changelog(what, rows, source)
                assert_each_window_once(what, path)
                sources[table] = source
            self._check_cut(spark, sources)

    def _check_cut(self, spark: Any, sources: dict[str, list[dict[str, Any]]]) -> None:
        """The consistent cut at the committed position (``consistent_reads``): every table at
        its cut version holds the same rows; at the committed window itself, the source's."""
        db = self.airflow.home / "vitess_sync.db"
        store = CheckpointStore(f"sqlite:///{db}")
        cut = consistent_cut(store, self.sync)
        assert set(cut.tables) == set(TABLES), f"the cut at window {cut.seq} lacks tables: {cut}"
        at_cut = {
            t: current_rows(self.config.modes[t], delta_dicts(v.path, spark, version=v.version))
            for t, v in cut.tables.items()
        }
        assert_cut_consistent(f"the cut at window {cut.seq}", at_cut, CUT_COLUMNS)
        if cut.seq == store.committed(self.sync)[1]:
            at_cut["source"] = sources[TABLES[0]]
            assert_cut_consistent(f"the cut at the committed window {cut.seq}", at_cut, CUT_COLUMNS)

    def _as_target(self, table: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        c = self.config
        if table != c.column_table or c.column_choice == "none":
            return rows
        if c.column_choice == "hash":
            return as_target(rows, hashed={"note": hasher(SALT)})
        if c.column_choice == "exclude":
            return as_target(rows, dropped=["note"])
        return as_target(
            rows, dropped=[k for k in (rows[0] if rows else {}) if k not in ("id", "vid", "qty")]
        )


def _failed_group_task(result: dict[str, Any], group: int) -> str:
    """The mapped task whose ``group`` the ``fail_group`` fault failed: a catch-up group, or a
    snapshot group when the step re-snapshots a table (the fault fails whichever group records
    its part first, and a grouped snapshot's copies record theirs the same way)."""
    for task in ("snapshot", "catch_up"):
        if result["mapped"].get(task, {}).get(str(group)) == "failed":
            return task
    raise AssertionError(
        f"fail_group {group}: no group task failed: {result['mapped']}\n{result['log'][-3000:]}"
    )
