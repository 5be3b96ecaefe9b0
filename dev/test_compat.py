"""``make test-compat``: the provider on every Airflow minor and every Spark/Delta pair it claims.

The releases come from airflow_provider_vitess/versions.py, the one list that pyproject.toml's
ranges are checked against (tests/unit/floor/test_versions.py). The cells are each Airflow minor with
the newest Spark line, and each other Spark line with the newest Airflow (not the full cross
product: what differs between Airflow minors is on the Airflow worker, what differs between
Spark lines is in the merge job). Each cell runs, as a user installs the provider: the repo
built into a wheel, installed into a venv of its own (kept in --cache-dir and reused; the wheel
is reinstalled every run), then from a copy of the repo WITHOUT the package source (so every
import is the installed wheel's):

* unit     tests/unit and tests/job (but the repository checks of test_repo_standalone.py,
           which need git)
* dag-sync the DAG factory's sync through dag.test(): snapshot, workload, catch-up, merge
           through the cell's spark-submit, Delta == SELECT * (tests/integration/dags/test_dag_sync.py)
* merge    the merge tests whose behaviour depends on the Spark/Delta line
           (tests/integration/merge/test_merge_delta.py but the kill and standalone-cluster tests,
           test_merge_drop_columns.py)

* spark4-tables  (Spark 3 cells only) tables the repo's own venv (Spark 4) merged, read by the
           cell's Spark: the default protocol equal to ``SELECT *``, a table with a chosen
           reader-locking feature read or refused as docs/reading-the-tables.md says, the
           other target modes' tables as Spark 4 read them (dev/compat_tables.py)

Prints the matrix (pass/fail with versions and times); exits non-zero unless every cell that
can be installed here passes. Spark lines no Delta release supports are shown as such
(versions.UNSUPPORTED_SPARK). Needs the local Vitess cluster (the Makefile target starts it).

Usage: python3 dev/test_compat.py [--cache-dir DIR] [--only airflow|spark|CELL...] [--keep-going]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
UNIT = ["tests/unit", "tests/job", "--deselect", "tests/unit/house/test_repo_standalone.py"]
DAG_SYNC = [
    "tests/integration/dags/test_dag_sync.py::test_first_run_snapshots_and_later_runs_catch_up_to_the_source"
]
# The merge tests whose behaviour depends on the Spark line and its Delta (types, MERGE and replace
# commits, transaction ids, deletion vectors, column mapping, a widening by rewrite on Delta 3).
# Left out: killing spark-submit at random points and the standalone cluster, which test the
# job's process and cluster handling (the same on every line) and took most of the ~7 minutes.
MERGE = [
    "tests/integration/merge/test_merge_delta.py",
    "tests/integration/merge/test_merge_drop_columns.py",
    "-k",
    "not killed_at_random_points and not standalone_spark_cluster",
]
STEPS: dict[str, list[str]] = {"unit": UNIT, "dag-sync": DAG_SYNC, "merge": MERGE}
# Left out of the unit step on Spark 3 cells: the table-format contract over Spark Connect. PySpark
# 3.5 ships no Connect server; its server package (org.apache.spark:spark-connect_2.12 of the
# cell's release, 3.5.9) is not among the Maven artifacts this machine is served (3.5.7 is: a
# server one patch release off the cell's Spark would test a mix no user runs). The Connect
# merge is tested on every Spark 4 cell.
SPARK3_UNIT_DESELECT = ["-k", "not (test_table_formats and connect)"]
# The spark-submit the DAG tests' merges go through instead of the suite's Spark Connect server.
SUBMIT_ENV = "VITESS_TEST_SPARK_SUBMIT"
# Not a pytest run: the writer is another venv than the cell's (run_spark4_tables).
SPARK4_TABLES = "spark4-tables"


def _versions() -> ModuleType:
    """versions.py by path: it imports nothing but the standard library, and no venv exists yet."""
    spec = importlib.util.spec_from_file_location(
        "compat_versions", REPO / "airflow_provider_vitess" / "versions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass
class Cell:
    name: str
    airflow: str
    pyspark: str
    delta: str
    pins: tuple[str, ...] = ()
    unavailable: str | None = None
    results: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            self.unavailable is None
            and all(r == "pass" for r in self.results.values())
            and bool(self.results)
        )


def cells(v: ModuleType) -> list[Cell]:
    newest_airflow, newest_line = v.AIRFLOW_RELEASES[-1], v.SPARK_LINES[-1]
    out = [
        Cell(
            f"airflow-{'.'.join(a.split('.')[:2])}",
            a,
            newest_line.pyspark,
            newest_line.delta,
            (*newest_line.pins, *v.AIRFLOW_PINS.get(a, ())),
        )
        for a in v.AIRFLOW_RELEASES
    ]
    out += [
        Cell(
            f"spark-{line.spark}",
            newest_airflow,
            line.pyspark,
            line.delta,
            (*line.pins, *v.AIRFLOW_PINS.get(newest_airflow, ())),
        )
        for line in v.SPARK_LINES[:-1]
    ]
    out += [
        Cell(f"spark-{s}", newest_airflow, f"{s}.x", "-", unavailable=why)
        for s, why in v.UNSUPPORTED_SPARK.items()
    ]
    return out


def run(cmd: list[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> bool:
    with log.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return done.returncode == 0


def build_wheel(work: Path) -> Path:
    wheels = work / "wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    if not run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(wheels)],
        work / "wheel.log",
    ):
        raise SystemExit(f"building the wheel failed: {work / 'wheel.log'}")
    shutil.rmtree(REPO / "build", ignore_errors=True)
    [wheel] = wheels.glob("*.whl")
    return wheel


def source_copy(work: Path) -> Path:
    """The repo's files (tracked and new, as git sees them) without the package: the tests import
    the installed wheel, not the checkout."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if name.startswith("airflow_provider_vitess/") or not (REPO / name).is_file():
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    return src


