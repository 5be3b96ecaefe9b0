"""The clusters of ``dev/vitess_topology.sh``: the one the reshard tests run Vitess workflows on,
and the four-shard keyspace of the tests that need several shards (``four_shard_cluster``).

The workflows are the steps of Vitess's own examples/local (MoveTables commerce -> customer,
then Reshard customer 0 -> -80,80-), each through ``vtctldclient``; every step's wall time is
recorded in ``Topology.timings``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pymysql.cursors

from tests.support.local import REPO, LocalVitess, cluster_from_env, machine_lock

SCRIPT = REPO / "dev" / "vitess_topology.sh"
SCHEMA = REPO / "dev" / "vitess" / "schema"


@dataclass
class Topology:
    vitess: LocalVitess
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout

    def vtctl(self, *args: str, timeout: float = 300) -> str:
        return self.run("vtctldclient", *args, timeout=timeout)

    def timed(self, name: str, *args: str) -> str:
        started = time.monotonic()
        out = self.run(*args)
        self.timings[name] = round(time.monotonic() - started, 1)
        return out

    def wait_copied(self, keyspace: str, workflow: str, timeout: float = 180) -> None:
        """Until the workflow's copy phase is over (as examples/local waits for it)."""
        started = time.monotonic()
        deadline = started + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.vtctl("Workflow", "--keyspace", keyspace, "show", "--workflow", workflow)
            if '"state": "Error"' in out:
                raise AssertionError(f"workflow {keyspace}.{workflow} failed:\n{out}")
            if "Copy phase completed" in out:
                self.timings[f"{workflow} copy"] = round(time.monotonic() - started, 1)
                return
            time.sleep(1)
        raise AssertionError(f"workflow {keyspace}.{workflow} still copying after {timeout:g}s:\n{out}")

    # ----- the examples/local steps ---------------------------------------------------------

    def move_tables_create(self, tables: str = "customer,corder") -> None:
        self.timed("customer/0 tablet", "tablet", "customer", "0", "200")
        self.timed(
            "MoveTables create",
            "vtctldclient", "MoveTables", "--workflow", "commerce2customer", "--target-keyspace", "customer",
            "create", "--source-keyspace", "commerce", "--tables", tables,
        )  # fmt: skip
        self.wait_copied("customer", "commerce2customer")

    def move_tables_switch(self, *flags: str) -> None:
        self.timed(
            "MoveTables SwitchTraffic",
            "vtctldclient", "MoveTables", "--workflow", "commerce2customer", "--target-keyspace", "customer",
            "switchtraffic", *flags,
        )  # fmt: skip

    def move_tables_complete(self) -> None:
        self.timed(
            "MoveTables complete",
            "vtctldclient", "MoveTables", "--workflow", "commerce2customer", "--target-keyspace", "customer",
            "complete",
        )  # fmt: skip

    def reshard_create(self) -> None:
        self.vtctl("ApplyVSchema", "--vschema-file", str(SCHEMA / "customer" / "vschema.json"), "customer")
        self.timed("customer/-80 tablet", "tablet", "customer", "-80", "300")
        self.timed("customer/80- tablet", "tablet", "customer", "80-", "400")
        self.timed(
            "Reshard create",
            "vtctldclient", "Reshard", "--workflow", "cust2cust", "--target-keyspace", "customer", "create",
            "--source-shards", "0", "--target-shards", "-80,80-",
        )  # fmt: skip
        self.wait_copied("customer", "cust2cust")

    def reshard_switch(self) -> None:
        self.timed(
            "Reshard SwitchTraffic",
            "vtctldclient", "Reshard", "--workflow", "cust2cust", "--target-keyspace", "customer",
            "switchtraffic",
        )  # fmt: skip

    def reshard_complete_and_delete_old_shard(self) -> None:
        """`Reshard complete` deletes the old shard from the topology (v0.23: what examples/local
        306 + 307 did by hand); then its tablet and MariaDB go."""
        self.timed(
            "Reshard complete",
            "vtctldclient", "Reshard", "--workflow", "cust2cust", "--target-keyspace", "customer", "complete",
        )  # fmt: skip
        self.run("tablet-down", "200")


def start_topology() -> Topology:
    started = time.monotonic()
    out = subprocess.run([str(SCRIPT), "start"], check=True, capture_output=True, text=True).stdout
    topology = Topology(cluster_from_env(out))
    topology.timings["cluster start"] = round(time.monotonic() - started, 1)
    return topology


def stop_topology() -> None:
    if os.environ.get("VITESS_TOPO_KEEP"):
        return  # for looking at a failed run's cluster
    subprocess.run([str(SCRIPT), "stop"], check=False, capture_output=True)


# ----- the four-shard keyspace ---------------------------------------------------------------

