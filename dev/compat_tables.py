"""``make test-compat``'s step ``spark4-tables``: a Spark 3 reader of tables a Spark 4 merge wrote.

``write OUT`` (run by the repo's own venv: Spark 4, Delta 4): the type matrix's table
(``tests/support/type_matrix.py``) at the source, snapshotted; then a column added, one widened
(INT -> BIGINT), rows changed; caught up; merged six times, into ``OUT/default`` (the defaults:
the reader-safe protocol, the widened column rewritten), ``OUT/type_widening`` and
``OUT/deletion_vectors`` (each chosen with ``table_features``; deletion vectors written whatever
the table's size), and ``OUT/soft_delete``, ``OUT/history``, ``OUT/changelog`` (the other target
modes, with their metadata columns; the rows Spark 4 reads of each saved beside it as JSON).

``read OUT`` (run by a compat venv of a Spark 3 line, e.g. Spark 3.5 with Delta 3.3): the default
table read by that Spark equals ``SELECT *`` through vtgate, value for value; each chosen
feature's table is read or refused as docs/reading-the-tables.md says (``EXPECTED``); each other
mode's table reads as Spark 4 read it, row for row and value for value (``MODES``). Exits
non-zero otherwise, printing what it saw.

Needs the local Vitess cluster (``dev/local_vitess.sh``).
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ (the package: installed)

from tests.support import merge_workload as wl
from tests.support.delta_check import spark_session
from tests.support.local import start_cluster
from tests.support.type_matrix import COLUMNS, ROWS

TABLE = "compat_spark4_types"
# What a Spark 3.5 / Delta 3.3 reader does with each table: None = reads it equal to SELECT *;
# a pattern = refuses it with an error matching it (quoted in docs/reading-the-tables.md).
EXPECTED: dict[str, str | None] = {
    "default": None,
    "type_widening": (
        r"\[DELTA_UNSUPPORTED_TYPE_CHANGE_IN_PREVIEW\] This table can't be read by this version of "
        r"Delta because an unsupported type change was applied\. Field i32 was changed from INT to BIGINT"
    ),
    "deletion_vectors": None,  # Delta 3 reads deletion vectors (since Delta 2.3)
}
# The target modes besides the mirror: their tables are not SELECT * (tombstones, versions, a
# log), so the oracle is what Spark 4 read of them, itself checked by make test's mode oracles.
MODES = ("soft_delete", "history", "changelog")


def canonical_rows(spark: object, path: Path) -> list[str]:
    """The table's rows as sorted JSON lines of ``repr``'d values: the same text from any PySpark
    line that gives the same Python values (timestamps in this machine's zone in both)."""
    from tests.support.mode_oracles import delta_dicts

    rows = delta_dicts(path, spark)
    return sorted(json.dumps({k: repr(v) for k, v in sorted(r.items())}) for r in rows)


def deletion_vectors(path: Path) -> int:
    """How many files the table's log gave a deletion vector (so a read of it reads one)."""
    return sum(
        1
        for log in sorted((path / "_delta_log").glob("*.json"))
        for line in log.read_text().splitlines()
        if (json.loads(line).get("add") or {}).get("deletionVector")
    )


def write(out: Path) -> None:
    import dataclasses

    import sqlalchemy

    from airflow_provider_vitess.checkpoints import CheckpointStore
    from airflow_provider_vitess.merge.job import apply
    from airflow_provider_vitess.merge.job.run import merge
    from airflow_provider_vitess.merge.modes import DELETION_VECTORS, TYPE_WIDENING, TargetMode, TargetShape

    hook = wl.hook_for(start_cluster(), "vitess_compat_tables")
    columns = ",\n".join(f"{wl.q(n)} {t}" for n, t in COLUMNS.items())
    wl.execute(
        hook,
        f"DROP TABLE IF EXISTS commerce.{TABLE}",
        f"CREATE TABLE commerce.{TABLE} (id INT NOT NULL PRIMARY KEY,\n{columns}) DEFAULT CHARSET=utf8mb4",
    )
    names = ["id", *COLUMNS]
    with hook.connect_sql() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text(
                f"INSERT INTO commerce.{TABLE} ({', '.join(wl.q(n) for n in names)}) "
                f"VALUES ({', '.join(f':{n}' for n in names)})"
            ),
            [dict(r) for r in ROWS],
        )
    store = CheckpointStore(f"sqlite:///{out}/store.db")
    sync = wl.new_sync(hook, store, out / "stage", f"compat-{uuid.uuid4().hex[:8]}", "commerce", [TABLE])
    sync.capture(snapshot=True)
    wl.execute(
        hook,
        f"UPDATE commerce.{TABLE} SET vc = 'changed', i32 = 7 WHERE id = 1",
        f"DELETE FROM commerce.{TABLE} WHERE id = 4",
        f"ALTER TABLE commerce.{TABLE} ADD COLUMN note VARCHAR(10), MODIFY i32 BIGINT",
        f"INSERT INTO commerce.{TABLE} (id, i32, note) VALUES (5, 5000000000, 'five')",
        f"UPDATE commerce.{TABLE} SET note = 'two', i32 = i32 + 4000000000 WHERE id = 2",
    )
    sync.capture()
    spark = spark_session()
    apply.REWRITE_BELOW_BYTES = 0  # deletion vectors, where chosen, even on a table this small
    shapes = {
        "default": TargetShape(),
        "type_widening": TargetShape(features=(TYPE_WIDENING,)),
        "deletion_vectors": TargetShape(features=(DELETION_VECTORS,)),
        **{mode: TargetShape(TargetMode(mode)) for mode in MODES},
    }
    for name, shape in shapes.items():
        plan = sync.plan(out / name)
        plan = dataclasses.replace(
            plan, targets={t: dataclasses.replace(v, shape=shape) for t, v in plan.targets.items()}
        )
        merge(spark, plan)
        if name in MODES:
            rows = canonical_rows(spark, out / name / TABLE)
            (out / f"{name}.rows.json").write_text(json.dumps(rows))
        else:
            wl.assert_equal_to_source(spark, hook, "commerce", TABLE, str(out / name / TABLE), ("id",))
        print(f"written by Spark {spark.version}: {out / name / TABLE}", flush=True)


