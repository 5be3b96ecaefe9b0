"""A staged window's parts checked against its manifest, and a table read back whole.

The manifest lists each part with its size, row count and sha256 (:mod:`.manifest`); these are
the checks built on that list: :func:`missing_part` (metadata only, before a merge is submitted),
:func:`verify` (every byte, streamed, before a capture resumes or a job merges) and
:func:`read_table` (a table's rows, checked on the bytes read).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_vitess.exceptions import CorruptStagedDataError, StagingError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.files import sha256_of, window_dir
from airflow_provider_vitess.staging.manifest import Manifest, PartInfo


def _corrupt(manifest: Manifest, part: PartInfo, problem: str) -> CorruptStagedDataError:
    where = part.path
    if manifest.location:
        where = f"{window_dir(manifest.location, manifest.sync_id, manifest.window_seq)}/{part.path}"
    return CorruptStagedDataError(
        f"staged window {manifest.window_name} table {part.table!r}: part file {where} {problem}"
    )


def _check_bytes(manifest: Manifest, part: PartInfo, size: int, digest: str) -> None:
    if size != part.bytes:
        raise _corrupt(manifest, part, f"has {size} bytes, the manifest says {part.bytes}")
    if digest != part.sha256:
        raise _corrupt(manifest, part, f"has sha256 {digest}, the manifest says {part.sha256}")


def _parts(manifest: Manifest, tables: Iterable[str] | None) -> list[PartInfo]:
    names = list(manifest.tables) if tables is None else list(tables)
    for name in names:
        if name not in manifest.tables:
            raise StagingError(f"staged window {manifest.window_name} has no table {name!r}")
    return [p for name in names for p in manifest.tables[name].parts]


def missing_part(manifest: Manifest) -> str | None:
    """What is lost of the window's parts (missing, or of another size than staged), or None.

    One metadata request a part, no read of its bytes: the merge asks it before submitting a
    window (the job verifies checksums as it reads)."""
    fs, wdir = manifest.window_path()
    for part in _parts(manifest, None):
        try:
            size = fs.size(f"{wdir}/{part.path}")
        except FileNotFoundError:
            size = None
        if size is None:
            return f"its part {part.path} is missing"
        if size != part.bytes:
            return f"its part {part.path} has {size} bytes, {part.bytes} were staged"
    return None


def verify(manifest: Manifest, tables: Iterable[str] | None = None) -> None:
    """Recompute size, sha256 and row count of every part (of ``tables``, default all).

    Raises :class:`CorruptStagedDataError` naming the window, table and file on any mismatch.
    Streams the files, so memory stays small whatever their size.
    """
    fs, wdir = manifest.window_path()
    for part in _parts(manifest, tables):
        path = f"{wdir}/{part.path}"
        try:
            digest, size = sha256_of(fs, path)
        except FileNotFoundError:
            raise _corrupt(manifest, part, "is missing") from None
        _check_bytes(manifest, part, size, digest)
        try:
            with fs.open(path, "rb") as f:
                rows = pq.ParquetFile(f).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise _corrupt(manifest, part, f"is not readable Parquet: {exc}") from None
        if rows != part.rows:
            raise _corrupt(manifest, part, f"has {rows} rows, the manifest says {part.rows}")


def read_table(manifest: Manifest, table: str, *, check: bool = True) -> pa.Table:
    """All staged rows of ``table`` in ``_seq`` order, parts of several schemas unified.

    With ``check`` (default) each part's size and sha256 are verified on the bytes read. Meant
    for consumers that load a table whole (tests, small windows); Spark reads the files itself.
    """
    fs, wdir = manifest.window_path()
    tm = manifest.tables.get(table)
    if tm is None:
        raise StagingError(f"staged window {manifest.window_name} has no table {table!r}")
    pieces = []
    for part in tm.parts:
        try:
            data = fs.cat_file(f"{wdir}/{part.path}")
        except FileNotFoundError:
            raise _corrupt(manifest, part, "is missing") from None
        if check:
            _check_bytes(manifest, part, len(data), hashlib.sha256(data).hexdigest())
        try:
            piece = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            raise _corrupt(manifest, part, f"is not readable Parquet: {exc}") from None
        if piece.num_rows != part.rows:
            raise _corrupt(manifest, part, f"has {piece.num_rows} rows, the manifest says {part.rows}")
        pieces.append(piece.replace_schema_metadata(None))
    if not pieces:
        return tm.schema.arrow_schema(table).empty_table()
    # A later schema may add columns or widen types; older parts read as NULL for new columns.
    out = pa.concat_tables(pieces, promote_options="permissive")
    return out.sort_by(arrow_types.SEQ)