FOUR_SHARD_KEYSPACE = "sharded"
FOUR_SHARDS = ("-40", "40-80", "80-c0", "c0-")
# vttablet's --vreplication-copy-phase-duration on the four-shard cluster, for every test that
# uses it: a few seconds, so a copy longer than it is a test input (tests/integration/
# test_copy_phase.py) and every other snapshot there is checked across copy-phase restarts too.
FOUR_SHARD_COPY_PHASE = "2s"
# glog writes its files in 30-second flushes; its stderr copy (each tablet's log in the state dir,
# ``vttablet-<uid>.log``) at once, so a test reads what a tablet did right after it did it.
FOUR_SHARD_VTTABLET_FLAGS = "--alsologtostderr"


@dataclass(frozen=True)
class FourShardCluster:
    """Keyspace ``sharded`` (-40,40-80,80-c0,c0-, one primary each) of ``dev/vitess_topology.sh``'s
    shards4 layout; tables and their vindexes are the tests' own (DDL through vtgate)."""

    vitess: LocalVitess
    keyspace: str
    shards: tuple[str, ...]
    copy_phase_duration: str
    state_dir: Path  # the tablets' logs are in state_dir / "logs"
    start_seconds: float  # this session's start (a cluster already running: its reuse)

    def tablet_log_sizes(self) -> dict[str, int]:
        """Each vttablet log's size now: ``tablet_logs(since=)`` reads what comes after."""
        return {f.name: f.stat().st_size for f in (self.state_dir / "logs").glob("vttablet-*.log")}

    def tablet_logs(self, since: dict[str, int] | None = None) -> str:
        """What every vttablet logged (after ``since``, from ``tablet_log_sizes``): e.g. the row
        streamers' copy queries and their errors."""
        texts = []
        for f in sorted((self.state_dir / "logs").glob("vttablet-*.log")):
            with open(f, "rb") as log:
                log.seek((since or {}).get(f.name, 0))
                texts.append(log.read().decode(errors="replace"))
        return "\n".join(texts)


def four_shard_env() -> dict[str, str]:
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return {
        **os.environ,
        "VITESS_TOPO_LAYOUT": "shards4",
        "VITESS_TOPO_COPY_PHASE_DURATION": FOUR_SHARD_COPY_PHASE,
        "VITESS_TOPO_VTTABLET_FLAGS": FOUR_SHARD_VTTABLET_FLAGS,
        "VITESS_TOPO_STATE_DIR": os.environ.get(
            "VITESS_TOPO_SHARDS4_STATE_DIR", f"{tmp}/airflow-provider-vitess-topology-shards4"
        ),
    }


@contextlib.contextmanager
def four_shard_cluster_running() -> Iterator[FourShardCluster]:
    """The four-shard cluster for one test session: started (or reused when one runs with the same
    settings), and stopped when the last session using it ends. The xdist workers of a run share
    it: each holds a shared lock on a file while it uses it; the one that ends holding it alone
    stops the cluster (``VITESS_TOPO_KEEP`` keeps it, to look at)."""
    env = four_shard_env()
    users = Path(tempfile.gettempdir()) / "airflow-provider-vitess-tests.shards4.users"
    with open(users, "a") as held:
        with machine_lock("shards4"):
            started = time.monotonic()
            proc = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise AssertionError(f"vitess_topology.sh start (shards4) failed:\n{proc.stderr[-4000:]}")
            fcntl.flock(held, fcntl.LOCK_SH)
        cluster = FourShardCluster(
            vitess=cluster_from_env(proc.stdout),
            keyspace=FOUR_SHARD_KEYSPACE,
            shards=FOUR_SHARDS,
            copy_phase_duration=FOUR_SHARD_COPY_PHASE,
            state_dir=Path(env["VITESS_TOPO_STATE_DIR"]),
            start_seconds=round(time.monotonic() - started, 1),
        )
        print(
            f"\nfour-shard cluster: start {cluster.start_seconds}s ({proc.stderr.strip().splitlines()[-1]})"
        )
        try:
            yield cluster
        finally:
            with machine_lock("shards4"):
                try:  # alone now (no other session holds its shared lock): the cluster goes
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    alone = True
                except BlockingIOError:
                    alone = False
                if alone and not os.environ.get("VITESS_TOPO_KEEP"):
                    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, check=False)


# ----- a primary and a replica ---------------------------------------------------------------

REPLICA_UID = 200  # commerce/0's replica; its primary is tablet 100


