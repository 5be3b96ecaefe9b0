"""Which Delta Lake features the cluster's Delta release has, for the schema changes the merge
makes. Delta 3.x (the last line for Spark 3.5) lacks the type widening that the merge uses to
widen a column in place (INT -> BIGINT, DECIMAL(10,2) -> DECIMAL(12,2); Delta >= 4.0): asked for
one there, the job stops before it changes the table, naming the column and the Delta release
needed, rather than fail half-way or rewrite the column's values.

Delta's release follows Spark's major (a Delta 3 jar runs only on Spark 3.5, Delta 4 only on
Spark 4: versions.SPARK_LINES), so the session's Spark version tells the Delta line, on a classic
session and on Spark Connect alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from airflow_provider_vitess.exceptions import DeltaFeatureError
from airflow_provider_vitess.versions import TYPE_WIDENING_DELTA_MAJOR


def delta_major(spark: SparkSession) -> int:
    """The major release of the session's Delta Lake (3 on Spark 3.x, else 4)."""
    return 3 if int(spark.version.split(".")[0]) < 4 else 4


def require_type_widening(
    spark: SparkSession, table: str, widen: Sequence[tuple[str, T.DataType, T.DataType]]
) -> None:
    """Refuse widening ``widen``'s (column, from, to) in place where Delta lacks type widening."""
    if not widen or delta_major(spark) >= TYPE_WIDENING_DELTA_MAJOR:
        return
    columns = ", ".join(f"{n} {a.simpleString()} -> {b.simpleString()}" for n, a, b in widen)
    raise DeltaFeatureError(
        f"table {table}: the source widened column(s) {columns}; widening a Delta column in place "
        f"needs Delta Lake type widening (Delta {TYPE_WIDENING_DELTA_MAJOR}.0 or later, on Spark 4), "
        f"and this cluster runs Spark {spark.version} with Delta {delta_major(spark)}.x. The table "
        "is unchanged and the window is not merged. Remedy: run the merge on Spark 4 with Delta 4 "
        "(the Spark connection's extra spark_version), or re-snapshot the table (trigger the DAG "
        f'with {{"resnapshot_tables": ["{table}"]}}), which writes it with the new type'
    )
