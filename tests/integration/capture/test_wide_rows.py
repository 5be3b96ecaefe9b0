"""Wide rows from the real vtgate: a transaction past the read's byte limit spills to the
configured directory, stages exactly the source's rows, and leaves no spill file open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy

from airflow_provider_vitess.hooks.vitess import VitessHook
from airflow_provider_vitess.staging import WindowStager, read_table
from airflow_provider_vitess.vstream.spill import MemoryLimits
from airflow_provider_vitess.vstream.window import WindowReader, capture_stop_position
from tests.support.spill import spill_fds

pytestmark = pytest.mark.integration

TABLE = "wide_rows"
ROWS = 12
BODY = 1 << 20  # 1 MiB a row: the transaction is 12 MiB, the read's limit 2 MiB


def test_a_transaction_of_wide_rows_spills_and_stages_exactly(vitess_conn_id: str, tmp_path: Path) -> None:
    hook = VitessHook(vitess_conn_id)
    spill = tmp_path / "spill"
    spill.mkdir()
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{TABLE}"))
        conn.execute(
            sqlalchemy.text(f"CREATE TABLE commerce.{TABLE} (id BIGINT NOT NULL PRIMARY KEY, body LONGBLOB)")
        )
    try:
        opener = lambda request: hook.open_vstream_raw(request, timeout=120)  # noqa: E731
        start = capture_stop_position(opener, "commerce")
        bodies = {i: os.urandom(BODY) for i in range(1, ROWS + 1)}
        with hook.connect_sql() as conn, conn.begin():  # one transaction
            for i, body in bodies.items():
                conn.execute(
                    sqlalchemy.text(f"INSERT INTO commerce.{TABLE} (id, body) VALUES (:i, :b)"),
                    {"i": i, "b": body},
                )
        stop = capture_stop_position(opener, "commerce")

        seen: list[int] = []
        stager = WindowStager(str(tmp_path / "staging"), "wide", 1, key_columns={TABLE: ["id"]})
        result = WindowReader(
            opener,
            stager,
            keyspace="commerce",
            tables=[TABLE],
            start=start,
            stop=stop,
            flags=hook.vstream_flags(heartbeat_interval=1),
            memory=MemoryLimits(max_buffered_bytes=2 << 20, transaction_bytes=2 << 20, spill_dir=str(spill)),
            on_rows=lambda table, n: seen.append(len(spill_fds(spill))),
        ).run()
        manifest = stager.finish(start, stop, result.end_vgtid, stats=result.stats)

        assert result.stats["spilled_transactions"] == 1
        assert max(seen) == 1  # staged from its spill file, in the configured directory...
        assert spill_fds(spill) == [] and os.listdir(spill) == []  # ... freed once read
        staged = read_table(manifest, TABLE).to_pydict()
        assert dict(zip(staged["id"], staged["body"], strict=True)) == bodies
        with hook.connect_sql() as conn:
            rows = conn.execute(sqlalchemy.text(f"SELECT id, body FROM commerce.{TABLE}")).all()
        source: dict[int, bytes] = {r[0]: r[1] for r in rows}
        assert source == bodies  # the oracle: target == SELECT * through vtgate
    finally:
        with hook.connect_sql() as conn, conn.begin():
            conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS commerce.{TABLE}"))
