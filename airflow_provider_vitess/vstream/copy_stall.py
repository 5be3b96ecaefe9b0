"""A snapshot's copy that stopped moving: how long to wait for it, and the error that names why.

How Vitess v0.23 bounds a VStream copy (read in its source, not documented for VStream):

* vttablet's row streamer (``vstreamer/rowstreamer.go``, ``buildSelect``) reads a table with one
  query per copy cycle, ``select /*+ MAX_EXECUTION_TIME(d) */ ... order by <key>``, ``d`` being
  vttablet's ``--vreplication-copy-phase-duration`` (default 1h). MySQL kills the query when
  ``d`` runs out (error 3024); MariaDB before 12.0 ignores the hint, so there a copy query runs
  to its end (dev/vitess_topology.sh makes the test cluster behave as MySQL).
* The tablet's stream ends with that error; vtgate (``vstream_manager.go``, ``shouldRetry``)
  takes it for a passing one and streams the shard again from the last position it sent the
  client, whose table last-PKs name the last copied key: the next query goes on from there.
  The client sees none of this, only vtgate's heartbeats while the shard is silent.
* So a copy longer than ``d`` finishes, cycle by cycle, as long as each query sends rows within
  ``d``. One that cannot (a table without a primary key or unique NOT NULL key is copied
  ``order by`` every column: sorted whole before its first row) starts over from the same key
  every ``d``, for ever (vitessio/vitess#20039): the stream stays alive and makes no progress.

The snapshot's read (``window.py``) fails a copy whose copying shards sent nothing but
heartbeats for ``copy_stall_seconds``: by default just over vttablet's default duration, so no
copy query that Vitess lets run is cut here, and a stall past it has been restarted by Vitess
at least once without a row. The error names the table, the flag and the remedy.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_vitess.exceptions import CopyStalledError

# vttablet's default --vreplication-copy-phase-duration (1h), and five minutes for the restart.
COPY_STALL_SECONDS = 3_900.0

FLAG = "--vreplication-copy-phase-duration"


def stalled(
    keyspace: str, in_copy: Mapping[str, str | None], silent: float, limit: float
) -> CopyStalledError:
    """The error for a copy silent for ``silent`` seconds (past ``limit``) on the shards of
    ``in_copy``, each with the table it copies (None: not known yet)."""
    where = "; ".join(
        f"shard {shard}: table {table!r}" if table else f"shard {shard}: its first table"
        for shard, table in sorted(in_copy.items())
    )
    return CopyStalledError(
        f"keyspace {keyspace!r}: the snapshot's copy sent no row for {silent:.0f}s ({where}) while "
        f"vtgate's heartbeats kept the stream alive (copy_stall_timeout={limit:g}s). vttablet ends a "
        f"copy query that runs past its {FLAG} (default 1h) and vtgate starts it again from the "
        "last copied key: a query that cannot send its first rows within that time (a table "
        "without a primary key is sorted whole before its first row) starts over for ever "
        "(vitessio/vitess#20039). Remedy: raise "
        f"{FLAG} on the vttablets of keyspace {keyspace!r} above the time that table's copy query "
        "needs to send its first rows (or give the table a primary key), and the snapshot's "
        "copy_stall_timeout above that duration; the rerun resumes from the snapshot's last checkpoint"
    )
