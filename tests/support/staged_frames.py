"""The columns of a staged window's rows as the merge job reads them (one table ``id``, ``v``),
for the job tier's local Spark frames: ``SCHEMA`` staged, ``SCHEMA_OUT`` the table's own."""

from __future__ import annotations

from pyspark.sql import types as T

SCHEMA = T.StructType(
    [
        T.StructField("_op", T.StringType()),
        T.StructField("_shard", T.StringType()),
        T.StructField("_commit_ts", T.LongType()),
        T.StructField("_seq", T.LongType()),
        T.StructField("id", T.LongType()),
        T.StructField("v", T.StringType()),
        T.StructField("_before_id", T.LongType()),
    ]
)
SCHEMA_OUT = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