def read(out: Path) -> int:
    spark = spark_session()
    hook = wl.hook_for(start_cluster(), "vitess_compat_tables")
    failures = []
    if not deletion_vectors(out / "deletion_vectors" / TABLE):
        failures.append("deletion_vectors: the table has no deletion vector to read")
    for name, refusal in EXPECTED.items():
        path = str(out / name / TABLE)
        try:
            n = wl.assert_equal_to_source(spark, hook, "commerce", TABLE, path, ("id",))
        except AssertionError as exc:
            failures.append(f"{name}: Spark {spark.version} reads rows other than SELECT *: {exc}")
            continue
        except Exception as exc:  # the reader's refusal, as Delta raises it
            message = " ".join(str(exc).split())
            print(f"{name}: Spark {spark.version} refuses it: {message[:600]}", flush=True)
            if refusal is None or not re.search(refusal, message, re.S):
                failures.append(f"{name}: refused, expected {'a read' if refusal is None else refusal!r}")
            continue
        print(f"{name}: Spark {spark.version} reads {n} rows, equal to SELECT *", flush=True)
        if refusal is not None:
            failures.append(f"{name}: read, expected a refusal matching {refusal!r}")
    for mode in MODES:
        want = json.loads((out / f"{mode}.rows.json").read_text())
        try:
            got = canonical_rows(spark, out / mode / TABLE)
        except Exception as exc:
            failures.append(f"{mode}: Spark {spark.version} refuses it: {' '.join(str(exc).split())[:600]}")
            continue
        if got != want:
            only_here, only_there = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            failures.append(
                f"{mode}: Spark {spark.version} reads {len(got)} rows, Spark 4 read {len(want)}; only "
                f"here {only_here[:2]}; only in Spark 4's {only_there[:2]}"
            )
            continue
        print(f"{mode}: Spark {spark.version} reads its {len(got)} rows as Spark 4 did", flush=True)
    print("\n".join(failures) or "as expected", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    action, where = sys.argv[1], Path(sys.argv[2])
    if action == "write":
        where.mkdir(parents=True, exist_ok=True)
        write(where)
        sys.exit(0)
    sys.exit(read(where))
