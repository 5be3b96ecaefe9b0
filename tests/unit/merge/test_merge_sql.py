"""The one MERGE builder (:mod:`.merge_sql`): every target mode's statement, as text.

The expected statements are those the job ran before the builder was shared (captured from the
three hand-built statements it replaced): the same text is the same MERGE, so the same commit.
No Spark session: the builder is pure.
"""

from __future__ import annotations

from pyspark.sql import types as T

from airflow_provider_vitess.merge.job import delta_sql, history, merge_sql
from airflow_provider_vitess.merge.modes import TargetMode, TargetShape

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("na`me", T.StringType()),
        T.StructField("doc", T.StringType()),
        T.StructField("amt", T.DecimalType(12, 2)),
    ]
)
KEYS = ["id", "na`me"]
PATH = "/p/t`1"
TARGET = delta_sql.table(PATH)  # the table as Delta's format names it in SQL (formats.delta)

MIRROR = (
    "MERGE INTO delta.`/p/t``1` AS t USING `VIEW` AS s ON (t.`id` <=> s.`id`) AND (t.`id` = 1) "
    "WHEN MATCHED AND s.`_op` = 'delete' THEN DELETE WHEN MATCHED AND NOT (s.`_op` = 'delete') "
    "THEN UPDATE SET t.`id` = CAST(s.`id` AS bigint), t.`na``me` = CAST(s.`na``me` AS string), "
    "t.`doc` = CASE WHEN s.`_keep_doc` THEN t.`doc` ELSE CAST(s.`doc` AS string) END, t.`amt` = "
    "CAST(s.`amt` AS decimal(12,2)) WHEN NOT MATCHED AND NOT (s.`_op` = 'delete') THEN INSERT "
    "(`id`, `na``me`, `doc`, `amt`) VALUES (CAST(s.`id` AS bigint), CAST(s.`na``me` AS string), "
    "CASE WHEN s.`_keep_doc` THEN CAST(raise_error('table \\'t1\\' column \\'doc\\': an UPDATE\\'s "
    "partial row image (binlog_row_image=NOBLOB) left it out and the Delta table has no row to "
    "keep its value from: it is not the table this sync built. Remedy: re-snapshot the table "
    "(resnapshot_tables)') AS string) ELSE CAST(s.`doc` AS string) END, CAST(s.`amt` AS "
    "decimal(12,2)))"
)
SOFT_DELETE = (
    "MERGE INTO delta.`/p/t``1` AS t USING `VIEW` AS s ON (t.`id` <=> s.`id` AND t.`na``me` <=> "
    "s.`na``me`) AND (t.`id` = 1) WHEN MATCHED AND s.`_op` = 'delete' THEN UPDATE SET "
    "t.`_v_deleted` = s.`_v_deleted`, t.`_v_deleted_at` = s.`_v_deleted_at`, t.`_v_op` = "
    "s.`_v_op`, t.`_v_commit_ts` = s.`_v_commit_ts`, t.`_v_window_seq` = s.`_v_window_seq`, "
    "t.`_v_synced_at` = s.`_v_synced_at` WHEN MATCHED AND NOT (s.`_op` = 'delete') THEN UPDATE SET "
    "t.`id` = CAST(s.`id` AS bigint), t.`na``me` = CAST(s.`na``me` AS string), t.`doc` = CASE WHEN "
    "s.`_keep_doc` THEN t.`doc` ELSE CAST(s.`doc` AS string) END, t.`amt` = CAST(s.`amt` AS "
    "decimal(12,2)), t.`_v_deleted` = s.`_v_deleted`, t.`_v_deleted_at` = s.`_v_deleted_at`, "
    "t.`_v_op` = s.`_v_op`, t.`_v_commit_ts` = s.`_v_commit_ts`, t.`_v_window_seq` = "
    "s.`_v_window_seq`, t.`_v_synced_at` = s.`_v_synced_at` WHEN NOT MATCHED AND NOT (s.`_op` = "
    "'delete') THEN INSERT (`id`, `na``me`, `doc`, `amt`, `_v_deleted`, `_v_deleted_at`, `_v_op`, "
    "`_v_commit_ts`, `_v_window_seq`, `_v_synced_at`) VALUES (CAST(s.`id` AS bigint), "
    "CAST(s.`na``me` AS string), CASE WHEN s.`_keep_doc` THEN CAST(raise_error('table \\'t1\\' "
    "column \\'doc\\': an UPDATE\\'s partial row image (binlog_row_image=NOBLOB) left it out and "
    "the Delta table has no row to keep its value from: it is not the table this sync built. "
    "Remedy: re-snapshot the table (resnapshot_tables)') AS string) ELSE CAST(s.`doc` AS string) "
    "END, CAST(s.`amt` AS decimal(12,2)), s.`_v_deleted`, s.`_v_deleted_at`, s.`_v_op`, "
    "s.`_v_commit_ts`, s.`_v_window_seq`, s.`_v_synced_at`) WHEN NOT MATCHED AND s.`_op` = "
    "'delete' THEN INSERT (`id`, `na``me`, `doc`, `amt`, `_v_deleted`, `_v_deleted_at`, `_v_op`, "
    "`_v_commit_ts`, `_v_window_seq`, `_v_synced_at`) VALUES (CAST(s.`id` AS bigint), "
    "CAST(s.`na``me` AS string), CAST(s.`doc` AS string), CAST(s.`amt` AS decimal(12,2)), "
    "s.`_v_deleted`, s.`_v_deleted_at`, s.`_v_op`, s.`_v_commit_ts`, s.`_v_window_seq`, "
    "s.`_v_synced_at`)"
)
META = (
    "MERGE INTO delta.`/p/t``1` AS t USING `VIEW` AS s ON t.`id` <=> s.`id` AND t.`na``me` <=> "
    "s.`na``me` WHEN MATCHED AND s.`_op` = 'delete' THEN DELETE WHEN MATCHED AND NOT (s.`_op` = "
    "'delete') THEN UPDATE SET t.`id` = CAST(s.`id` AS bigint), t.`na``me` = CAST(s.`na``me` AS "
    "string), t.`doc` = CAST(s.`doc` AS string), t.`amt` = CAST(s.`amt` AS decimal(12,2)), "
    "t.`_v_op` = s.`_v_op`, t.`_v_commit_ts` = s.`_v_commit_ts`, t.`_v_window_seq` = "
    "s.`_v_window_seq`, t.`_v_synced_at` = s.`_v_synced_at` WHEN NOT MATCHED AND NOT (s.`_op` = "
    "'delete') THEN INSERT (`id`, `na``me`, `doc`, `amt`, `_v_op`, `_v_commit_ts`, "
    "`_v_window_seq`, `_v_synced_at`) VALUES (CAST(s.`id` AS bigint), CAST(s.`na``me` AS string), "
    "CAST(s.`doc` AS string), CAST(s.`amt` AS decimal(12,2)), s.`_v_op`, s.`_v_commit_ts`, "
    "s.`_v_window_seq`, s.`_v_synced_at`)"
)
META = (
    "MERGE INTO delta.`/p/t``1` AS t USING `VIEW` AS s ON t.`id` <=> s.`id` AND t.`na``me` <=> "
    "s.`na``me` WHEN MATCHED AND s.`_op` = 'delete' THEN DELETE WHEN MATCHED AND NOT (s.`_op` = "
    "'delete') THEN UPDATE SET t.`id` = CAST(s.`id` AS bigint), t.`na``me` = CAST(s.`na``me` AS "
    "string), t.`doc` = CAST(s.`doc` AS string), t.`amt` = CAST(s.`amt` AS decimal(12,2)), "
    "t.`_v_op` = s.`_v_op`, t.`_v_commit_ts` = s.`_v_commit_ts`, t.`_v_window_seq` = "
    "s.`_v_window_seq`, t.`_v_synced_at` = s.`_v_synced_at` WHEN NOT MATCHED AND NOT (s.`_op` = "
    "'delete') THEN INSERT (`id`, `na``me`, `doc`, `amt`, `_v_op`, `_v_commit_ts`, "
    "`_v_window_seq`, `_v_synced_at`) VALUES (CAST(s.`id` AS bigint), CAST(s.`na``me` AS string), "
    "CAST(s.`doc` AS string), CAST(s.`amt` AS decimal(12,2)), s.`_v_op`, s.`_v_commit_ts`, "
    "s.`_v_window_seq`, s.`_v_synced_at`)"
)
HISTORY = (
    "MERGE INTO delta.`/p/t``1` AS t USING `VIEW` AS s ON (t.`id` <=> s.`id` AND t.`na``me` <=> "
    "s.`na``me`) AND (t.`_v_current` OR (t.`_v_deleted` AND t.`_v_valid_to` = "
    "timestamp_seconds(s.`_heal_ts`))) AND s.`_action` = 'close' AND (t.`id` = 1) WHEN MATCHED "
    "THEN UPDATE SET t.`_v_valid_to` = s.`_v_valid_to`, t.`_v_current` = false, t.`_v_deleted` = "
    "s.`_v_deleted` WHEN NOT MATCHED AND s.`_action` = 'insert' THEN INSERT (`id`, `na``me`, "
    "`doc`, `amt`, `_v_valid_from`, `_v_valid_to`, `_v_current`, `_v_deleted`, `_v_op`, "
    "`_v_commit_ts`, `_v_window_seq`, `_v_synced_at`) VALUES (CAST(s.`id` AS bigint), "
    "CAST(s.`na``me` AS string), CAST(NULL AS string), CAST(s.`amt` AS decimal(12,2)), "
    "s.`_v_valid_from`, s.`_v_valid_to`, s.`_v_current`, s.`_v_deleted`, s.`_v_op`, "
    "s.`_v_commit_ts`, s.`_v_window_seq`, s.`_v_synced_at`)"
)


