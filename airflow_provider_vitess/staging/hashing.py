"""``hash_columns``: a column's values replaced by a salted SHA-256 before anything is staged.

The value hashed is the column's value exactly as vtgate sends it (MySQL's text of it: the
UTF-8 bytes of a utf8mb4 string, ``42`` for an INT, ``2024-01-31`` for a DATE), prefixed by the
salt's UTF-8 bytes: ``sha256(salt + value).hexdigest()``, 64 lower-case hex characters. NULL
stays NULL. FLOAT and DOUBLE are the exception: vttablet prints one value two ways (a FLOAT
``1.1`` in the copy phase is ``1.100000023841858`` in a binlog row event), so the text hashed is
Python's ``repr`` of the number the column stages as when it is not hashed (the server's
rounding: docs/types.md): ``1.1``, ``-123457.0`` (a FLOAT prints six digits), ``1e-07``.
Equal values hash equal, so the column still joins and groups; without the salt a dictionary of
likely values cannot be hashed to match them.

The stager hashes a column in its row buffer (:class:`~.buffer.RowBuffer`), on the raw bytes of
the row events, before any Arrow array of the column exists, on both of its paths (the
columnar one and the per-row decoder, which it runs with this converter for the column). The
staged column is a string (``TEXT`` for a BLOB/TEXT/JSON column, so partial row images keep
their meaning; ``VARCHAR`` otherwise): its clear value is in no staged file, manifest or Delta
table. The salt is held here only, never in a repr, a log line, the manifest or XCom.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.values import converter_for
from airflow_provider_vitess.exceptions import ColumnChoiceError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.row_images import BLOB_TYPES

T = query_pb2.Type
HEX_DIGEST_CHARS = 64
_UTF8MB4 = 255  # utf8mb4_0900_ai_ci: any utf8mb4 collation stages as a string


def hasher(salt: str) -> Callable[[bytes], str]:
    """The converter of a hashed column: a value's bytes -> ``sha256(salt + value)`` in hex."""
    salted = hashlib.sha256(salt.encode("utf-8"))

    def digest(value: bytes) -> str:
        h = salted.copy()
        h.update(value)
        return h.hexdigest()

    return digest


def _of_number(digest: Callable[[bytes], str], field: query_pb2.Field) -> Callable[[bytes], str]:
    """A FLOAT/DOUBLE column's converter: the hash of :func:`repr` of the number the column stages
    as when it is not hashed (module docstring)."""
    number = converter_for(field)
    return lambda value: digest(repr(number(value)).encode("ascii"))


def hashed_field(field: query_pb2.Field) -> query_pb2.Field:
    """The staged field of a hashed column: a string of 64 hex characters, same name and
    nullability; BLOB/TEXT/JSON columns stay TEXT (a NOBLOB image may leave them out)."""
    blob = arrow_types.type_name(field.type) in BLOB_TYPES
    return query_pb2.Field(
        name=field.name,
        type=T.TEXT if blob else T.VARCHAR,
        column_type="text" if blob else f"char({HEX_DIGEST_CHARS})",
        charset=_UTF8MB4,
        column_length=HEX_DIGEST_CHARS * 4,
        flags=field.flags & arrow_types.NOT_NULL_FLAG,
    )


class ColumnHasher:
    """The sync's hashed columns per table and the salt (kept out of ``repr``)."""

    __slots__ = ("_columns", "_convert")

    def __init__(self, salt: str, columns: Mapping[str, Iterable[str]]) -> None:
        if not salt:
            raise ColumnChoiceError(
                "hash_columns need a salt, and the one given is empty: set the password of the "
                "connection named by hash_salt_conn_id to a long random secret"
            )
        self._columns = {t: frozenset(c.lower() for c in cols) for t, cols in columns.items() if cols}
        self._convert = hasher(salt)

    def __repr__(self) -> str:
        return f"ColumnHasher({ {t: sorted(c) for t, c in self._columns.items()} }, salt=***)"

    def __bool__(self) -> bool:
        return bool(self._columns)

    def converters(self, table: str, fields: Iterable[query_pb2.Field]) -> dict[str, Callable[[bytes], str]]:
        """Column name -> the hashing converter, for the hashed ones of ``fields``."""
        wanted = self._columns.get(table, frozenset())
        return {
            f.name: _of_number(self._convert, f) if f.type in (T.FLOAT32, T.FLOAT64) else self._convert
            for f in fields
            if f.name.lower() in wanted
        }

    def staged_fields(self, table: str, fields: Iterable[query_pb2.Field]) -> list[query_pb2.Field]:
        """``fields`` as staged: the hashed ones as :func:`hashed_field`."""
        wanted = self._columns.get(table, frozenset())
        return [hashed_field(f) if f.name.lower() in wanted else f for f in fields]
