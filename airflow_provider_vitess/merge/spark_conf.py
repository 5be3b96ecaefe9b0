"""The Spark and Delta settings the merge job runs with: one place for the operator and the tests.

The merge job (``merge/job/main.py``) needs the Delta Lake jar on the JVM side and the ``delta-spark``
Python package (and this provider) in the driver's Python. The jar comes from Maven through
``spark.jars.packages``: the Delta release built for the Spark the job runs on
(:mod:`airflow_provider_vitess.versions`), by default the Spark of the installed PySpark, whose
``spark-submit`` the operator runs. A cluster whose Spark differs from the client's names its
version (or its Delta package) in the Spark connection's extra (operators/merge.py).

No Spark import here: the operator builds its ``spark-submit`` arguments from these values
without PySpark installed on the Airflow worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version

from airflow_provider_vitess.object_storage import is_s3_url
from airflow_provider_vitess.versions import SparkLine, iceberg_runtime, newest_spark_line, spark_line


def installed_spark_line() -> SparkLine:
    """The Spark line of the installed PySpark (the newest line without PySpark). Raises
    :class:`~airflow_provider_vitess.versions.UnsupportedSparkVersionError` for a Spark that
    no Delta release supports, rather than load a jar built for another Spark."""
    try:
        installed = version("pyspark")
    except PackageNotFoundError:
        return newest_spark_line()
    return spark_line(installed)


def _default_line() -> SparkLine:
    try:
        return installed_spark_line()
    except ValueError:  # refused again, with its message, where a run's packages are built
        return newest_spark_line()


LINE = _default_line()
SPARK_VERSION = LINE.pyspark
DELTA_VERSION = LINE.delta
SCALA_BINARY_VERSION = LINE.delta_artifact.rsplit("_", 1)[1]
DELTA_PACKAGE = LINE.delta_package
# Hadoop's S3A file system (``s3a://``) for the Hadoop that this line's PySpark ships; it brings
# the AWS SDK bundle it was built with.
HADOOP_VERSION = LINE.hadoop
HADOOP_AWS_PACKAGE = LINE.hadoop_aws_package

# What every session of the job needs, whatever the cluster.
BASE_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # TIMESTAMP columns are instants; the job never depends on the session zone, but UTC keeps
    # any string rendering (logs, SHOW) equal to what vtgate prints.
    "spark.sql.session.timeZone": "UTC",
    # Staged Parquet is written by pyarrow in the proleptic Gregorian calendar (as MySQL's
    # DATE '1000-01-01' is): never rebase dates or timestamps, reading or writing.
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    # The job sets the transaction identifiers itself around each MERGE and unsets them after.
    "spark.databricks.delta.write.txnVersion.autoReset.enabled": "true",
}

# Small-machine settings for tests and local runs (one executor, a few cores). A Delta table's
# state (its live files, rebuilt from the log for each new version a MERGE reads) in one
# partition: on 2 cores a 500-change window of two small tables on a warm Spark Connect server
# took 3.2 s instead of 3.6 s with two (bench/bench_merge_latency.py, alternating windows).
LOCAL_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}

# A spark-submit of the job on a local master starts a JVM for one window, which spends its
# time in cold code: compiling with the quick JIT tier only (no C2) makes a 500-change window
# ~30% faster on 2 cores (bench/bench_merge_latency.py: 17.8 s vs 23-27 s task start to
# COMMITTED) and a 2 x 1M-row snapshot merge ~10% slower. Not for a long-running JVM (the Spark
# Connect server), where C2's code pays back.
# The quick tier alone also shrinks HotSpot's code cache to its size without tiered compilation,
# 48 MiB, which a window of a few dozen tables fills with compiled queries: the JVM then fails
# with "Out of space in CodeCache for adapters" in whichever thread compiles next, and Spark
# stops its context mid-window (bench/bench_tables.py, 50 tables: a job failed once and hung
# once). The tiered default, 240 MiB, is kept.
# The merge operator adds a class-data archive to these options (merge/class_archive.py).
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
LOCAL_SUBMIT_CONF: Mapping[str, str] = {
    **LOCAL_CONF,
    DRIVER_JAVA_OPTIONS: QUICK_JIT,
}

# Added when a column name needs it: Delta refuses " ,;{}()\n\t=" in names unless columns are
# mapped by name (Delta >= 1.2 readers).
COLUMN_MAPPING_PROPERTIES: Mapping[str, str] = {
    "delta.columnMapping.mode": "name",
}


def packages_for(
    locations: Iterable[str],
    *,
    spark_version: str | None = None,
    delta_package: str | None = None,
    iceberg: bool = False,
) -> str:
    """``--packages`` for a job touching ``locations``: Delta (``delta_package``, else the one
    for ``spark_version``, else for the installed PySpark), plus S3A for S3 URLs, plus Iceberg's
    runtime for the line (``iceberg``: refused on a line without one)."""
    line = spark_line(spark_version) if spark_version else installed_spark_line()
    packages = [delta_package or line.delta_package]
    if any(is_s3_url(loc) for loc in locations):
        packages.append(line.hadoop_aws_package)
    if iceberg:
        packages.append(iceberg_runtime(line))
    return ",".join(packages)


# Iceberg's SQL (MERGE INTO, its procedures) beside Delta's, for a job with Iceberg targets.
EXTENSIONS_CONF = "spark.sql.extensions"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def connect_server_package() -> str | None:
    """The Spark Connect server's own package where the installed PySpark lacks it: PySpark 4
    ships the server in ``pyspark/jars``, PySpark 3.5 only the client (its server is
    ``org.apache.spark:spark-connect_2.12``, from Maven Central)."""
    try:
        installed = version("pyspark")
    except PackageNotFoundError:
        return None
    if not installed.startswith("3."):
        return None
    scala = installed_spark_line().delta_artifact.rsplit("_", 1)[1]
    return f"org.apache.spark:spark-connect_{scala}:{installed}"


def with_iceberg_extensions(extensions: str) -> str:
    """``spark.sql.extensions`` with Iceberg's added (once)."""
    return extensions if ICEBERG_EXTENSIONS in extensions.split(",") else f"{extensions},{ICEBERG_EXTENSIONS}"


