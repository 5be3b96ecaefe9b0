"""The versions the package claims are the ones the tests run on, and the Spark provider's private
attributes the merge operator relies on still exist (a Spark provider release renaming them must
fail here, not silently change the merge)."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from airflow_provider_vitess.merge.spark_conf import installed_spark_line
from airflow_provider_vitess.operators.merge import VitessMergeOperator
from airflow_provider_vitess.versions import AIRFLOW_RELEASES, SPARK_LINES, newest_spark_line
from tests.conftest import REPO


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


def test_the_installed_pyspark_and_delta_are_a_tested_pair() -> None:
    line = installed_spark_line()
    assert (version("pyspark"), version("delta-spark")) == (line.pyspark, line.delta)


def test_the_spark_provider_is_claimed_from_the_tested_release() -> None:
    req = _requirement("apache-airflow-providers-apache-spark", "spark")
    installed = Version(version("apache-airflow-providers-apache-spark"))
    assert req.specifier.contains(installed) and _floor(req) == installed, (req, installed)


def test_the_spark_submit_private_attributes_the_merge_relies_on_exist() -> None:
    op = VitessMergeOperator(task_id="m", sync_id="s", target_location="/t", conn_id="spark_x")
    # _local_master() reads the Spark connection id; _submit() drops the cached hook.
    assert op._conn_id == "spark_x"
    assert "_hook" in vars(op) and op._hook is None
