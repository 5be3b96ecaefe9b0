"""The cluster of ``dev/vitess_topology.sh`` and the Vitess workflows the reshard tests run on it.

The workflows are the steps of Vitess's own examples/local (MoveTables commerce -> customer,
then Reshard customer 0 -> -80,80-), each through ``vtctldclient``; every step's wall time is
recorded in ``Topology.timings``.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field

from tests.conftest import REPO, LocalVitess, cluster_from_env

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
