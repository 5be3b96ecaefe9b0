"""The lock's takeover time the docs tell users is the one the tasks use."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta

from airflow_provider_vitess.capture.runner import CaptureRunner
from airflow_provider_vitess.merge.runner import MergeRunner
from tests.support.local import REPO

DOCS = REPO / "docs"


def _minutes(text: str) -> set[int]:
    return {int(m) for m in re.findall(r"(\d+) minutes", text)}


def test_the_docs_name_the_tasks_lock_takeover_time() -> None:
    used = {
        inspect.signature(cls).parameters["lock_stale_after"].default for cls in (CaptureRunner, MergeRunner)
    }
    assert len(used) == 1
    minutes = next(iter(used)) // timedelta(minutes=1)
    locked = next(
        line for line in (DOCS / "troubleshooting.md").read_text().splitlines() if "is locked by" in line
    )
    assert _minutes(locked) == {minutes}, locked
    design = (DOCS / "design.md").read_text()
    section = design[design.index("## The sync lock") :].split("\n## ")[0]
    assert _minutes(section) == {minutes}, section