def test_a_mirror_with_a_kept_column_and_key_ranges() -> None:
    got = merge_sql.keyed(TARGET, "VIEW", ["id"], SCHEMA, (), ["doc"], "t.`id` = 1", "t1")
    assert got == MIRROR


def test_a_mirror_with_metadata_columns_sets_them_and_deletes_the_key() -> None:
    shape = TargetShape(TargetMode.MIRROR, True, "_v_")
    got = merge_sql.keyed(TARGET, "VIEW", KEYS, SCHEMA, shape.columns(), [], None, "t1")
    assert got == META


def test_soft_delete_flags_a_deleted_key_and_inserts_a_tombstone() -> None:
    shape = TargetShape(TargetMode.SOFT_DELETE, True, "_v_")
    got = merge_sql.keyed(TARGET, "VIEW", KEYS, SCHEMA, shape.columns(), ["doc"], "t.`id` = 1", "t1", True)
    assert got == SOFT_DELETE


def test_history_closes_current_versions_and_inserts_new_ones_a_dropped_column_null() -> None:
    shape = TargetShape(TargetMode.HISTORY, True, "_v_")
    columns = ["_action", "_heal_ts", "id", "na`me", "amt", *shape.columns()]
    got = history.merge_statement(TARGET, "VIEW", KEYS, SCHEMA, shape, columns, "t.`id` = 1")
    assert got == HISTORY
