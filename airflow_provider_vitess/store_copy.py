"""Move syncs to another checkpoint store: ``python -m airflow_provider_vitess.store_copy``.

Run where the DAGs run (the stores' credentials come from Airflow connections, never from the
command line), while none of the syncs' tasks run (pause their DAGs first)::

    python -m airflow_provider_vitess.store_copy --to-conn vitess_store_pg
    python -m airflow_provider_vitess.store_copy --from-conn old_store --to-conn new_store --sync-id s1

Without ``--from-conn`` the source is the default SQLite store under ``AIRFLOW_HOME``. Then set
the DAGs' ``checkpoint_conn_id`` to the new connection.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_provider_vitess.checkpoints import CheckpointStore
from airflow_provider_vitess.checkpoints.transfer import copy_syncs
from airflow_provider_vitess.connections import store_url
from airflow_provider_vitess.exceptions import CheckpointError


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_provider_vitess.store_copy", description=__doc__)
    p.add_argument("--from-conn", help="the old store's connection id (default: the SQLite default store)")
    p.add_argument("--to-conn", required=True, help="the new store's connection id")
    p.add_argument("--sync-id", action="append", help="a sync to copy (repeat; default: all)")
    args = p.parse_args(argv)
    source, target = CheckpointStore(store_url(args.from_conn)), CheckpointStore(store_url(args.to_conn))
    try:
        counts = copy_syncs(source, target, args.sync_id)
    except CheckpointError as exc:
        print(f"nothing copied: {exc}", file=sys.stderr)
        return 2
    finally:
        source.close()
        target.close()
    for table, rows in counts.items():
        print(f"{table}: {rows} row(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
