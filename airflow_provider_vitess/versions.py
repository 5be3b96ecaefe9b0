"""The Airflow and Spark/Delta releases the provider is tested on: one list for everything.

``make test-compat`` (dev/test_compat.py) installs exactly these, ``pyproject.toml``'s ranges
are derived from them (tests/unit/floor/test_versions.py fails when the two drift apart), and the
merge job's Delta package follows the Spark line of the cluster it runs on
(:func:`spark_line`). Plain data and no imports beyond the standard library: the compat script
loads this file before any venv exists.

A Spark line is a Spark minor with the Delta release built for it. Delta publishes one artifact
per Spark minor (``delta-spark_4.0_2.13``, ``delta-spark_4.1_2.13``; the plain
``delta-spark_2.13`` is built for the newest Spark it supports), and Delta 3.x is the last
release line for Spark 3.5 (Scala 2.12).
"""

from __future__ import annotations

from dataclasses import dataclass

# The newest patch of each Airflow minor the provider supports, oldest first. pyproject.toml
# claims from the first to the minor after the last (exclusive).
AIRFLOW_RELEASES: tuple[str, ...] = ("3.1.8", "3.2.2", "3.3.2")

# What an Airflow release needs pinned besides it when installed without Airflow's constraints
# file (make test-compat installs them with it; docs/installation.md lists them). Airflow 3.2.2
# leaves FastAPI and svcs unbounded: with FastAPI 0.137+ (and cadwyn 9) its task execution API
# fails at import, and with svcs 26 its in-process API (dag.test) never registers its services;
# every task fails. Airflow 3.3 fixed both.
AIRFLOW_PINS: dict[str, tuple[str, ...]] = {"3.2.2": ("fastapi<0.137", "svcs<26")}


@dataclass(frozen=True)
class SparkLine:
    """A Spark minor, the client PySpark release tested for it, and its Delta Lake."""

    spark: str  # the minor: "4.1"
    pyspark: str  # the PySpark release the tests install for it
    delta: str  # the Delta Lake release (jar and delta-spark Python package)
    delta_artifact: str  # the Maven artifact built for this Spark minor
    hadoop: str  # the Hadoop its PySpark ships (pyspark/jars/hadoop-client-api-*.jar): S3A's
    # What else the client venv pins for this line (make test-compat installs them with it;
    # docs/installation.md lists them): the Spark provider release first.
    pins: tuple[str, ...] = ()
    # Apache Iceberg's Spark runtime for this line (Maven coordinates), where one can carry a
    # window's marker (:data:`ICEBERG_UNSUPPORTED` says why the others cannot).
    iceberg: str | None = None

    @property
    def delta_package(self) -> str:
        return f"io.delta:{self.delta_artifact}:{self.delta}"

    @property
    def hadoop_aws_package(self) -> str:
        return f"org.apache.hadoop:hadoop-aws:{self.hadoop}"

    @property
    def delta_major(self) -> int:
        return int(self.delta.split(".")[0])


# Oldest first; the last is the default (and the one the repo's own .venv installs). The PySpark
# of a Spark 4 line is the newest patch that has a pyspark-client of the same release: the Spark
# provider (6.x) requires pyspark-client, whose files overlay pyspark's, so the two must be equal
# or the client breaks the classic PySpark. PySpark 4.2.1 is out, but every delta-spark 4.4
# requires pyspark<=4.2.0. On Spark 3.5 the Spark provider is 5.x (6.x needs pyspark-client 4),
# and PySpark 3.5's connect extra holds numpy<2, which pyarrow 26 refuses at import.
SPARK_LINES: tuple[SparkLine, ...] = (
    SparkLine(
        "3.5",
        "3.5.9",
        "3.3.2",
        "delta-spark_2.12",
        "3.3.4",
        pins=("apache-airflow-providers-apache-spark==5.6.0", "pyarrow<26"),
    ),
    SparkLine(
        "4.0",
        "4.0.4",
        "4.4.0",
        "delta-spark_4.0_2.13",
        "3.4.1",
        pins=("apache-airflow-providers-apache-spark==6.3.4", "pyspark-client==4.0.4"),
    ),
    SparkLine(
        "4.1",
        "4.1.3",
        "4.4.0",
        "delta-spark_4.1_2.13",
        "3.4.2",
        pins=("apache-airflow-providers-apache-spark==6.3.4", "pyspark-client==4.1.3"),
        iceberg="org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0",
    ),
    SparkLine(
        "4.2",
        "4.2.0",
        "4.4.0",
        "delta-spark_2.13",
        "3.5.0",
        pins=("apache-airflow-providers-apache-spark==6.3.4", "pyspark-client==4.2.0"),
    ),
)


