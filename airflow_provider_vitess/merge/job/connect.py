"""The merge on a long-running Spark Connect server: no JVM starts per window.

The merge job's code (:func:`.run.merge`) runs in the calling process against remote sessions
(:func:`run_merge`): manifests are read and checksums verified here, every DataFrame, MERGE and
Delta commit runs on the server; the tables' state is read with :mod:`.connect_tables` (no JVM
here). The process is left as it was found (:func:`remote_sessions`): an Airflow worker's next
task may use classic Spark. The sessions can be interrupted (:meth:`RemoteSessions.interrupt`:
the operator's ``on_kill``). Every write is SQL or a DataFrame writer (:mod:`.apply`), so
Delta's own Connect plugin is not needed on the server.

The server needs the job's Delta jar and session settings: :func:`server_args` gives its
spark-submit arguments (``python -m airflow_provider_vitess.merge.job.connect server-args``, used by
``dev/spark_connect.sh``). Its Python workers run the job's one UDF, so they need the same
Python minor version as this process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from airflow_provider_vitess.exceptions import MergeInterruptedError
from airflow_provider_vitess.merge.iceberg_catalog import DRIVERS
from airflow_provider_vitess.merge.job import connect_tables, run
from airflow_provider_vitess.merge.job.formats.delta import DeltaFormat
from airflow_provider_vitess.merge.spark_conf import (
    BASE_CONF,
    EXTENSIONS_CONF,
    LOCAL_CONF,
    connect_server_package,
    packages_for,
    with_iceberg_extensions,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
    from airflow_provider_vitess.merge.plan import MergePlan
    from airflow_provider_vitess.merge.report import MergeReport
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
    iceberg: bool = False,
) -> list[str]:
    """spark-submit arguments (before ``--class``) of a Connect server the merge can use: Delta
    (and S3A with ``s3``; Iceberg's runtime, SQL extensions and the JDBC catalog's driver with
    ``iceberg``, refused on a Spark line without a runtime) and the job's session settings.
    Delta's own Connect plugin is not needed: the job speaks SQL to Delta (:mod:`.apply`).

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
    packages = packages_for(locations, iceberg=iceberg)
    if iceberg:  # fixed when the server starts: the merge's sessions cannot add them
        conf[EXTENSIONS_CONF] = with_iceberg_extensions(conf[EXTENSIONS_CONF])
        packages += "," + ",".join(driver for _, driver in DRIVERS.values())
    server = connect_server_package()
    args = ["--packages", f"{packages},{server}" if server else packages]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


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


class RemoteSessions:
    """Makes sessions on one Connect server (call it) and can stop what they run
    (:meth:`interrupt`, from another thread or a signal handler)."""

    def __init__(self, make: Callable[[], SparkSession]) -> None:
        self._make = make
        self.made: list[SparkSession] = []
        self.interrupted = False

    def __call__(self) -> SparkSession:
        if self.interrupted:  # a table's piece starting after the kill: it must not run
            raise MergeInterruptedError("the merge was interrupted: no new Spark Connect session")
        session = self._make()
        self.made.append(session)
        return session

    def interrupt(self) -> None:
        """Interrupt every operation of the sessions made (the server cancels the queries, a
        MERGE among them, before its commit), then release the sessions, so the server runs
        nothing more for them: the merge's next call fails and the merge ends with an error."""
        self.interrupted = True
        for session in list(self.made):
            try:
                session.interruptAll()
            except Exception as exc:  # a session already gone: nothing runs on it
                log.warning("could not interrupt a Spark Connect session: %s", exc)
            try:
                session.stop()
            except Exception as exc:
                log.warning("could not release a Spark Connect session: %s", exc)


def _channel_builder(url: str, token: str | None) -> Any:
    """A Connect channel builder for ``url`` with ``token`` set apart (PySpark 4's
    DefaultChannelBuilder.set; PySpark 3.5's ChannelBuilder keeps the URL's parameters in a dict)."""
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder
    except ImportError:  # PySpark 3.5
        from pyspark.sql.connect.client import ChannelBuilder

        legacy = ChannelBuilder(url)  # type: ignore[arg-type,unused-ignore]
        if token is not None:
            legacy.params[_TOKEN_PARAM] = token  # type: ignore[attr-defined,unused-ignore]
        return legacy
    channel = DefaultChannelBuilder(url)
    if token is not None:
        channel.set(_TOKEN_PARAM, token)
    return channel