def spark_conf(
    *, local: bool = False, extra: Mapping[str, str] | None = None, iceberg: bool = False
) -> dict[str, str]:
    """The ``--conf`` values of a job run (``extra`` wins), with the Delta package; ``local``:
    a spark-submit on a local master (:data:`LOCAL_SUBMIT_CONF`); ``iceberg``: with Iceberg's
    runtime and SQL too (refused on a Spark line without one, :func:`.versions.iceberg_runtime`)."""
    line = installed_spark_line()
    conf = {"spark.jars.packages": line.delta_package, **BASE_CONF}
    if iceberg:
        conf["spark.jars.packages"] += "," + iceberg_runtime(line)
        conf[EXTENSIONS_CONF] = with_iceberg_extensions(conf[EXTENSIONS_CONF])
    if local:
        conf.update(LOCAL_SUBMIT_CONF)
    conf.update(extra or {})
    return conf


def spark_submit_args(*, local: bool = False, extra: Mapping[str, str] | None = None) -> list[str]:
    """``--packages`` and ``--conf k=v`` arguments for ``spark-submit`` (before the script)."""
    conf = spark_conf(local=local, extra=extra)
    args = ["--packages", conf.pop("spark.jars.packages")]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


# What a Spark Connect merge can take of the merge task's ``conf``: the settings a session sets at
# run time (SQL and Delta ones). The others (executors, jars, the driver's JVM) and the static SQL
# settings are the server's own, fixed when it started: given to a Connect merge they would do
# nothing, so they are refused by name (:func:`connect_session_conf`).
SESSION_CONF_PREFIXES = ("spark.sql.", "spark.databricks.delta.")
STATIC_SQL_CONF = (
    "spark.sql.extensions",
    "spark.sql.catalog.",
    "spark.sql.catalogImplementation",
    "spark.sql.warehouse.dir",
    "spark.sql.hive.",
)


def connect_session_conf(conf: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """``conf`` split into what a Spark Connect session applies (:data:`SESSION_CONF_PREFIXES`,
    not :data:`STATIC_SQL_CONF`) and the names it cannot take (sorted)."""
    applied, refused = {}, []
    for key, value in conf.items():
        if key.startswith(SESSION_CONF_PREFIXES) and not key.startswith(STATIC_SQL_CONF):
            applied[key] = str(value)
        else:
            refused.append(key)
    return applied, sorted(refused)
