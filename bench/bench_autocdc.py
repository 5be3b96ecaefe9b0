"""Benchmark: the same staged windows applied by Spark's Auto CDC and by our merge (issue 14, item 4).

Not a test; prints figures. Spark Declarative Pipelines (PySpark 4.2) has
``create_auto_cdc_flow(target, source, keys, sequence_by, apply_as_deletes)``: what a Spark user
would try instead of our merge. This applies our staged windows with it and with our merge, and
compares each target with ``SELECT *`` through vtgate.

    .venv/bin/python bench/bench_autocdc.py [--seed 14] [--orders 2000] [--rounds 6]
                                            [--transactions 60] [--splits 3] [--split-moves 10]

It starts (or reuses) the cluster of ``dev/local_vitess.sh`` and connects as the other benches
do (``bench_window.connect``). Then:

1. **Workload and capture** (``tests/support/merge_workload.py``, seeded): ``customer.
   merge_orders`` (sharded by ``customer_id``) gets ``--orders`` rows and a snapshot window, then
   ``--rounds`` rounds of ``--transactions`` transactions (inserts, updates, deletes, primary key
   changes, moves between shards: DELETE + INSERT in one transaction), each captured by our
   ``CaptureRunner`` as a catch-up window. After each of the first ``--splits`` rounds, a window
   is staged whose stop falls between the two halves of ``--split-moves`` moves
   (``Sync.capture_split``, as ``test_merge_straddle.py`` does): for half of them the INSERT is in
   that window and the DELETE in the next one, for the other half the other way round.
2. **Our merge**: each window in turn through ``merge.job.run.merge`` into a Delta table (as the
   integration tests do), in a local[2] SparkSession with Delta.
3. **Auto CDC**: each window in turn is put in the directory a streaming source reads, then one
   triggered run of a pipeline whose Auto CDC flow applies it to a streaming table (one pipeline
   update per window, as a scheduled pipeline would). ``keys`` = the sync's key;
   ``sequence_by`` = our staged order: ``struct(window, _commit_ts, _seq, sub)`` (``_seq`` counts
   within a window, hence the window first); ``apply_as_deletes`` from ``_op``. The source view
   is the careful user's one: a delete is an event at its before-image key, and an update that
   changes the key is a delete at the old key followed (``sub``) by an upsert at the new one;
   column types are cast to the Delta table's.

Then each target is compared with ``SELECT *`` through vtgate, value for value, and the rows that
differ are counted (missing, extra, values differ).

The target Auto CDC accepts. Auto CDC needs a DSv2 table with row-level operations (MERGE):
Delta 4.4 refuses (``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``) and Iceberg has no runtime for
Spark 4.2 yet. What works is Spark's own in-memory row-level table
(``InMemoryRowLevelOperationTableCatalog``, in the ``spark-catalyst`` tests jar from Maven
Central, fetched once with Maven into the bench's Maven cache), through
``bench/autocdc/SharedRowLevelCatalog.java`` (compiled here with javac): the same catalog with
one table map for all its instances, as Spark makes one per session and a streaming query
runs in a clone of its session. It is **not Delta**: no files, no log, no commit, so the time
comparison favours Auto CDC. Both run in one JVM: the SparkSession of our merge also serves
Spark Connect (on a free loopback port); the pipeline client is a child process of this script
(PySpark's functions build Spark Connect columns only in a process without a classic session).

Not part of ``make test``. The tables are left in the cluster (the next run recreates them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: tests.integration is imported from the repo
    sys.path.insert(0, str(REPO))

import bench_peers as bp  # noqa: E402  (bench/, the script's own directory)
import bench_window as bw  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import Column, DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from airflow_provider_vitess.checkpoints import CheckpointStore  # noqa: E402
from airflow_provider_vitess.hooks.vitess import VitessHook  # noqa: E402
from airflow_provider_vitess.merge.job.run import merge  # noqa: E402
from airflow_provider_vitess.merge.job.window_rows import staged_path  # noqa: E402
from airflow_provider_vitess.merge.plan import MergePlan, WindowToMerge  # noqa: E402
from airflow_provider_vitess.merge.spark_conf import SCALA_BINARY_VERSION, SPARK_VERSION, spark_conf  # noqa: E402
from airflow_provider_vitess.staging import Manifest, read_table  # noqa: E402
from airflow_provider_vitess.staging import arrow_types as A  # noqa: E402
from tests.support import merge_workload as wl  # noqa: E402

KEYSPACE = "customer"
TABLE = wl.ORDERS
TESTS_JAR = f"org.apache.spark:spark-catalyst_{SCALA_BINARY_VERSION}:{SPARK_VERSION}:jar:tests"
CATALOG_SOURCE = Path(__file__).resolve().parent / "autocdc" / "SharedRowLevelCatalog.java"
SHARED_CATALOG = "bench.autocdc.SharedRowLevelCatalog"
CATALOG, DATABASE = "autocdc", "bench"
# The pipeline's own columns next to the data: the order and the delete flag.
WINDOW, SUB, IS_DELETE = "_window", "_sub", "_is_delete"
ORDER = (WINDOW, A.COMMIT_TS, A.SEQ, SUB)
RESULT = "AUTO_CDC_RESULT "


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


# -- the Auto CDC target's jar ---------------------------------------------------------------------


def row_level_catalog_jar() -> Path:
    """The ``spark-catalyst`` tests jar of our PySpark's release, from Maven Central (cached)."""
    if pyspark.__version__ != SPARK_VERSION:
        raise SystemExit(
            f"PySpark is {pyspark.__version__}, the project pins {SPARK_VERSION}: reinstall the venv"
        )
    group, artifact, version, _, classifier = TESTS_JAR.split(":")
    jar = (
        bp.maven_repo()
        / Path(*group.split("."))
        / artifact
        / version
        / f"{artifact}-{version}-{classifier}.jar"
    )
    if not jar.is_file():
        bp.ensure_jdk()
        done = subprocess.run(
            ["mvn", "-B", "-q", f"-Dmaven.repo.local={bp.maven_repo()}", "dependency:get",
             f"-Dartifact={TESTS_JAR}", "-Dtransitive=false"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not jar.is_file():
            raise SystemExit(
                f"fetching {TESTS_JAR} with Maven failed (exit {done.returncode}):\n"
                f"{done.stdout[-3000:]}{done.stderr[-3000:]}\nRemedy: Maven Central must be reachable once."
            )
    return jar


def shared_catalog_jar(tests_jar: Path, work: Path) -> Path:
    """``bench/autocdc/SharedRowLevelCatalog.java`` compiled against PySpark's jars (javac)."""
    bp.ensure_jdk()
    classes = work / "catalog-classes"
    classpath = os.pathsep.join([str(Path(pyspark.__file__).parent / "jars" / "*"), str(tests_jar)])
    subprocess.run(["javac", "-d", str(classes), "-cp", classpath, str(CATALOG_SOURCE)], check=True)
    jar = work / "shared-row-level-catalog.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session(work: Path, port: int) -> SparkSession:
    """Our merge's SparkSession (Delta, local[2]), also serving Spark Connect on ``port``, with
    the Auto CDC target's catalog."""
    tests_jar = row_level_catalog_jar()
    conf = spark_conf(
        local=True,
        extra={
            "spark.driver.memory": "2g",
            "spark.local.dir": str(work / "spark-local"),
            "spark.jars": f"{tests_jar},{shared_catalog_jar(tests_jar, work)}",
            f"spark.sql.catalog.{CATALOG}": SHARED_CATALOG,
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
        },
    )
    builder = SparkSession.builder.master("local[2]").appName("bench_autocdc")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- workload and capture --------------------------------------------------------------------------


def customer_shards(manifest: Manifest) -> dict[int, str]:
    """customer_id -> the shard its rows are staged from."""
    if TABLE not in manifest.tables:
        return {}
    return {
        r["customer_id"]: r[A.SHARD]
        for r in read_table(manifest, TABLE).to_pylist()
        if r["customer_id"] is not None
    }


def straddling_moves(
    workload: wl.Workload, shards: dict[int, str], early: str, count: int
) -> tuple[Callable[[], None], list[int]]:
    """``count`` moves, half from ``early`` to another shard (INSERT this window, DELETE next)
    and half the other way (DELETE this window, INSERT next); one transaction each."""
    rng = workload.rng
    on = {s: sorted(c for c, sh in shards.items() if sh == s) for s in set(shards.values())}
    other = next(s for s in sorted(on) if s != early)
    chosen: list[tuple[int, int]] = []
    for i in range(count):
        src, dst = (early, other) if i % 2 == 0 else (other, early)
        oids = [
            o for o, c in sorted(workload.orders.items()) if shards.get(c) == src and o not in dict(chosen)
        ]
        if oids:
            chosen.append((rng.choice(oids), rng.choice(on[dst])))

    def act() -> None:
        for oid, cid in chosen:
            with workload.hook.connect_sql() as conn, conn.begin():
                workload.move(conn, oid, cid)

    return act, [oid for oid, _ in chosen]


def two_shard_keys(manifests: Sequence[Manifest]) -> set[int]:
    """Order ids with events from two shards in one catch-up window (moves inside a window)."""
    out = set()
    for m in manifests[1:]:
        seen: dict[int, set[str]] = {}
        for r in read_table(m, TABLE).to_pylist() if TABLE in m.tables else ():
            key = r["order_id"] if r["order_id"] is not None else r[A.BEFORE_PREFIX + "order_id"]
            seen.setdefault(key, set()).add(r[A.SHARD])
        out |= {k for k, shards in seen.items() if len(shards) > 1}
    return out


@dataclass
class Captured:
    sync: wl.Sync
    workload: wl.Workload
    straddled: list[int]  # order ids moved across a window's stop
    seconds: float


def capture(hook: VitessHook, work: Path, args: argparse.Namespace) -> Captured:
    began = time.perf_counter()
    wl.create_tables(hook)
    workload = wl.Workload(hook, args.seed)
    workload.initial(orders=args.orders)
    store = CheckpointStore(f"sqlite:///{work}/store.db")
    store.migrate()
    sync = wl.new_sync(hook, store, work / "stage", f"autocdc-{uuid.uuid4().hex[:8]}", KEYSPACE, [TABLE])
    shards = customer_shards(sync.capture(snapshot=True))
    straddled: list[int] = []
    for i in range(args.rounds):
        workload.round(args.transactions)
        shards.update(customer_shards(sync.capture()))
        if i < args.splits:
            early = sorted(set(shards.values()))[i % 2]
            act, oids = straddling_moves(workload, shards, early, args.split_moves)
            shards.update(customer_shards(sync.capture_split(act, early)))
            straddled += oids
    sync.capture()  # the halves the last split window left out
    return Captured(sync, workload, straddled, time.perf_counter() - began)


# -- the two appliers ------------------------------------------------------------------------------


def apply_ours(spark: SparkSession, sync: wl.Sync, root: Path) -> list[float]:
    """Each window in turn through our merge job, into Delta; seconds per window."""
    took = []
    for i, m in enumerate(sync.manifests):
        window = WindowToMerge(m.window_seq, m.path, (TABLE,) if i == 0 else ())
        began = time.perf_counter()
        merge(spark, MergePlan(sync.sync_id, (window,), sync.targets(root)))
        took.append(time.perf_counter() - began)
    return took


def _nullable(value: int) -> Column:
    """``value`` as a nullable column: Auto CDC casts the ``sequence_by`` struct of later batches
    to the type it recorded, and a NOT NULL literal field makes that cast fail."""
    return F.when(F.col(A.SEQ).isNotNull(), F.lit(value))


def auto_cdc_events(staged: DataFrame, keys: Sequence[str], target: T.StructType) -> DataFrame:
    """Staged rows as Auto CDC events (module docstring): the after image as an upsert; a delete,
    and the old key of a key change, as a delete at the before-image key (one ``sub`` earlier)."""
    window = F.regexp_extract(F.col("_metadata.file_name"), r"^w(\d+)-", 1).cast("long")
    staged = staged.withColumn(WINDOW, window)
    op = F.col(A.OP)
    order = [F.col(WINDOW), F.col(A.COMMIT_TS), F.col(A.SEQ)]
    after = staged.where(op != "delete").select(
        *[F.col(wl.q(f.name)).cast(f.dataType).alias(f.name) for f in target.fields],
        *order,
        _nullable(1).alias(SUB),
        F.lit(False).alias(IS_DELETE),
    )
    changed: Column = reduce(
        lambda a, b: a | b, [~F.col(wl.q(A.BEFORE_PREFIX + k)).eqNullSafe(F.col(wl.q(k))) for k in keys]
    )
    before = staged.where((op == "delete") | ((op == "update") & changed)).select(
        *[
            (F.col(wl.q(A.BEFORE_PREFIX + f.name)) if f.name in keys else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in target.fields
        ],
        *order,
        _nullable(0).alias(SUB),
        F.lit(True).alias(IS_DELETE),
    )
    return after.unionByName(before)


def run_pipeline(
    spark: SparkSession,
    feed: Path,
    storage: Path,
    schema: T.StructType,
    keys: Sequence[str],
    target: T.StructType,
) -> None:
    """One triggered update of the pipeline: Auto CDC applies what the feed has that it has not."""
    from pyspark import pipelines as dp
    from pyspark.pipelines.add_pipeline_analysis_context import add_pipeline_analysis_context
    from pyspark.pipelines.graph_element_registry import graph_element_registration_context
    from pyspark.pipelines.spark_connect_graph_element_registry import SparkConnectGraphElementRegistry
    from pyspark.pipelines.spark_connect_pipeline import create_dataflow_graph, start_run

    graph = create_dataflow_graph(spark, default_catalog=CATALOG, default_database=DATABASE, sql_conf={})
    registry = SparkConnectGraphElementRegistry(spark, graph)
    with graph_element_registration_context(registry), add_pipeline_analysis_context(spark, graph, None):

        @dp.temporary_view(name="staged_changes")
        def staged_changes() -> DataFrame:
            return auto_cdc_events(spark.readStream.schema(schema).parquet(str(feed)), keys, target)

        dp.create_streaming_table(TABLE)
        dp.create_auto_cdc_flow(
            target=TABLE,
            source="staged_changes",
            keys=list(keys),
            sequence_by=F.struct(*ORDER),
            apply_as_deletes=F.col(IS_DELETE),
            except_column_list=[*ORDER, IS_DELETE],
        )
    events = start_run(
        spark,
        graph,
        full_refresh=None,
        full_refresh_all=False,
        refresh=None,
        dry=False,
        storage=storage.as_uri(),
    )
    said = [r["pipeline_event_result"].event.message for r in events if "pipeline_event_result" in r]
    if not said or said[-1] != "Run is COMPLETED.":
        raise RuntimeError("the pipeline run did not complete:\n" + "\n".join(said[-20:]))


def auto_cdc_side(spec: dict[str, Any]) -> dict[str, Any]:
    """In a Spark Connect client process: each window in turn into the feed directory, then one
    pipeline update; then the target against ``SELECT *`` through vtgate."""
    from airflow_provider_vitess.staging.manifest import load_manifest

    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{spec['port']}").getOrCreate()
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{DATABASE}")
    work, keys = Path(spec["work"]), spec["keys"]
    target = T.StructType.fromJson(spec["target"])
    manifests = []
    for seq in spec["windows"]:
        manifest = load_manifest(spec["stage"], spec["sync_id"], seq)
        if manifest is None:
            raise SystemExit(f"window {seq} of {spec['sync_id']} has no manifest in {spec['stage']}")
        manifests.append(manifest)
    feed, storage = work / "feed", work / "pipeline-storage"
    feed.mkdir()
    first = manifests[0]
    schema = spark.read.parquet(staged_path(first, first.tables[TABLE].parts[0].path)).schema
    took = []
    for m in manifests:
        for n, part in enumerate(m.tables[TABLE].parts if TABLE in m.tables else ()):
            shutil.copyfile(staged_path(m, part.path), feed / f"w{m.window_seq:010d}-{n:05d}.parquet")
        began = time.perf_counter()
        run_pipeline(spark, feed, storage, schema, keys, target)
        took.append(time.perf_counter() - began)
    table = spark.table(f"{CATALOG}.{DATABASE}.{TABLE}").select(*[wl.q(n) for n in target.fieldNames()])
    got, duplicates = wl.frame_rows(table, keys)
    want = wl.source_rows(bw.connect(), KEYSPACE, TABLE, target, keys)
    spark.stop()
    return {
        "took": took,
        "missing": sorted(k[0] for k in want.keys() - got.keys()),
        "extra": len(got.keys() - want.keys()),
        "wrong": wl.differing_rows(got, want),
        "duplicates": duplicates,
    }


def apply_auto_cdc(port: int, sync: wl.Sync, work: Path, target: T.StructType) -> dict[str, Any]:
    """:func:`auto_cdc_side` in a child process: PySpark's functions build Spark Connect columns
    only in a process without a classic session."""
    spec = {
        "port": port,
        "work": str(work),
        "keys": list(sync.manifests[0].tables[TABLE].key_columns),
        "target": target.jsonValue(),
        "stage": sync.manifests[0].location,
        "sync_id": sync.sync_id,
        "windows": [m.window_seq for m in sync.manifests],
    }
    done = subprocess.run(
        [sys.executable, __file__, "--auto-cdc-side", json.dumps(spec)], stdout=subprocess.PIPE, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the Auto CDC side failed (exit {done.returncode}); its output is above")
    return dict(json.loads(lines[-1][len(RESULT) :]))


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--orders", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--transactions", type=int, default=60)
    p.add_argument("--splits", type=int, default=3, help="windows whose stop splits moves")
    p.add_argument("--split-moves", type=int, default=10, help="moves split by each such window")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    p.add_argument("--auto-cdc-side", help=argparse.SUPPRESS)  # the child process (JSON spec)
    args = p.parse_args()
    if args.auto_cdc_side:
        print(RESULT + json.dumps(auto_cdc_side(json.loads(args.auto_cdc_side))), flush=True)
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_autocdc-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        hook = bw.connect()
        cap = capture(hook, work, args)
        sync, manifests = cap.sync, cap.sync.manifests
        changes = sum(m.tables[TABLE].rows for m in manifests[1:] if TABLE in m.tables)
        ties = wl.cross_shard_ties(manifests, TABLE, "order_id")
        print(
            f"captured {len(manifests)} windows (snapshot of {manifests[0].rows:,} rows, then {changes:,} "
            f"change rows) in {cap.seconds:.1f}s: {cap.workload.moves} moves between shards "
            f"({len(cap.straddled)} split by a window stop), {cap.workload.key_changes} key changes; "
            f"{ties} keys with events from two shards in one commit second of one window",
            flush=True,
        )
        began = time.perf_counter()
        port = free_port()
        spark = session(work, port)
        print(f"Spark session (Delta, Spark Connect server) started in {time.perf_counter() - began:.1f}s")
        keys = list(manifests[0].tables[TABLE].key_columns)
        ours = apply_ours(spark, sync, work / "delta")
        target, our_rows = wl.delta_rows(spark, str(work / "delta" / TABLE), keys)
        want = wl.source_rows(hook, KEYSPACE, TABLE, target, keys)
        auto = apply_auto_cdc(port, sync, work, target)
        print(
            f"\n{len(manifests)} windows applied one by one; "
            f"oracle: SELECT * through vtgate ({len(want):,} rows)"
        )
        print(
            f"  {'':<28}{'total s':>9}{'median s/window':>17}"
            f"{'missing':>9}{'extra':>7}{'differ':>8}{'wrong':>7}"
        )
        our_missing = len(want.keys() - our_rows.keys())
        our_extra = len(our_rows.keys() - want.keys())
        rows = (
            ("ours (Delta MERGE)", ours, our_missing, our_extra, wl.differing_rows(our_rows, want)),
            ("Auto CDC (in-memory table)", auto["took"], len(auto["missing"]), auto["extra"], auto["wrong"]),
        )
        for label, took, missing, extra, wrong in rows:
            print(
                f"  {label:<28}{sum(took):9.1f}{statistics.median(took):17.2f}"
                f"{missing:9d}{extra:7d}{wrong - missing - extra:8d}{wrong:7d}"
            )
        lost = set(auto["missing"])
        split, inside = lost & set(cap.straddled), lost & two_shard_keys(manifests)
        print(
            f"  Auto CDC: of its {len(lost)} missing rows, {len(split)} are moves split by a window stop, "
            f"{len(inside - split)} others have events from two shards in one window, "
            f"{len(lost - split - inside)} neither; {auto['duplicates']} duplicate keys"
        )
        print(f"  per window, ours:     {' '.join(f'{t:.1f}' for t in ours)}")
        print(f"  per window, Auto CDC: {' '.join(f'{t:.1f}' for t in auto['took'])}")
        print(f"  load: {uptime()}")
        print(f"  command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        spark.stop()
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