@contextmanager
def remote_sessions(url: str, conf: Mapping[str, str] | None = None) -> Iterator[RemoteSessions]:
    """A maker of new sessions on the Connect server at ``url`` (``sc://host:port/;token=...``)
    for the block, each with the session settings ``conf``. On every way out of it, each session
    made is stopped, pyspark's Connect default and active sessions are what they were, and the
    Connect mark is taken off the process's environment once no other block runs (the mark is
    process-wide: while a block runs, this process cannot use classic Spark)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    global _mode_users
    with _mode_lock:
        if _mode_users == 0:
            _mode_saved.clear()
            _mode_saved.update({name: os.environ.get(name) for name in MODE_VARIABLES})
        _mode_users += 1
    default = RemoteSession._default_session
    active = getattr(RemoteSession._active_session, "session", None)
    plain, token = split_token(url)

    def new() -> SparkSession:
        # A channel builder given the token apart, not a URL holding it (see split_token); the
        # Connect mark as SparkSession.builder.remote(url).create() would set it.
        channel = _channel_builder(plain, token)
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        session = cast("SparkSession", RemoteSession.builder.channelBuilder(channel).create())
        for key, value in (conf or {}).items():
            session.conf.set(key, value)
        return session

    sessions = RemoteSessions(new)
    made = sessions.made
    try:
        yield sessions
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


# -- running the merge -----------------------------------------------------------------------------


def run_merge(
    url: str,
    plan: MergePlan,
    *,
    s3: S3Settings | None = None,
    progress: Progress | None = None,
    parallelism: int | None = None,
    timings: dict[str, float] | None = None,
    started: Callable[[RemoteSessions], None] | None = None,
    conf: Mapping[str, str] | None = None,
    iceberg_catalog: IcebergCatalog | None = None,
) -> MergeReport:
    """The merge job's :func:`~airflow_provider_vitess.merge.job.merge` of ``plan`` on the server
    at ``url``: one remote session per concurrently merged table, all stopped on return and the
    process left for classic Spark (:func:`remote_sessions`). ``s3`` configures this process's
    fsspec (manifests); the server reads ``s3a://`` with its own S3A settings. ``timings``: as
    the job's, plus ``session`` (the first session) and ``session stop``. ``started`` is given
    the block's sessions before the first is made: what a kill calls :meth:`~RemoteSessions.
    interrupt` on. ``conf``: session settings (SQL and Delta ones) every session gets.
    ``iceberg_catalog``: the plan's JDBC catalog with its credentials (the task's connection)."""
    if s3 is not None:
        run.use_s3_settings(s3)
    timed = timings if timings is not None else {}
    began = time.monotonic()
    with remote_sessions(url, conf) as new_session:
        if started is not None:
            started(new_session)
        spark = new_session()
        timed["session"] = time.monotonic() - began
        report = run.merge(
            spark,
            plan,
            progress=progress,
            new_session=new_session,
            parallelism=parallelism,
            timings=timed,
            # Iceberg's format is the same on either kind of session: run.merge picks it.
            table_format=DeltaFormat(connect_tables) if plan.table_format == "delta" else None,
            iceberg_catalog=iceberg_catalog,
        )
        stopping = time.monotonic()
    timed["session stop"] = time.monotonic() - stopping
    return report


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_provider_vitess.merge.job.connect")
    sub = p.add_subparsers(dest="command", required=True)
    args_cmd = sub.add_parser("server-args", help="spark-submit arguments of a Connect server, one a line")
    args_cmd.add_argument("--port", type=int, default=DEFAULT_PORT)
    args_cmd.add_argument("--local-dir")
    args_cmd.add_argument("--cluster", action="store_true", help="no small-machine settings")
    args_cmd.add_argument("--s3", action="store_true", help="with Hadoop's S3A (s3a:// tables)")
    args_cmd.add_argument("--iceberg", action="store_true", help="with Iceberg (table_format='iceberg')")
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
                iceberg=args.iceberg,
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
