"""Run by Spark 4.1's spark-submit (``iceberg_spark.spark_rows``): each Iceberg table at the given
locations read by Spark through a Hadoop catalog (or the JDBC catalog :data:`CATALOG_ENV` names),
as a user's Spark reads it, its rows written to
a JSON file with :func:`canonical` values. With ``--roll-back`` first (``iceberg_spark.roll_back``):
each table rolled back to its current snapshot's parent, as another program would, with Iceberg's
procedure. With ``--sql <file>`` (a JSON object, location -> a query): each table's rows as its
query reads them (the consistent cut's SQL, as a user runs it), the catalog it names registered as
the merge registers it. Imports only what a bare driver has."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

# The JDBC catalog's document (``IcebergCatalog.document``), its credentials in the product's
# variables beside it.
CATALOG_ENV = "ICEBERG_TEST_CATALOG"


def canonical(value: Any) -> Any:
    """A value as two readers can agree on it in JSON: an instant as naive UTC ISO text, a decimal
    as text, bytes as hex."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


def main(
    out: str, locations: list[str], roll_back: bool = False, queries: dict[str, str] | None = None
) -> None:
    from pyspark.sql import SparkSession

    from airflow_provider_vitess.merge.iceberg_catalog import IcebergCatalog
    from airflow_provider_vitess.merge.job.iceberg_sql import at, register

    given = os.environ.get(CATALOG_ENV)
    catalog = IcebergCatalog.from_document(json.loads(given), os.environ) if given else None
    spark = SparkSession.builder.getOrCreate()
    tables = {}
    for location in locations:
        table = register(spark, at(location, catalog))
        if roll_back:
            [current] = spark.sql(
                f"SELECT snapshot_id FROM {table.metadata('refs')} WHERE name = 'main'"
            ).collect()
            [parent] = spark.sql(
                f"SELECT parent_id FROM {table.metadata('snapshots')} WHERE snapshot_id = {int(current[0])}"
            ).collect()
            name = f"{table.namespace}.{table.name}"
            spark.sql(f"CALL `{table.catalog}`.system.rollback_to_snapshot('{name}', {int(parent[0])})")
        rows = spark.sql(queries[location]) if queries is not None else spark.table(table.sql)
        tables[location] = [{k: canonical(v) for k, v in r.asDict().items()} for r in rows.collect()]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tables, f)
    spark.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    back = args[0] == "--roll-back"
    args = args[1:] if back else args
    asked = None
    if args[0] == "--sql":
        with open(args[1], encoding="utf-8") as f:
            asked = json.load(f)
        args = args[2:]
    main(args[0], args[1:], roll_back=back, queries=asked)
