"""Runs one DAG run with ``dag.test()`` in this process (started by ``AirflowEnv.run_dag``).

Usage: python -m tests.integration.run_dag RESULT_FILE DAG_ID CONF_JSON [LOGICAL_DATE]
Writes ``{"state": ..., "tasks": {task_id: state}, ...}`` to RESULT_FILE at the end: a file, not
stdout, where a log line of another thread (OpenLineage's client at exit) can land on the same
line (CI, session 20).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path


def main(argv: list[str]) -> None:
    from airflow_provider_vitess.utils.airflow_compat import dag_bag

    result_file, dag_id, conf = Path(argv[0]), argv[1], json.loads(argv[2])
    logical_date = datetime.fromisoformat(argv[3]) if len(argv) > 3 else None
    bag = dag_bag()
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    dag = bag.get_dag(dag_id)
    if dag is None:
        raise SystemExit(f"no DAG {dag_id!r} in {sorted(bag.dag_ids)}")
    kwargs = {"logical_date": logical_date} if logical_date else {}
    run = dag.test(run_conf=conf, **kwargs)
    instances = run.get_task_instances()
    tasks = {ti.task_id: str(ti.state) for ti in instances}
    # A mapped task's instances (capture_parallelism): each map index's state.
    mapped: dict[str, dict[int, str]] = {}
    for ti in instances:
        if getattr(ti, "map_index", -1) >= 0:
            mapped.setdefault(ti.task_id, {})[ti.map_index] = str(ti.state)
    result = {"state": str(run.state), "run_id": run.run_id, "tasks": tasks, "mapped": mapped}
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
