"""The Spark line Iceberg runs on, beside the suite's, and Iceberg tables read as users read them.

The repo's venv has PySpark 4.2, for which Apache Iceberg publishes no runtime; Iceberg targets
run on Spark 4.1 (``versions.SparkLine.iceberg``). ``make test`` installs PySpark 4.1 into a
directory of its own (``ICEBERG_SPARK``, the Makefile's ``iceberg-spark``): an Iceberg sync's
merges go through that Spark's ``spark-submit``, its driver running this Python with that PySpark
first on its path, as a Spark 4.1 cluster's would. The tables are read back with ``pyiceberg``
(Iceberg's Python library, no Spark): a Hadoop catalog's straight from their metadata files, a
JDBC catalog's through that catalog (:class:`Catalog`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.merge.iceberg_catalog import DRIVERS, IcebergCatalog
from airflow_provider_vitess.merge.job.iceberg_log import APP, WINDOW
from airflow_provider_vitess.merge.job.iceberg_sql import at
from airflow_provider_vitess.merge.spark_conf import ICEBERG_EXTENSIONS
from airflow_provider_vitess.versions import iceberg_runtime, spark_line
from tests.support.delta_check import _plain
from tests.support.iceberg_spark_read import CATALOG_ENV, canonical
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


@dataclass(frozen=True)
class Catalog:
    """A JDBC catalog the tables are in: as the product's Spark names it (``spark``), and as
    ``pyiceberg`` reaches its database (``url``, SQLAlchemy's)."""

    spark: IcebergCatalog
    url: str

    def load(self, path: Path) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        table = at(str(path))
        catalog = SqlCatalog(self.spark.name, uri=self.url, warehouse=table.warehouse)
        return catalog.load_table((table.namespace, table.name))


def _metadata_file(path: Path) -> Path:
    """The table's current metadata file (a Hadoop catalog's ``v<N>.metadata.json``, highest N)."""
    files = list((path / "metadata").glob("v*.metadata.json"))
    assert files, f"{path}: no Iceberg metadata"
    return max(files, key=lambda f: int(f.name[1:].split(".")[0]))


def iceberg_table(path: Path, catalog: Catalog | None = None) -> Any:
    """``pyiceberg``'s table at ``path``, in ``catalog`` (None: a Hadoop catalog's)."""
    if catalog is not None:
        return catalog.load(path)
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(_metadata_file(path)))


def iceberg_dicts(path: Path, catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """The table's rows as ``pyiceberg`` reads them (position deletes applied)."""
    rows = iceberg_table(path, catalog).scan().to_arrow().to_pylist()
    return [{k: _plain(v) for k, v in r.items()} for r in rows]


def current_snapshot_id(path: Path, catalog: Catalog | None = None) -> int | None:
    """The table's current snapshot, as ``pyiceberg`` reads it."""
    snapshot = iceberg_table(path, catalog).current_snapshot()
    return None if snapshot is None else int(snapshot.snapshot_id)


def windows_held(path: Path, catalog: Catalog | None = None) -> Counter[tuple[str, int]]:
    """How many snapshots of the table carry each (app id, window seq): each window once."""
    out: Counter[tuple[str, int]] = Counter()
    for snapshot in iceberg_table(path, catalog).snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if APP in props:
            out[(props[APP], int(props[WINDOW]))] += 1
    return out


def roll_back(
    locations: list[Path], ivy: Path, catalog: Catalog | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each table rolled back to its current snapshot's parent by Spark 4.1 (another program
    under the sync), then read; as :func:`spark_rows`."""
    return spark_rows(locations, ivy, catalog, "--roll-back")


def sql_rows(
    queries: Mapping[Path, str], ivy: Path, catalog: Catalog | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The rows each table's query (``SELECT ... FROM`` the table's catalog name) reads in Spark
    4.1, the catalog registered as the merge registers it; as :func:`spark_rows`."""
    return spark_rows(list(queries), ivy, catalog, queries=queries)


def spark_rows(
    locations: list[Path],
    ivy: Path,
    catalog: Catalog | None = None,
    *flags: str,
    queries: Mapping[Path, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each table's rows as Spark 4.1 with Iceberg's runtime reads them (``iceberg_spark_read``,
    one spark-submit; through ``catalog`` if given), values :func:`canonical`; keyed by location.
    ``queries``: read by these instead of the whole table."""
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
            f"{iceberg_runtime(spark_line(PYSPARK))},{DRIVERS['postgres'][1]}",
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
        if catalog is not None:  # as the merge's job has it: the document, and its credentials apart
            env.update({CATALOG_ENV: json.dumps(catalog.spark.document()), **catalog.spark.environment()})
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"Spark's read failed:\n{done.stderr[-4000:]}"
        rows: dict[str, list[dict[str, Any]]] = json.loads(out.read_text())
    return rows


def canonical_rows(rows: list[dict[str, Any]]) -> Counter[tuple[tuple[str, Any], ...]]:
    """Rows as a multiset of their canonical values, to compare two readers' reads."""
    return Counter(tuple(sorted((k, canonical(v)) for k, v in r.items())) for r in rows)