# Spark minors that are released but that no Delta Lake release supports yet: asked for one, the
# merge says so instead of loading a Delta jar built for another Spark.
UNSUPPORTED_SPARK: dict[str, str] = {
    "4.3": (
        "no Delta Lake release supports Spark 4.3 yet (Maven Central has no "
        "io.delta:delta-spark_4.3_2.13, and delta-spark 4.4 requires pyspark<=4.2.0)"
    ),
}

# Why a Spark line has no Iceberg target. A window's commit carries the sync's marker in its
# snapshot summary through the session setting spark.sql.iceberg.snapshot-property.*, which
# Iceberg's Spark runtime reads from release 1.11 on and only for Spark 4.0 and later.
ICEBERG_UNSUPPORTED: dict[str, str] = {
    "3.5": (
        "Iceberg's runtime for Spark 3.5 does not take snapshot properties from the session, "
        "which carry each window's exactly-once marker"
    ),
    "4.0": "Maven Central serves Iceberg's runtime for Spark 4.0 only up to 1.10, before snapshot "
    "properties from the session (1.11)",
    "4.2": "Apache Iceberg publishes no Spark runtime for Spark 4.2 yet",
}


# Delta features the merge job uses that older Delta releases lack: the feature, and the first
# Delta major that has it. Checked by the job before it changes a table (merge/schema.py).
TYPE_WIDENING_DELTA_MAJOR = 4


class UnsupportedSparkVersionError(ValueError):
    """A Spark version with no tested Spark line (and so no Delta package to load)."""


def minor(version: str) -> str:
    """``"4.1.4"`` -> ``"4.1"`` (also for ``"4.1.0-SNAPSHOT"``, ``"3.5.9.dev0"``)."""
    parts = version.strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1][:1].isdigit():
        raise UnsupportedSparkVersionError(f"cannot read a Spark version from {version!r}")
    return f"{parts[0]}.{''.join(c for c in parts[1] if c.isdigit())}"


def spark_line(spark_version: str) -> SparkLine:
    """The Spark line (and so the Delta package) for a cluster's Spark version."""
    wanted = minor(spark_version)
    for line in SPARK_LINES:
        if line.spark == wanted:
            return line
    supported = ", ".join(line.spark for line in SPARK_LINES)
    why = UNSUPPORTED_SPARK.get(wanted, "it is not one the provider is tested on")
    raise UnsupportedSparkVersionError(
        f"Spark {spark_version}: {why}. The merge job runs on Spark {supported}. Remedy: run the "
        "merge on one of those, or name the Delta package yourself (the Spark connection's extra "
        "'delta_package', or the operator's packages=) and own its compatibility"
    )


def iceberg_runtime(line: SparkLine) -> str:
    """The Iceberg runtime package for ``line``; refused by name on a line without one."""
    if line.iceberg is not None:
        return line.iceberg
    why = ICEBERG_UNSUPPORTED.get(line.spark, "no Iceberg runtime is tested for it")
    lines = ", ".join(f"{x.spark} ({x.iceberg})" for x in SPARK_LINES if x.iceberg)
    raise UnsupportedSparkVersionError(
        f"Iceberg targets on Spark {line.spark}: {why}. Iceberg targets run on Spark {lines}. "
        "Remedy: run the merge of an Iceberg sync on one of those, or keep the sync on Delta"
    )


def newest_spark_line() -> SparkLine:
    return SPARK_LINES[-1]
