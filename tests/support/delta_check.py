"""Read Delta tables and the source through vtgate, for the oracle comparisons of DAG tests."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.merge.spark_conf import QUICK_JIT
from tests.support import connect_server

_STOP_AT_EXIT: list[Any] = []
# py4j logs from __del__ at interpreter exit, after pytest closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


# A JVM that crashes writes its report here (not into the checkout, the JVM's working directory).
JVM_ERROR_FILE = Path(tempfile.gettempdir()) / "vitess-tests-jvm" / "hs_err_pid%p.log"
# The in-process session lives as long as its pytest worker (half an hour, a few hundred
# tests), and a heap that holds the DeltaLog snapshots of every table the worker touched: 2 GiB
# instead of 1. It compiles with the quick JIT tier only, as a one-window spark-submit does
# (QUICK_JIT, which keeps the 240 MiB code cache: the quick tier's own 48 MiB default fills and
# Spark then stops its context). Spark generates new classes for each query, so C2 never stops
# compiling here: it took 26-36% of the worker JVMs' CPU, more than the quick tier's slower code
# costs. Three pairs of runs side by side spent 37%, 12% and 15% less CPU in these JVMs on the
# quick tier (session 42: bench/results/2026-12-07-cpu_by_process-quick-jit-test-session.md).
# (The JVM of one CI worker died mid-suite with older settings, stop 46; why was not recorded,
# hence the error file.)
TEST_SESSION_CONF: dict[str, str] = {
    "spark.driver.memory": "2g",
    "spark.driver.extraJavaOptions": f"-XX:ErrorFile={JVM_ERROR_FILE} {QUICK_JIT}",
    "spark.pyspark.python": sys.executable,
}


def spark_session() -> Any:
    """This process's SparkSession with Delta (one per process; reused across tests), whose JVM
    also serves this process's Spark Connect clients (:mod:`.connect_server`). A session whose
    JVM has died is replaced, so one lost JVM fails the test it happened in, not every test after
    it on that worker."""
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import DRIVERS
    from airflow_provider_vitess.merge.spark_conf import LOCAL_CONF, installed_spark_line, spark_conf

    active = SparkSession._instantiatedSession
    if active is not None and not _jvm_alive(active):
        _forget_dead_session(active)
    JVM_ERROR_FILE.parent.mkdir(exist_ok=True)
    builder = SparkSession.builder.master("local[2]").appName("vitess-tests")
    # Iceberg's runtime where the installed Spark line has one (tests/job/test_table_formats.py).
    iceberg = installed_spark_line().iceberg is not None
    conf = {**spark_conf(extra=LOCAL_CONF, iceberg=iceberg), **TEST_SESSION_CONF}
    packages = conf["spark.jars.packages"].split(",")
    if iceberg:  # and PostgreSQL's driver, for Iceberg's JDBC catalog
        packages.append(DRIVERS["postgres"][1])
    if connect_server.in_process():
        served, server_packages = connect_server.server_conf()
        conf.update(served)
        packages += [p for p in server_packages if p not in packages]
    conf["spark.jars.packages"] = ",".join(packages)
    ivy = os.environ.get("VITESS_SPARK_IVY")
    if ivy:
        conf["spark.jars.ivy"] = ivy
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if session not in _STOP_AT_EXIT:
        # Stop the JVM before the interpreter tears down logging (else noise at pytest's exit).
        _STOP_AT_EXIT.append(session)
        atexit.register(session.stop)
        session.sparkContext.setLogLevel("ERROR")
    return session


def _jvm_alive(session: Any) -> bool:
    try:
        return not session.sparkContext._jsc.sc().isStopped()
    except Exception:  # py4j's network errors, or a refused connection: the JVM is gone
        return False


def _forget_dead_session(dead: Any) -> None:
    """Drop PySpark's references to a JVM that is gone, so the next builder starts a new one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    proc = getattr(SparkContext._gateway, "proc", None)
    code = proc.poll() if proc is not None else None
    report = JVM_ERROR_FILE.parent / JVM_ERROR_FILE.name.replace("%p", str(proc.pid if proc else ""))
    first = report.read_text(errors="replace").splitlines()[:8] if report.is_file() else []
    # A warning, so the suite's summary shows it (xdist forwards a worker's warnings): the exit
    # code says how it died (52: Spark's exit on OutOfMemoryError; -9: SIGKILL, the OOM killer; -6: a crash).
    warnings.warn(
        f"the test SparkSession's JVM died (exit code {code}); starting a new one. "
        + (f"Its crash report {report}: " + " | ".join(first) if first else "No crash report."),
        RuntimeWarning,
        stacklevel=2,
    )
    if dead in _STOP_AT_EXIT:
        _STOP_AT_EXIT.remove(dead)
        atexit.unregister(dead.stop)
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SparkContext._active_spark_context = None
    SparkContext._gateway = None
    SparkContext._jvm = None


