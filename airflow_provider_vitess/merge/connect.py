"""The merge on a long-running Spark Connect server: no JVM starts per window.

The merge job's code (:func:`airflow_provider_vitess.merge.job.merge`) runs in the calling
process against remote sessions (``SparkSession.builder.remote("sc://...")``): manifests are
read and checksums verified here, every DataFrame, MERGE and Delta commit runs on the server.
The process is left as it was found (:func:`remote_sessions`): an Airflow worker's next task
may use classic Spark.
The window state machine and the Delta transaction ids are the spark-submit mode's: the same
function, the same plan, the same (txnAppId, txnVersion) per (table, window).

What Spark Connect lacks is the JVM: the classic job asks Delta's ``DeltaLog`` for a table's
snapshot through py4j; here :func:`table_state` asks the same through SQL (``DESCRIBE
HISTORY``, the table's schema) and reads the rest from the version's checksum file
(:mod:`.checksum`), else from the table (``SHOW TBLPROPERTIES``, and this sync's latest
transaction version from the log files of the table's snapshot, :func:`txn_version`). Every
write is SQL or a DataFrame writer (:mod:`.apply`), so Delta's own Connect plugin is not needed
on the server.

The server needs the job's Delta jar and session settings: :func:`server_args` gives its
spark-submit arguments (``python -m airflow_provider_vitess.merge.connect server-args``, used by
``dev/spark_connect.sh``). Its Python workers run the job's one UDF, so they need the same
Python minor version as this process.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from airflow_provider_vitess.merge.delta_log import log_dir, log_file
from airflow_provider_vitess.merge.spark_conf import BASE_CONF, LOCAL_CONF, packages_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.plan import MergePlan
    from airflow_provider_vitess.merge.report import MergeReport
    from airflow_provider_vitess.merge.steps import TableSize, TableState
    from airflow_provider_vitess.object_storage import S3Settings

log = logging.getLogger(__name__)
DEFAULT_PORT = 15002
# The Connect server's (and pyspark's) environment variable holding the authentication token.
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
_TOKEN_PARAM = "token"
Progress = Callable[[int, str, str], None]


def server_args(
    *,
    port: int = DEFAULT_PORT,
    local_dir: str | None = None,
    local: bool = True,
    s3: bool = False,
    authenticated: bool = False,
) -> list[str]:
    """spark-submit arguments (before ``--class``) of a Connect server the merge can use: Delta
    (and S3A with ``s3``) and the job's session settings. Delta's own Connect plugin is not
    needed: the job speaks SQL to Delta (:mod:`.apply`).

    A server for a cluster (not ``local``) listens on every interface, and anyone who reaches
    it runs code as it: it must require a token (``authenticated``: the server's environment
    has :data:`TOKEN_ENV`; in the environment, not the arguments, which ``ps`` shows)."""
    if not local and not authenticated:
        raise ValueError(
            "a Spark Connect server for a cluster listens on 0.0.0.0 and must require a token: set "
            f"{TOKEN_ENV} in its environment (not on its command line) and the same token as the "
            "password of the spark_connect connection. pyspark sends a token only over TLS "
            "(except to localhost): put a TLS proxy in front of the server"
        )
    locations = ["s3a://"] if s3 else []
    conf = {
        **BASE_CONF,
        **(LOCAL_CONF if local else {}),
        "spark.connect.grpc.binding.address": "127.0.0.1" if local else "0.0.0.0",
        "spark.connect.grpc.binding.port": str(port),
    }
    if local_dir:
        conf["spark.local.dir"] = local_dir
    args = ["--packages", packages_for(locations)]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect (remote) session rather than a classic one (by its
    class's module: importing Connect's client costs a classic job a second)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


# pyspark marks a process that makes a remote session for Spark Connect and never unmarks it:
# SPARK_CONNECT_MODE_ENABLED (``pyspark.sql.utils.is_remote``: every function, column and
# DataFrame call then builds Connect objects, and a classic SparkContext refuses to start), and
# in its local mode SPARK_REMOTE/SPARK_LOCAL_REMOTE. A worker process runs many tasks (an Airflow
# worker, a test session): the next one's classic Spark must find the process as it was.
MODE_VARIABLES = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
_mode_lock = threading.Lock()
_mode_users = 0  # blocks of remote_sessions running (threads): the last to end restores
_mode_saved: dict[str, str | None] = {}


def split_token(url: str) -> tuple[str, str | None]:
    """``url`` (``sc://host:port/;k=v;...``) without its ``token`` parameter, and the token
    URL-decoded (Airflow's Spark Connect hook URL-encodes it). The token then never travels in a
    URL: pyspark quotes a URL it cannot parse in its error (a token with ``/`` is one), and the
    URL-encoded form escapes Airflow's secret masker."""
    base, _, params = url.partition(";")
    kept, token = [], None
    for param in params.split(";") if params else []:
        name, _, value = param.partition("=")
        if name == _TOKEN_PARAM:
            token = unquote(value)
        else:
            kept.append(param)
    return ";".join([base, *kept]), token


def redacted(url: str) -> str:
    """``url`` fit for a log line: its token replaced."""
    plain, token = split_token(url)
    return plain if token is None else f"{plain};{_TOKEN_PARAM}=***"


def _channel_builder(url: str, token: str | None) -> Any:
    """A Connect channel builder for ``url`` with ``token`` set apart (PySpark 4's
    DefaultChannelBuilder.set; PySpark 3.5's ChannelBuilder keeps the URL's parameters in a dict)."""
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder
    except ImportError:  # PySpark 3.5
        from pyspark.sql.connect.client import ChannelBuilder

        legacy = ChannelBuilder(url)
        if token is not None:
            legacy.params[_TOKEN_PARAM] = token
        return legacy
    channel = DefaultChannelBuilder(url)
    if token is not None:
        channel.set(_TOKEN_PARAM, token)
    return channel


@contextmanager
def remote_sessions(url: str) -> Iterator[Callable[[], SparkSession]]:
    """A maker of new sessions on the Connect server at ``url`` (``sc://host:port/;token=...``)
    for the block. On every way out of it, each session made is stopped, pyspark's Connect
    default and active sessions are what they were, and the Connect mark is taken off the
    process's environment once no other block runs (the mark is process-wide: while a block
    runs, this process cannot use classic Spark)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    global _mode_users
    with _mode_lock:
        if _mode_users == 0:
            _mode_saved.clear()
            _mode_saved.update({name: os.environ.get(name) for name in MODE_VARIABLES})
        _mode_users += 1
    default = RemoteSession._default_session
    active = getattr(RemoteSession._active_session, "session", None)
    made: list[SparkSession] = []

    plain, token = split_token(url)

    def new() -> SparkSession:
        # A channel builder given the token apart, not a URL holding it (see split_token); the
        # Connect mark as SparkSession.builder.remote(url).create() would set it.
        channel = _channel_builder(plain, token)
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        session = cast("SparkSession", RemoteSession.builder.channelBuilder(channel).create())
        made.append(session)
        return session

    try:
        yield new
    finally:
        for session in made:
            try:
                session.stop()
            except Exception as exc:  # a session the server already lost: nothing to release
                log.warning("could not stop a Spark Connect session on %s: %s", redacted(url), exc)
        ours = {id(session) for session in made}
        with _mode_lock:
            if id(RemoteSession._default_session) in ours:
                RemoteSession._default_session = default
            if id(getattr(RemoteSession._active_session, "session", None)) in ours:
                RemoteSession._active_session.session = active
            _mode_users -= 1
            if _mode_users == 0:
                for name, value in _mode_saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


# -- Delta table state without a JVM ---------------------------------------------------------------


def _table(path: str) -> str:
    from airflow_provider_vitess.merge.apply import q

    return f"delta.{q(path)}"


# Delta's error conditions for a path that holds no Delta table (yet), as the classic job's
# DeltaLog sees it (version -1): the merge creates it.
NO_TABLE = frozenset(
    {"DELTA_TABLE_ONLY_OPERATION", "DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND", "PATH_NOT_FOUND"}
)


def table_version(spark: SparkSession, path: str) -> int:
    """The table's latest version (-1: no table)."""
    from pyspark.errors import AnalysisException

    try:
        row = spark.sql(f"DESCRIBE HISTORY {_table(path)} LIMIT 1").select("version").first()
    except AnalysisException as exc:
        if exc.getCondition() in NO_TABLE:
            return -1
        raise
    assert row is not None, f"Delta table {path} has no history"
    return int(row[0])


def table_size(spark: SparkSession, path: str) -> TableSize:
    from airflow_provider_vitess.merge.steps import TableSize

    row = spark.sql(f"DESCRIBE DETAIL {_table(path)}").select("numFiles", "sizeInBytes").first()
    return TableSize(0, 0) if row is None else TableSize(int(row[0] or 0), int(row[1] or 0))


def txn_version(
    spark: SparkSession, path: str, app_id: str, version: int, checkpoint_interval: int = 10
) -> int | None:
    """The latest transaction version of ``app_id`` in the table at ``version`` (None: never
    written).

    Delta's snapshot keeps, per app id, the last ``txn`` action in log order; the merge writes
    an app id's versions in increasing window order only (Delta skips a lower one), so the
    highest version in a checkpoint at or before ``version`` and the commits after it is that
    one. The whole log keeps a commit per window for the log retention (30 days by default):
    thousands of files, which a read of all of them would parse on every window. So, in turn
    while a named file is missing: the checkpoint Delta writes every ``checkpoint_interval``
    commits (one read, no listing), the newest complete checkpoint Spark lists, the whole log.
    """
    from pyspark.errors import AnalysisException

    interval = max(1, checkpoint_interval)
    for files in (
        lambda: _files_since(path, version // interval * interval, version),
        lambda: _listed_checkpoint_files(spark, path, version),
    ):
        try:
            named = files()
            if named is None:
                break
            return _max_txn(spark, named, app_id)
        except AnalysisException as exc:
            if exc.getCondition() != "PATH_NOT_FOUND":
                raise
    log.info("Delta log of %s: no checkpoint named here is whole; reading the whole log", path)
    return _max_txn(spark, [], app_id, whole_log=log_dir(path))


def _files_since(
    path: str, checkpoint: int, version: int, parts: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """(path, format) of the table's classic checkpoint at ``checkpoint`` (its ``parts``, or its
    one file; none for 0, which Delta does not write) and the commits after it up to
    ``version``."""
    files = [(p, "parquet") for p in parts]
    if checkpoint > 0 and not parts:
        files.append((log_file(path, checkpoint, "checkpoint.parquet"), "parquet"))
    first = checkpoint + 1 if checkpoint > 0 else 0
    return files + [(log_file(path, v, "json"), "json") for v in range(first, version + 1)]


# A classic checkpoint: one file, or part i of n. (A V2 checkpoint names a UUID: not matched.)
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


def _listed_checkpoint_files(spark: SparkSession, path: str, version: int) -> list[tuple[str, str]] | None:
    """:func:`_files_since` the newest complete classic checkpoint at or before ``version`` that
    Spark lists (names only: ``binaryFile`` without its content column reads no file); None when
    a V2 checkpoint, whose files are not named here, is newer."""
    listed = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", "*.checkpoint*.parquet")
        .load(log_dir(path))
        .select("path")
        .collect()
    )
    parts: dict[int, dict[int, str]] = {}  # version -> part -> path
    counts: dict[int, int] = {}
    newest_other = -1
    for (file,) in listed:
        found = _CHECKPOINT.search(str(file))
        if found is None:
            newest_other = max(newest_other, _version_prefix(str(file)))
            continue
        at = int(found[1])
        parts.setdefault(at, {})[int(found[2] or 1)] = str(file)
        counts[at] = int(found[3] or 1)
    complete = [v for v in parts if v <= version and len(parts[v]) == counts[v]]
    since = max(complete, default=0)
    if since < newest_other <= version:
        return None
    return _files_since(path, since, version, [parts[since][i] for i in sorted(parts.get(since, {}))])


def _version_prefix(file: str) -> int:
    name = file.rsplit("/", 1)[-1]
    return int(name[:20]) if name[:20].isdigit() else -1


def _max_txn(
    spark: SparkSession, files: Sequence[tuple[str, str]], app_id: str, whole_log: str | None = None
) -> int | None:
    """The highest txn version of ``app_id`` in ``files`` ((path, format) pairs), or in every
    commit and checkpoint file of the log directory ``whole_log``."""
    from pyspark.sql import functions as F

    schema = "txn struct<appId: string, version: bigint>"
    frames = []
    if whole_log is not None:  # a filter, not a glob path: no error when no checkpoint exists yet
        for fmt, glob in (("json", "*.json"), ("parquet", "*.checkpoint*.parquet")):
            frames.append(
                spark.read.schema(schema).option("pathGlobFilter", glob).format(fmt).load(whole_log)
            )
    for fmt in ("json", "parquet"):
        paths = [p for p, f in files if f == fmt]
        if paths:
            frames.append(spark.read.schema(schema).format(fmt).load(paths))
    if not frames:
        return None
    union = functools.reduce(lambda a, b: a.unionByName(b), frames)
    found = union.where(F.col("txn.appId") == F.lit(app_id)).agg(F.max("txn.version")).first()
    return None if found is None or found[0] is None else int(found[0])


def table_state(spark: SparkSession, path: str, app_id: str, restores_after: int | None) -> TableState:
    """:func:`airflow_provider_vitess.merge.delta_state.table_state` over Spark Connect.

    What the version's checksum file says (:mod:`.checksum`: properties, the transaction
    versions, files and bytes) is read from it: one small read, where asking the table costs a
    metadata query, a read of log files and a rebuild of the version's file list (``DESCRIBE
    DETAIL``, ~1.4 s a table on 2 cores); what it leaves out is asked of the table."""
    from airflow_provider_vitess.merge.checksum import read_checksum
    from airflow_provider_vitess.merge.delta_state import restores
    from airflow_provider_vitess.merge.steps import TableState

    version = table_version(spark, path)
    if version < 0:
        return TableState(exists=False)
    crc = read_checksum(spark, path, version)
    props = crc.properties if crc is not None else None
    if props is None:  # metadata only: no file list built
        props = {str(k): str(v) for k, v in spark.sql(f"SHOW TBLPROPERTIES {_table(path)}").collect()}
    if crc is not None and crc.knows_txns():
        txn = crc.txn_version(app_id)
    else:
        txn = txn_version(spark, path, app_id, version, int(props.get("delta.checkpointInterval") or 10))
    return TableState(
        exists=True,
        schema=spark.read.format("delta").load(path).schema,
        txn_version=txn,
        column_mapping=props.get("delta.columnMapping.mode", "none") != "none",
        version=version,
        restores=restores(spark, path, restores_after, version),
        size=crc.size if crc is not None else None,
    )


# -- running the merge -----------------------------------------------------------------------------


def run_merge(
    url: str,
    plan: MergePlan,
    *,
    s3: S3Settings | None = None,
    progress: Progress | None = None,
    parallelism: int | None = None,
    timings: dict[str, float] | None = None,
) -> MergeReport:
    """The merge job's :func:`~airflow_provider_vitess.merge.job.merge` of ``plan`` on the server
    at ``url``: one remote session per concurrently merged table, all stopped on return and the
    process left for classic Spark (:func:`remote_sessions`). ``s3`` configures this process's
    fsspec (manifests); the server reads ``s3a://`` with its own S3A settings. ``timings``: as
    the job's, plus ``session`` (the first session) and ``session stop``."""
    from airflow_provider_vitess.merge import job

    if s3 is not None:
        job.use_s3_settings(s3)
    timed = timings if timings is not None else {}
    began = time.monotonic()
    with remote_sessions(url) as new_session:
        spark = new_session()
        timed["session"] = time.monotonic() - began
        report = job.merge(
            spark, plan, progress=progress, new_session=new_session, parallelism=parallelism, timings=timed
        )
        stopping = time.monotonic()
    timed["session stop"] = time.monotonic() - stopping
    return report


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_provider_vitess.merge.connect")
    sub = p.add_subparsers(dest="command", required=True)
    args_cmd = sub.add_parser("server-args", help="spark-submit arguments of a Connect server, one a line")
    args_cmd.add_argument("--port", type=int, default=DEFAULT_PORT)
    args_cmd.add_argument("--local-dir")
    args_cmd.add_argument("--cluster", action="store_true", help="no small-machine settings")
    args_cmd.add_argument("--s3", action="store_true", help="with Hadoop's S3A (s3a:// tables)")
    merge_cmd = sub.add_parser("merge", help="merge a MergePlan (JSON file) on the server at URL")
    merge_cmd.add_argument("url")
    merge_cmd.add_argument("plan_file")
    args = p.parse_args(argv)
    if args.command == "server-args":
        try:
            found = server_args(
                port=args.port,
                local_dir=args.local_dir,
                local=not args.cluster,
                s3=args.s3,
                authenticated=bool(os.environ.get(TOKEN_ENV)),
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print("\n".join(found))
        return 0
    from pathlib import Path

    from airflow_provider_vitess.merge.plan import MergePlan
    from airflow_provider_vitess.object_storage import S3Settings

    started = time.monotonic()
    plan = MergePlan.from_json(Path(args.plan_file).read_text())
    report = run_merge(args.url, plan, s3=S3Settings.from_environment(os.environ))
    print(report.to_json())
    print(f"merged in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