def prepare(cell: Cell, wheel: Path, venvs: Path, logs: Path) -> Path | None:
    venv = venvs / f"af{cell.airflow}-sp{cell.pyspark}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    constraints = ["-c", str(REPO / "dev" / "constraints.txt")]
    if not (venv / "bin" / "python").exists() and not run(
        [sys.executable, "-m", "venv", str(venv)], logs / f"{cell.name}-venv.log"
    ):
        return None
    pins = [
        f"apache-airflow=={cell.airflow}",
        f"pyspark[connect]=={cell.pyspark}",
        f"delta-spark=={cell.delta}",
        *cell.pins,
    ]
    # Dependencies resolve once per venv (a no-op later); the wheel itself is this run's.
    ok = run(
        [*pip, *constraints, f"{wheel}[spark,s3,test]", *pins], logs / f"{cell.name}-install.log"
    ) and run([*pip, "--no-deps", "--force-reinstall", str(wheel)], logs / f"{cell.name}-wheel.log")
    return venv if ok else None


def installed(venv: Path, src: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, airflow_provider_vitess as p\n"
        "print(m.version('apache-airflow'), m.version('pyspark'), m.version('delta-spark'), p.__file__)"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=src, capture_output=True, text=True, check=True
    )
    airflow, pyspark, delta, where = out.stdout.split()[-4:]
    if str(venv) not in where:
        raise SystemExit(f"the tests would import the provider from {where}, not from {venv}")
    return {"airflow": airflow, "pyspark": pyspark, "delta": delta}


