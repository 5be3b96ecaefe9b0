"""The Spark line Iceberg runs on, beside the suite's, and Iceberg tables read as users read them.

The repo's venv has PySpark 4.2, for which Apache Iceberg publishes no runtime; Iceberg targets
run on Spark 4.1 (``versions.SparkLine.iceberg``). ``make test`` installs PySpark 4.1 into a
directory of its own (``ICEBERG_SPARK``, the Makefile's ``iceberg-spark``): an Iceberg sync's
merges go through that Spark's ``spark-submit``, its driver running this Python with that PySpark
first on its path, as a Spark 4.1 cluster's would. The tables are read back with ``pyiceberg``
(Iceberg's Python library, no Spark), straight from their metadata files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.merge.job.iceberg_log import APP, WINDOW
from airflow_provider_vitess.merge.spark_conf import ICEBERG_EXTENSIONS
from airflow_provider_vitess.versions import iceberg_runtime, spark_line
from tests.support.delta_check import _plain
from tests.support.iceberg_spark_read import canonical
from tests.support.local import REPO

PYSPARK = "4.1.3"  # the Makefile's ICEBERG_PYSPARK; versions.py's 4.1 line
ICEBERG_SPARK = Path(
    os.environ.get("VITESS_ICEBERG_SPARK")
    or Path.home() / ".cache" / "airflow-provider-vitess" / f"spark-{PYSPARK}"
)


def spark_submit() -> Path:
    """Spark 4.1's spark-submit; skips with the command that installs it when it is missing."""
    binary = ICEBERG_SPARK / "pyspark" / "bin" / "spark-submit"
    if not binary.exists():
        pytest.skip(
            f"no Spark {PYSPARK} at {ICEBERG_SPARK}: `make iceberg-spark` installs it (make test does)"
        )
    return binary


def driver_env() -> dict[str, str]:
    """The merge driver's environment: Spark 4.1's PySpark before the venv's, and the checkout."""
    return {"PYTHONPATH": f"{ICEBERG_SPARK}{os.pathsep}{REPO}"}


def _metadata_file(path: Path) -> Path:
    """The table's current metadata file (a Hadoop catalog's ``v<N>.metadata.json``, highest N)."""
    files = list((path / "metadata").glob("v*.metadata.json"))
    assert files, f"{path}: no Iceberg metadata"
    return max(files, key=lambda f: int(f.name[1:].split(".")[0]))


def _table(path: Path) -> Any:
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(_metadata_file(path)))


def iceberg_dicts(path: Path) -> list[dict[str, Any]]:
    """The table's rows as ``pyiceberg`` reads them (position deletes applied)."""
    return [{k: _plain(v) for k, v in r.items()} for r in _table(path).scan().to_arrow().to_pylist()]


def current_snapshot_id(path: Path) -> int | None:
    """The table's current snapshot, as ``pyiceberg`` reads it."""
    snapshot = _table(path).current_snapshot()
    return None if snapshot is None else int(snapshot.snapshot_id)


def windows_held(path: Path) -> Counter[tuple[str, int]]:
    """How many snapshots of the table carry each (app id, window seq): each window once."""
    out: Counter[tuple[str, int]] = Counter()
    for snapshot in _table(path).snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if APP in props:
            out[(props[APP], int(props[WINDOW]))] += 1
    return out


def roll_back(locations: list[Path], ivy: Path) -> dict[str, list[dict[str, Any]]]:
    """Each table rolled back to its current snapshot's parent by Spark 4.1 (another program
    under the sync), then read; as :func:`spark_rows`."""
    return spark_rows(locations, ivy, "--roll-back")


def sql_rows(queries: Mapping[Path, str], ivy: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows each table's query (``SELECT ... FROM`` the table's catalog name) reads in Spark
    4.1, the catalog registered as the merge registers it; as :func:`spark_rows`."""
    return spark_rows(list(queries), ivy, queries=queries)


def spark_rows(
    locations: list[Path], ivy: Path, *flags: str, queries: Mapping[Path, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each table's rows as Spark 4.1 with Iceberg's runtime reads them (``iceberg_spark_read``,
    one spark-submit), values :func:`canonical`; keyed by location. ``queries``: read by these
    instead of the whole table."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        if queries is not None:
            asked = Path(tmp) / "queries.json"
            asked.write_text(json.dumps({str(k): v for k, v in queries.items()}))
            flags = (*flags, "--sql", str(asked))
        command = [
            str(spark_submit()),
            "--master",
            "local[2]",
            "--packages",
            iceberg_runtime(spark_line(PYSPARK)),
            "--conf",
            f"spark.sql.extensions={ICEBERG_EXTENSIONS}",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "--conf",
            f"spark.jars.ivy={ivy}",
            str(REPO / "tests" / "support" / "iceberg_spark_read.py"),
            *flags,
            str(out),
            *map(str, locations),
        ]
        env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
        env.update(driver_env(), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"Spark's read failed:\n{done.stderr[-4000:]}"
        rows: dict[str, list[dict[str, Any]]] = json.loads(out.read_text())
    return rows


def canonical_rows(rows: list[dict[str, Any]]) -> Counter[tuple[tuple[str, Any], ...]]:
    """Rows as a multiset of their canonical values, to compare two readers' reads."""
    return Counter(tuple(sorted((k, canonical(v)) for k, v in r.items())) for r in rows)
