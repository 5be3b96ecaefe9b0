"""Fixtures of the integration tests that more than one module shares and that need a cluster of
their own (the local cluster's fixtures are in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.big_table import make_big_table
from tests.support.local import LocalVitess
from tests.support.topology import FourShardCluster, four_shard_cluster_running


@pytest.fixture(scope="session")
def four_shard_cluster() -> Iterator[FourShardCluster]:
    """Keyspace ``sharded`` of four shards (-40,40-80,80-c0,c0-) on ``dev/vitess_topology.sh``'s
    shards4 layout, with vttablet's copy-phase duration at a few seconds; started once per test
    session and shared by the xdist workers (``topology.four_shard_cluster_running``)."""
    with four_shard_cluster_running() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def big_table(vitess: LocalVitess) -> str:
    """``commerce.big`` with exactly 200,000 rows (``tests/support/big_table.py``), for the snapshot
    tests that kill a long copy: the Airflow connection id that reaches it."""
    return make_big_table(vitess)