@dataclass(frozen=True)
class ReplicaCluster:
    """Keyspace ``commerce`` (one shard) of the commerce layout with a second tablet, of type
    replica, whose MariaDB replicates from the primary's (``dev/vitess_topology.sh replica``):
    its replication can be delayed (``delay``) as a lagging replica's would be."""

    vitess: LocalVitess
    env: dict[str, str]
    start_seconds: float

    def tablet_sql(self, sql: str, uid: int = REPLICA_UID, names: bool = False) -> str:
        """``sql`` on tablet ``uid``'s MariaDB itself (not through vtgate), its output (batch;
        ``names``: with the column names)."""
        flags = ["-B"] if names else ["-N", "-B"]
        proc = subprocess.run(
            [str(SCRIPT), "mysql", str(uid), *flags, "-e", sql], env=self.env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise AssertionError(f"tablet {uid}: {sql!r} failed:\n{proc.stderr[-2000:]}")
        return proc.stdout.strip()

    def delay(self, seconds: int) -> None:
        """The replica applies each transaction ``seconds`` after its primary committed it.
        Returns once vtgate reports the replica's lag again (``wait_lag_known``): START SLAVE
        returns while the replica's IO thread still connects ("Connecting", "Preparing"), and
        until it reads, MariaDB's Seconds_Behind_Master is NULL."""
        self.tablet_sql(f"STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = {seconds}; START SLAVE")
        status = self.tablet_sql("SHOW SLAVE STATUS\\G", names=True)
        assert f"SQL_Delay: {seconds}\n" in status + "\n" and "Slave_SQL_Running: Yes" in status, status
        self.wait_lag_known()

    def replication_status(self) -> list[dict[str, str]]:
        """vtgate's ``SHOW VITESS_REPLICATION_STATUS``: the rows of the replica's shard."""
        conn = pymysql.connect(
            host=self.vitess.host,
            port=self.vitess.mysql_port,
            user=self.vitess.user,
            password=self.vitess.password,
            autocommit=True,
            connect_timeout=10,
            cursorclass=pymysql.cursors.DictCursor,
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW VITESS_REPLICATION_STATUS LIKE 'commerce/0'")
                return [{k: str(v) for k, v in row.items()} for row in cur.fetchall()]
        finally:
            conn.close()

    def wait_lag_known(self, within: float = 120) -> None:
        """Until vtgate reports a known replication lag (a number >= 0) for the replica: what
        the sync's lag read needs (``vstream/source_clock.py``). A wait for the cluster to be
        ready, not a check. vtgate answers ``-1`` while its health check has no serving
        replica to ask (the tablet's first health report is still to come: the replica's
        vttablet starts before its MariaDB has the keyspace's database, retries each second,
        and a busy machine stretches that), ``NULL`` while the replica's IO thread connects."""
        deadline = time.monotonic() + within
        seen: list[dict[str, str]] = []
        while True:
            seen = [r for r in self.replication_status() if r["TabletType"] == "REPLICA"]
            if seen and all(r["ReplicationLag"].isdigit() for r in seen):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        logs = self.env["VITESS_TOPO_STATE_DIR"] + "/logs"
        raise AssertionError(
            f"vtgate reports no known replication lag for the replica of commerce/0 after {within:g}s "
            f"(SHOW VITESS_REPLICATION_STATUS: {seen or 'no REPLICA tablet'}): '-1' means vtgate's health "
            f"check has no serving replica to ask, 'NULL' that the replica's replication is not "
            f"running. Look at {logs}/vttablet.INFO (tablet {REPLICA_UID}) and vtgate.INFO"
        )


def _replica_env() -> dict[str, str]:
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return {
        **os.environ,
        "VITESS_TOPO_LAYOUT": "commerce",
        # Ports and state of its own: the reshard tests' cluster (17000) and the four-shard one
        # (17200) run beside it.
        "VITESS_TOPO_BASE_PORT": os.environ.get("VITESS_TOPO_REPLICA_BASE_PORT", "17600"),
        "VITESS_TOPO_STATE_DIR": os.environ.get(
            "VITESS_TOPO_REPLICA_STATE_DIR", f"{tmp}/airflow-provider-vitess-topology-replica"
        ),
    }


@contextlib.contextmanager
def replica_cluster_running() -> Iterator[ReplicaCluster]:
    """The primary-and-replica cluster for one test module: started (or reused when one runs
    with the same settings), its replica added, and stopped at the end (``VITESS_TOPO_KEEP``
    keeps it, to look at)."""
    env = _replica_env()
    started = time.monotonic()
    with machine_lock("replica-cluster"):
        out = ""
        for args in (["start"], ["replica", "commerce", "0", str(REPLICA_UID)]):
            proc = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise AssertionError(f"vitess_topology.sh {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
            out = out or proc.stdout
        # The script returns once the replica's MariaDB replicates; vtgate may not serve from its
        # tablet yet (its first health report), and a lag read then knows no lag.
        cluster = ReplicaCluster(cluster_from_env(out), env, 0)
        cluster.wait_lag_known()
        cluster = dataclasses.replace(cluster, start_seconds=round(time.monotonic() - started, 1))
        print(f"\nprimary-and-replica cluster: start {cluster.start_seconds}s")
        try:
            yield cluster
        finally:
            if not os.environ.get("VITESS_TOPO_KEEP"):
                subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, check=False)
