"""The versions the package claims are the ones the tests run on, and the Spark provider's private
attributes the merge operator relies on still exist (a Spark provider release renaming them must
fail here, not silently change the merge)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
import sys
from importlib.metadata import version
from types import ModuleType
from typing import Any

import pytest
import tomllib
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from packaging.requirements import Requirement
from packaging.version import Version

from airflow_provider_vitess.merge.spark_conf import (
    ICEBERG_EXTENSIONS,
    installed_spark_line,
    packages_for,
    spark_conf,
)
from airflow_provider_vitess.operators import merge_backends
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.operators.merge_backends import SUBMIT_ARGS
from airflow_provider_vitess.versions import (
    AIRFLOW_PINS,
    AIRFLOW_RELEASES,
    SPARK_LINES,
    UnsupportedSparkVersionError,
    iceberg_runtime,
    newest_spark_line,
    spark_line,
)
from tests.support.local import REPO


def _requirement(name: str, extra: str | None = None) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    [req] = [Requirement(r) for r in listed if Requirement(r).name == name]
    return req


def _floor(req: Requirement) -> Version:
    [low] = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return low


def _minor(v: str | Version) -> tuple[int, int]:
    parsed = Version(str(v))
    return parsed.major, parsed.minor


def test_the_claimed_airflow_versions_are_the_tested_minors_and_their_patch_releases() -> None:
    # The single source: versions.AIRFLOW_RELEASES (the newest patch of each minor), which
    # `make test-compat` installs one by one.
    req = _requirement("apache-airflow")
    tested = [Version(v) for v in AIRFLOW_RELEASES]
    assert _floor(req) == tested[0], f"pyproject claims {req}, the oldest tested Airflow is {tested[0]}"
    assert all(req.specifier.contains(v) for v in tested), (req, AIRFLOW_RELEASES)
    # No minor claimed that is not tested: every minor between the first and the last is in the
    # list, and the next minor is excluded.
    first, last = _minor(tested[0]), _minor(tested[-1])
    assert [_minor(v) for v in tested] == [(first[0], m) for m in range(first[1], last[1] + 1)]
    assert not req.specifier.contains(f"{last[0]}.{last[1] + 1}.0"), req
    # The repo's own .venv (make test) is the newest tested release.
    make = re.search(r"^AIRFLOW_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert make is not None and make[1] == AIRFLOW_RELEASES[-1], (make, AIRFLOW_RELEASES)
    assert str(version("apache-airflow")) in AIRFLOW_RELEASES


@pytest.mark.parametrize(
    ("package", "tested"),
    [
        ("pyspark", [line.pyspark for line in SPARK_LINES]),
        ("delta-spark", sorted({line.delta for line in SPARK_LINES}, key=Version)),
    ],
)
def test_the_claimed_spark_and_delta_releases_are_the_tested_ones(package: str, tested: list[str]) -> None:
    req = _requirement(package, "spark")
    assert _floor(req) == Version(tested[0]), f"pyproject claims {req}, the oldest tested is {tested[0]}"
    [high] = [Version(s.version) for s in req.specifier if s.operator == "<="]
    assert high == Version(tested[-1]), f"pyproject claims {req}, the newest tested is {tested[-1]}"
    assert all(req.specifier.contains(v) for v in tested), (req, tested)
    make = re.search(
        rf"^{'PYSPARK' if package == 'pyspark' else 'DELTA'}_VERSION \?= (\S+)$",
        (REPO / "Makefile").read_text(),
        re.MULTILINE,
    )
    assert make is not None and make[1] == tested[-1] == getattr(newest_spark_line(), package.split("-")[0])


def test_the_iceberg_tests_spark_is_the_line_with_an_iceberg_runtime() -> None:
    """The PySpark ``make test`` installs for the Iceberg tests is the one Spark line whose
    Iceberg runtime carries the window's marker (versions.py)."""
    from tests.support.iceberg_spark import PYSPARK

    [line] = [x for x in SPARK_LINES if x.iceberg]
    make = re.search(r"^ICEBERG_PYSPARK \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert make is not None and make[1] == PYSPARK == line.pyspark


@pytest.mark.parametrize(
    ("pyspark", "server"), [("3.5.9", "org.apache.spark:spark-connect_2.12:3.5.9"), ("4.2.0", None)]
)
def test_a_spark_connect_server_on_pyspark_3_gets_the_server_package_pyspark_4_ships(
    pyspark: str, server: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark 3.5 ships Spark Connect's client only: its server (dev/spark_connect.sh, make
    test-compat's spark-3.5 cell) loads the server package; PySpark 4 has it in pyspark/jars."""
    from airflow_provider_vitess.merge import spark_conf

    monkeypatch.setattr(spark_conf, "version", lambda name: pyspark)
    assert spark_conf.connect_server_package() == server


def test_the_installed_pyspark_and_delta_are_a_tested_pair() -> None:
    line = installed_spark_line()
    assert (version("pyspark"), version("delta-spark")) == (line.pyspark, line.delta)


def test_the_spark_provider_is_claimed_from_the_tested_releases() -> None:
    # Each Spark line pins the Spark provider it is tested with (5.x on Spark 3.5: 6.x requires
    # pyspark-client 4); the installed one is its line's.
    req = _requirement("apache-airflow-providers-apache-spark", "spark")
    pinned = {Version(p.split("==")[1]) for line in SPARK_LINES for p in line.pins if "apache-spark==" in p}
    assert _floor(req) == min(pinned) and all(req.specifier.contains(v) for v in pinned), (req, pinned)
    installed = Version(version("apache-airflow-providers-apache-spark"))
    assert f"apache-airflow-providers-apache-spark=={installed}" in installed_spark_line().pins


NEWER_SUBMIT_ARGS = {
    "post_submit_commands",
    "track_driver_via_k8s_api",
    "yarn_rm_auth",
    "yarn_track_via_rm_api",
}


def test_a_spark_submit_argument_the_installed_hook_lacks_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a Spark provider older than an argument (5.6.0 has no ``yarn_rm_auth``), the operator
    refuses it when the DAG is parsed, naming it and the installed release; the others build."""
    from airflow_provider_vitess.operators import merge_backends

    older = merge_backends.hook_parameters() - NEWER_SUBMIT_ARGS
    monkeypatch.setattr(merge_backends, "hook_parameters", lambda: older)
    base: dict[str, Any] = {"task_id": "m", "sync_id": "s", "target_location": "/t"}
    assert VitessMergeOperator(**base, executor_memory="2g").submit_arguments()["executor_memory"] == "2g"
    refused = (
        "VitessMergeOperator: yarn_rm_auth: not taken by the installed apache-airflow-providers-apache-spark"
    )
    with pytest.raises(ValueError, match=refused + r" \S+'s SparkSubmitHook; upgrade that provider"):
        VitessMergeOperator(**base, yarn_rm_auth="kerberos")


def test_the_merge_uses_spark_submits_public_surface_only() -> None:
    # The spark-submit backend builds SparkSubmitHook from the operator's arguments and calls its
    # submit/on_kill: every argument the operator passes on is a parameter of the installed hook.
    # The floor's hook (apache-spark 5.6.0, make test-compat's spark-3.5 cell) lacks these four,
    # which the operator then refuses by name (below); none other may be missing.
    params = inspect.signature(SparkSubmitHook.__init__).parameters
    assert SUBMIT_ARGS - set(params) <= NEWER_SUBMIT_ARGS
    for name in ("submit", "on_kill"):
        assert callable(getattr(SparkSubmitHook, name))
    op = VitessMergeOperator(
        task_id="m", sync_id="s", target_location="/t", conn_id="spark_x", executor_memory="2g", jars="a.jar"
    )
    args = op.submit_arguments()
    assert (args["conn_id"], args["executor_memory"], args["jars"]) == ("spark_x", "2g", "a.jar")
    assert args["name"] == "vitess-merge-s" and set(args) <= SUBMIT_ARGS


@pytest.mark.parametrize(
    ("spark", "package"),
    [
        ("3.5.1", "io.delta:delta-spark_2.12:3.3.2"),
        ("4.0.0", "io.delta:delta-spark_4.0_2.13:4.4.0"),
        ("4.1.4", "io.delta:delta-spark_4.1_2.13:4.4.0"),
        ("4.2.0", "io.delta:delta-spark_2.13:4.4.0"),
    ],
)
def test_the_delta_package_follows_the_clusters_spark_line(spark: str, package: str) -> None:
    assert spark_line(spark).delta_package == package
    assert packages_for(["/lake/t"], spark_version=spark) == package
    hadoop = spark_line(spark).hadoop_aws_package
    assert packages_for(["/lake/t", "s3a://b/s"], spark_version=spark) == f"{package},{hadoop}"
    # The connection's own coordinate wins, whatever the Spark.
    assert packages_for(["/lake/t"], spark_version=spark, delta_package="io.delta:x:1") == "io.delta:x:1"


@pytest.mark.parametrize("spark", ["4.3.0", "3.4.4", "5.0.0"])
def test_a_spark_without_a_tested_delta_is_refused_by_name(spark: str) -> None:
    with pytest.raises(UnsupportedSparkVersionError) as err:
        packages_for(["/lake/t"], spark_version=spark)
    message = str(err.value)
    assert f"Spark {spark}:" in message and "delta_package" in message
    assert "3.5, 4.0, 4.1, 4.2" in message
    if spark == "4.3.0":
        assert "no Delta Lake release supports Spark 4.3 yet" in message


@pytest.mark.parametrize("spark", ["3.5", "4.0", "4.2"])
def test_iceberg_targets_are_refused_by_name_on_a_spark_line_without_an_iceberg_runtime(spark: str) -> None:
    """Iceberg on the lines whose runtime carries a window's marker (Spark 4.1); the others are
    refused with why and where Iceberg runs, as is the job's conf that would load it."""
    assert iceberg_runtime(spark_line("4.1.3")) == "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
    with pytest.raises(UnsupportedSparkVersionError) as err:
        iceberg_runtime(spark_line(spark))
    message = str(err.value)
    assert f"Iceberg targets on Spark {spark}:" in message and "Spark 4.1 (org.apache.iceberg" in message
    assert "Remedy" in message
    if installed_spark_line().iceberg is None:
        with pytest.raises(UnsupportedSparkVersionError):
            spark_conf(iceberg=True)
    else:
        conf = spark_conf(iceberg=True)
        assert conf["spark.jars.packages"].endswith(installed_spark_line().iceberg or "")
        assert conf["spark.sql.extensions"].endswith(ICEBERG_EXTENSIONS)


def test_the_merge_operator_reads_the_clusters_spark_from_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = {"spark_version": "3.5.2", "delta_package": "io.delta:delta-spark_2.12:3.3.0"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "yarn", "extra": extra})
    )
    assert merge_backends._cluster_spark("spark_x") == extra
    assert merge_backends._cluster_spark("spark_absent") == {"spark_version": None, "delta_package": None}


