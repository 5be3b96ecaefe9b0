"""Partial row images: which columns an UPDATE's after image leaves out, and which it may not.

With ``binlog_row_image=NOBLOB`` MySQL/MariaDB log an UPDATE's after image without the BLOB and
TEXT columns (JSON and GEOMETRY are blobs to the server) the statement did not set, and vtgate
says which columns the image has (``RowChange.data_columns``). Such a column is not NULL: it is
unchanged. The stager records the columns an image leaves out in the row's ``_absent`` column,
and the merge keeps their earlier value (:mod:`airflow_provider_vitess.merge.job.partial`).

What cannot be applied exactly is refused here, before anything is staged: an image that
leaves out another column or a key column (``binlog_row_image=MINIMAL``), an INSERT that is not
whole, an UPDATE that changes the key and leaves out columns (their values are the old key's
row's, which the merge does not read under the new key), and a JSON partial update (MySQL's
``binlog_row_value_options=PARTIAL_JSON``: the value is an edit of the document, not the
document). The capture also refuses such server settings before it reads
(:mod:`airflow_provider_vitess.capture.row_images`); this is the net for a session that set
them on its own.
"""

from __future__ import annotations

from airflow_provider_vitess.decoding.events import RowChange
from airflow_provider_vitess.exceptions import PartialRowImageError
from airflow_provider_vitess.staging.manifest import TableSchema

# query.Type names of the columns NOBLOB may leave out.
BLOB_TYPES = frozenset({"TEXT", "BLOB", "JSON", "GEOMETRY"})

REMEDY = (
    "The provider applies FULL and NOBLOB row images exactly. Remedy: on the MySQL of every "
    "tablet the sync streams from, SET GLOBAL binlog_row_image = 'FULL' (or 'NOBLOB') and "
    "binlog_row_value_options = '' (MySQL; also in my.cnf, so a restart keeps them), and let "
    "connections that set their own session value reconnect; changes already logged stay as they "
    "were, so then re-snapshot the table (resnapshot_tables)"
)


def absent_columns(change: RowChange, schema: TableSchema, table: str, where: str) -> list[str] | None:
    """The columns ``change``'s after image leaves out (None: a whole image). Raises
    :class:`PartialRowImageError` for an image the merge cannot apply exactly; ``where`` says
    which row it is (for the message; only partial images get here, so it costs little)."""
    names = schema.names
    if change.json_partial_columns:
        cols = [names[i] for i in sorted(change.json_partial_columns) if i < len(names)]
        raise PartialRowImageError(
            f"{where}: column(s) {cols} of table {table!r} hold a JSON partial update (an edit of "
            "the document, not the document): the server logs with "
            f"binlog_row_value_options=PARTIAL_JSON. {REMEDY}"
        )
    present = change.present_columns
    if present is None or change.after is None:
        return None
    missing = [i for i in range(len(names)) if i not in present]
    if not missing:
        return None
    out = [names[i] for i in missing]
    not_blob = [names[i] for i in missing if schema.columns[i].type not in BLOB_TYPES]
    keys = [n for n in out if n in schema.key_columns]
    if change.before is None or not_blob or keys:
        what = "an INSERT" if change.before is None else "an UPDATE"
        why = (
            f"key column(s) {keys}"
            if keys
            else f"column(s) {not_blob or out} that are not BLOB/TEXT"
            if change.before is not None
            else f"column(s) {out}"
        )
        raise PartialRowImageError(
            f"{where}: the binlog row image of {what} of table {table!r} leaves out {why}: the "
            f"server logs with binlog_row_image=MINIMAL, whose images the merge cannot complete. {REMEDY}"
        )
    before = change.before
    index = [names.index(k) for k in schema.key_columns]
    if len(before) == len(names) and any(before[i] != change.after[i] for i in index):
        raise PartialRowImageError(
            f"{where}: an UPDATE of table {table!r} changes the key and its binlog row image "
            f"(binlog_row_image=NOBLOB) leaves out column(s) {out}: their values are those of the old "
            f"key's row, which the merge cannot read under the new key. {REMEDY}"
        )
    return out