def run_spark4_tables(
    writer: Path, python: str, src: Path, env: dict[str, str], work: Path, logs: Path, cell: str
) -> bool:
    """dev/compat_tables.py: ``writer`` (Spark 4, the repo's own venv, the checkout's package)
    merges the tables, then the cell's ``python`` (the installed wheel) reads them."""
    out = work / SPARK4_TABLES
    shutil.rmtree(out, ignore_errors=True)
    script = "dev/compat_tables.py"
    written = run(
        [str(writer), str(REPO / script), "write", str(out)],
        logs / f"{cell}-{SPARK4_TABLES}-write.log",
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    return written and run(
        [python, str(src / script), "read", str(out)], logs / f"{cell}-{SPARK4_TABLES}.log", cwd=src, env=env
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_cache = Path.home() / ".cache" / "airflow-provider-vitess" / "compat"
    parser.add_argument("--cache-dir", type=Path, default=default_cache)
    parser.add_argument("--only", nargs="*", default=[], help="cells whose name starts with these")
    steps = [*STEPS, SPARK4_TABLES]
    parser.add_argument("--steps", nargs="*", default=steps, choices=steps)
    parser.add_argument(
        "--writer-python",
        type=Path,
        default=REPO / ".venv" / "bin" / "python",
        help=f"the Spark 4 venv that writes the {SPARK4_TABLES} step's tables (default: the repo's)",
    )
    args = parser.parse_args()
    v = _versions()
    work = args.cache_dir.resolve()
    venvs, logs = work / "venvs", work / "logs"
    venvs.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    chosen = [c for c in cells(v) if not args.only or any(c.name.startswith(o) for o in args.only)]
    if not chosen:  # a run that checks nothing must not pass
        names = ", ".join(c.name for c in cells(v))
        raise SystemExit(f"--only {' '.join(args.only)} matches no cell; the cells: {names}")
    started = time.monotonic()
    wheel = build_wheel(work)
    src = source_copy(work)
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done: dict[tuple[str, str, str], Cell] = {}
    for cell in chosen:
        if cell.unavailable:
            print(f"[compat] {cell.name}: unavailable ({cell.unavailable})", flush=True)
            continue
        key = (cell.airflow, cell.pyspark, cell.delta)
        if key in done:  # the newest Airflow with the newest Spark is both a row and a column
            cell.results, cell.seconds = done[key].results, 0.0
            continue
        t0 = time.monotonic()
        print(
            f"[compat] {cell.name}: Airflow {cell.airflow}, PySpark {cell.pyspark}, Delta {cell.delta}",
            flush=True,
        )
        venv = prepare(cell, wheel, venvs, logs)
        if venv is None:
            cell.results = {"install": "fail"}
        else:
            found = installed(venv, src)
            if (found["airflow"], found["pyspark"], found["delta"]) != key:
                raise SystemExit(f"{cell.name}: the venv holds {found}, not {key}")
            python = str(venv / "bin" / "python")
            for step in args.steps:
                log = logs / f"{cell.name}-{step}.log"
                if step == SPARK4_TABLES:
                    if not cell.pyspark.startswith("3."):
                        continue  # the writer's own line, or another Delta 4: shown as "-"
                    ok = run_spark4_tables(args.writer_python, python, src, env, work, logs, cell.name)
                    cell.results[step] = "pass" if ok else "fail"
                    print(f"[compat]   {step}: {cell.results[step]} ({log})", flush=True)
                    continue
                # The DAG's merges through the cell's own spark-submit (the suite's run on Spark
                # Connect: tests/integration/dags/test_dag_sync.py).
                step_env = dict(env)
                if step == "dag-sync":
                    step_env[SUBMIT_ENV] = str(venv / "bin" / "spark-submit")
                selected = [*STEPS[step]]
                if step == "unit" and cell.pyspark.startswith("3."):
                    selected += SPARK3_UNIT_DESELECT
                ok = run(
                    [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5", *selected],
                    log,
                    cwd=src,
                    env=step_env,
                )
                cell.results[step] = "pass" if ok else "fail"
                print(f"[compat]   {step}: {cell.results[step]} ({log})", flush=True)
        cell.seconds = time.monotonic() - t0
        done[key] = cell
    wall = time.monotonic() - started
    print_matrix(chosen, args.steps, wall)
    return 0 if all(c.passed or c.unavailable for c in chosen) else 1


def print_matrix(chosen: list[Cell], steps: list[str], wall: float) -> None:
    head = f"{'cell':<12} {'Airflow':<8} {'PySpark':<8} {'Delta':<6} " + " ".join(f"{s:<8}" for s in steps)
    print("\n" + head + " seconds")
    print("-" * (len(head) + 8))
    for c in chosen:
        row = f"{c.name:<12} {c.airflow:<8} {c.pyspark:<8} {c.delta:<6} "
        if c.unavailable:
            print(row + f"unavailable here: {c.unavailable}")
            continue
        cols = " ".join(f"{c.results.get(s, c.results.get('install', '-')):<8}" for s in steps)
        print(row + cols + (f" {c.seconds:.0f}" if c.seconds else " (same as above)"))
    print(f"\nwall time {wall / 60:.1f} min; logs in the cache dir's logs/")


if __name__ == "__main__":
    raise SystemExit(main())