def _plain(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, Decimal) and value == value.to_integral_value() and value.as_tuple().exponent == 0:
        return int(value)
    return value


def delta_rows(path: str | Path, spark: Any = None) -> set[tuple[Any, ...]]:
    """The table's rows: read by ``spark`` if given, else as :func:`table_dicts` reads them."""
    rows = table_dicts(path) if spark is None else spark_dicts(spark, path)
    return {tuple(row.values()) for row in rows}


# Reader features delta-rs 1.6's Arrow reader reads right (docs/reading-the-tables.md: it refuses
# deletion vectors and type widening, and reads the columns a mapped table stores under physical
# names as NULL: every column of a table created with mapping, tests/job/test_oracle_reads.py).
_DELTA_RS_READS = frozenset({"timestampNtz"})


def table_dicts(path: str | Path, version: int | None = None) -> list[dict[str, Any]]:
    """The local Delta table's rows (at ``version``: time travel), each value as PySpark's
    ``collect()`` gives it (after :func:`_plain`): read by delta-rs, or by this process's
    SparkSession where the table has a reader feature outside :data:`_DELTA_RS_READS`.

    The suite's oracle reads go through here rather than through the worker's JVM, which runs the
    suite's merges: a warm Spark read of a small table took ~0.17 s on a quiet machine and
    delta-rs ~0.006 s (session 40; bench/results/2026-12-06-cpu_by_process-make-test.md)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    protocol = table.protocol()
    # Reader version 2 is column mapping without a feature list; 3 lists the features.
    features = set(protocol.reader_features or ())
    if protocol.min_reader_version == 2 or not features <= _DELTA_RS_READS:
        return spark_dicts(spark_session(), path, version)
    return [{k: _spark_value(v) for k, v in row.items()} for row in table.to_pyarrow_table().to_pylist()]


def spark_dicts(spark: Any, path: str | Path, version: int | None = None) -> list[dict[str, Any]]:
    """The Delta table's rows (at ``version``) as ``spark`` reads them, values :func:`_plain`."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return [{k: _plain(v) for k, v in r.asDict().items()} for r in reader.load(str(path)).collect()]


def _spark_value(value: Any) -> Any:
    # Arrow gives a Delta TIMESTAMP as an aware UTC datetime; PySpark the naive local time.
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return _plain(value)


def delta_history(path: str | Path) -> list[dict[str, Any]]:
    """The table's commits, oldest first: version, operation and the txn (app id, version)."""
    spark = spark_session()
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation").collect()
    return sorted(({"version": r[0], "operation": r[1]} for r in rows), key=lambda r: r["version"])


def source_rows(hook: VitessHook, keyspace: str, table: str) -> set[tuple[Any, ...]]:
    raw = hook.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET workload = 'olap'")  # OLTP results stop at 10,000 rows
        cur.execute(f"SELECT * FROM `{keyspace}`.`{table}`")
        return {tuple(_plain(v) for v in r) for r in cur.fetchall()}
    finally:
        raw.close()


def delta_txns(path: str | Path, fs: Any = None) -> list[tuple[str, int, int]]:
    """(app id, txn version, Delta version) of every commit that carried a transaction id,
    read from the table's ``_delta_log`` (a local table, or with ``fs`` an fsspec filesystem and
    ``path`` its ``bucket/prefix``): shows each window applied once."""
    import json

    if fs is None:
        commits = [(int(c.stem), c.read_text()) for c in Path(path, "_delta_log").glob("*.json")]
    else:
        commits = [
            (int(c.rsplit("/", 1)[1].removesuffix(".json")), fs.cat_file(c).decode())
            for c in fs.glob(f"{str(path).rstrip('/')}/_delta_log/*.json")
        ]
    out = []
    for version, text in sorted(commits):
        for line in text.splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((action["txn"]["appId"], int(action["txn"]["version"]), version))
    return out


def assert_delta_equals_source(
    hook: VitessHook, keyspace: str, tables: Sequence[str], delta_root: str | Path, spark: Any = None
) -> None:
    """Each ``delta_root/<table>`` holds exactly the rows of ``keyspace.table`` through vtgate
    (read with ``spark``, default this process's classic session)."""
    for table in tables:
        source = source_rows(hook, keyspace, table)
        target = delta_rows(Path(delta_root) / table, spark)
        assert target == source, (
            f"{table}: {len(target - source)} rows only in Delta (e.g. {sorted(target - source)[:3]}), "
            f"{len(source - target)} only in the source (e.g. {sorted(source - target)[:3]})"
        )