def _compat_script() -> ModuleType:
    """dev/test_compat.py by path (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("compat_script", REPO / "dev" / "test_compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _matrix_rows(text: str) -> dict[str, list[str]]:
    """docs/installation.md's compatibility matrix: ``{cell: [its other columns]}``."""
    head = "| cell | Airflow | PySpark | Delta |"
    lines = text[text.index(head) :].splitlines()
    rows: dict[str, list[str]] = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cols = [c.strip() for c in line.strip("|").split("|")]
        rows[cols[0]] = cols[1:]
    return rows


def test_the_documented_matrix_is_the_cells_make_test_compat_runs() -> None:
    # The versions of each row, not its results: the unit step of make test-compat runs this
    # test before the run's results exist.
    compat = _compat_script()
    rows = _matrix_rows((REPO / "docs" / "installation.md").read_text())
    # versions.py as installed (the compat run's copy of the repo has no package source).
    cells = compat.cells(importlib.import_module("airflow_provider_vitess.versions"))
    assert list(rows) == [c.name for c in cells], "docs/installation.md's matrix is not make test-compat's"
    for cell in cells:
        airflow, pyspark, delta, *results = rows[cell.name]
        if cell.unavailable:
            assert "no Delta Lake release supports" in " ".join(results), (cell.name, results)
            continue
        assert (airflow, pyspark, delta) == (cell.airflow, cell.pyspark, cell.delta), cell.name


def test_the_installed_airflows_task_api_builds_with_its_pins() -> None:
    # Airflow 3.2.2 does not bound FastAPI or svcs; with FastAPI 0.137+ its execution API (what
    # every task talks to) failed at import. versions.AIRFLOW_PINS holds what it needs.
    from airflow.api_fastapi.execution_api.app import create_task_execution_api_app
    from airflow.api_fastapi.execution_api.routes import execution_api_router

    for pin in AIRFLOW_PINS.get(version("apache-airflow"), ()):
        req = Requirement(pin)
        assert req.specifier.contains(version(req.name)), (pin, version(req.name))
    assert create_task_execution_api_app() is not None
    paths = [getattr(route, "path", "") for route in execution_api_router.routes]
    assert any(p.startswith("/task-instances") for p in paths), paths


def test_the_celery_executor_of_the_fleet_imports_with_the_installed_celery() -> None:
    """`make fleet`'s workers run this module; Celery 5.7 broke it (``retry`` left
    ``celery.backends.database``) and dev/constraints.txt holds Celery back: a release that
    breaks it again fails here, in `make test`, not only at the fleet's start."""
    module = importlib.import_module("airflow.providers.celery.executors.celery_executor")
    assert module.app.main is not None
