"""The versions the package claims are the ones the tests run on, and the Spark provider's private
attributes the merge operator relies on still exist (a Spark provider release renaming them must
fail here, not silently change the merge)."""

from __future__ import annotations

import re
from importlib.metadata import version

import tomllib
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from packaging.requirements import Requirement
from packaging.version import Version

from airflow_provider_vitess.operators.merge import VitessMergeOperator
from tests.conftest import REPO


def _requirement(name: str, extra: str | None = None) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    [req] = [Requirement(r) for r in listed if Requirement(r).name == name]
    return req


def _floor(req: Requirement) -> Version:
    [low] = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return low


def test_the_claimed_airflow_versions_are_the_tested_one_and_its_patch_releases() -> None:
    tested = re.search(r"^AIRFLOW_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert tested is not None
    req = _requirement("apache-airflow")
    assert _floor(req) == Version(tested[1]), f"pyproject claims {req}, the tests install {tested[1]}"
    assert Version(version("apache-airflow")) == Version(tested[1])
    assert not req.specifier.contains("3.4.0") and req.specifier.contains(tested[1])


def test_the_spark_provider_is_claimed_from_the_tested_release() -> None:
    req = _requirement("apache-airflow-providers-apache-spark", "spark")
    installed = Version(version("apache-airflow-providers-apache-spark"))
    assert req.specifier.contains(installed) and _floor(req) == installed, (req, installed)


def test_the_merge_uses_spark_submits_public_surface_only() -> None:
    # The spark-submit backend runs SparkSubmitOperator.execute/on_kill on the operator's
    # prepare_for_execution() copy, with public attributes set on the copy alone.
    op = VitessMergeOperator(task_id="m", sync_id="s", target_location="/t", conn_id="spark_x")
    assert op.spark_conn_id == "spark_x"
    job = op.prepare_for_execution()
    job.application_args = ["--plan-file", "p"]
    assert job is not op and op.application_args is None
    for name in ("execute", "on_kill"):
        assert callable(getattr(SparkSubmitOperator, name))
