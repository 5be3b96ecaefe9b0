"""The Spark Connect server of a pytest worker: the worker's own test JVM, serving Connect too.

Each worker has a classic SparkSession for its oracle reads and in-process merges
(:func:`.delta_check.spark_session`), and the DAG tests merge on a Spark Connect server (the
``spark_connect`` fixture). Both used to be JVMs of their own: two per worker, each loading
Spark's and Delta's classes, compiling the same hot code, and rebuilding the same Delta log
snapshots (a merge's new version, then the oracle's read of it). Spark's Connect plugin makes the
worker's JVM the server too. Its settings are the product's own for a local server
(``merge.job.connect.server_args``, what ``dev/spark_connect.sh`` starts), so the Connect merges
of the suite still run on what a user's server is given; the script itself stays covered by the
Iceberg server (``spark_connect_iceberg``) and the fleet.

On Spark 3.5 (the compatibility matrix's older line), whose server has no token setting, the
fixture starts the script's server as before, as it does with
``VITESS_TEST_CONNECT_SERVER=process``.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass
from urllib.parse import quote

from airflow_provider_vitess.merge.spark_conf import installed_spark_line
from tests.support.databases import free_port

PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
# Where the product's server keeps its scratch files; the test JVM keeps Spark's default.
_NOT_IN_PROCESS = ("spark.local.dir",)


@dataclass(frozen=True)
class ConnectEndpoint:
    """Where this process's Connect server listens, and the token it requires."""

    port: int
    token: str

    @property
    def url(self) -> str:
        return with_token(f"sc://localhost:{self.port}", self.token)


def with_token(url: str, token: str) -> str:
    """A server's ``url`` with its token as Airflow's Spark Connect hook writes it (``;token=``
    URL-encoded)."""
    return f"{url}/;token={quote(token)}"


def in_process() -> bool:
    """Whether this process's test JVM serves Spark Connect (module docstring)."""
    if os.environ.get("VITESS_TEST_CONNECT_SERVER") == "process":
        return False
    return not installed_spark_line().pyspark.startswith("3.")


def new_token() -> str:
    """A server's token, with the characters of a base64 secret (``/``, ``+``, ``=``): the URL
    must carry it encoded."""
    return f"{secrets.token_hex(6)}/{secrets.token_hex(6)}+{secrets.token_hex(6)}="


@functools.cache
def endpoint() -> ConnectEndpoint:
    """This process's endpoint: a free port and a token, chosen once (a JVM that replaces a dead
    one listens where it did)."""
    return ConnectEndpoint(free_port(), new_token())


def server_conf() -> tuple[dict[str, str], list[str]]:
    """The test JVM's settings as this process's Connect server, and the packages the server
    needs: the product's local server settings (``server_args``), the plugin, and the token."""
    # Imported here: the module brings PySpark and the merge job, which conftest (this module's
    # importer in every pytest process, unit tier too) has no need of.
    from airflow_provider_vitess.merge.job.connect import server_args

    args = server_args(port=endpoint().port, local=True)
    conf: dict[str, str] = {}
    packages: list[str] = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag == "--packages":
            packages = value.split(",")
        else:
            assert flag == "--conf", args
            key, _, setting = value.partition("=")
            if key not in _NOT_IN_PROCESS:
                conf[key] = setting
    conf["spark.plugins"] = PLUGIN
    conf["spark.connect.authenticate.token"] = endpoint().token
    return conf, packages
