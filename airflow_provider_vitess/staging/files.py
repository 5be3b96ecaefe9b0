"""The staging location's files: layout, atomic writes, hashing, clean-up (fsspec I/O only).

Durability: on a local filesystem a window is recorded STAGED only after its bytes and names
are on disk, so a power loss cannot leave a STAGED window with a truncated part or no manifest:
each part file is fsynced when closed, the directories that gained entries are fsynced at each
checkpoint, and the manifest is fsynced under its temporary name, renamed, and its directory
fsynced. Object stores need none of it: a PUT is durable once it returns.

Layout under a staging location (a local path or any fsspec URL)::

    {location}/{sync_id}/window={window_seq:010d}/_manifest.json
    {location}/{sync_id}/window={window_seq:010d}/{table}/part-{n:05d}.parquet
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec

from airflow_provider_vitess.exceptions import StagingError

MANIFEST_NAME = "_manifest.json"
# Filesystems whose rename is atomic; on the others (object stores) a file is one PUT.
_RENAME_ATOMIC = frozenset({"file", "local", "hdfs", "viewfs", "arrow_hdfs"})
# Filesystems of this machine's kernel: written bytes sit in its page cache until fsync.
_LOCAL = frozenset({"file", "local"})
_TMP_PREFIX = "._tmp-"
_CHUNK = 4 << 20


def check_name(what: str, name: str) -> str:
    """A sync id or table name becomes a path component: refuse what would escape it."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise StagingError(f"{what} {name!r} cannot be used as a staging directory name")
    return name


def window_dir(root: str, sync_id: str, window_seq: int) -> str:
    if window_seq < 0:
        raise StagingError(f"window seq must be >= 0, got {window_seq}")
    return f"{root.rstrip('/')}/{check_name('sync id', sync_id)}/window={window_seq:010d}"


def open_location(location: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``(filesystem, root path)`` of a local path or fsspec URL."""
    fs, root = fsspec.core.url_to_fs(location, **dict(storage_options or {}))
    return fs, root


def _protocols(fs: Any) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def is_local(fs: Any) -> bool:
    """True for the local filesystem, where durability needs fsync (see the module docstring)."""
    return bool(_LOCAL.intersection(_protocols(fs)))


def fsync_dirs(fs: Any, directories: Iterable[str]) -> None:
    """Makes the entries of local ``directories`` (new files, renames) durable; no-op elsewhere."""
    if not is_local(fs):
        return
    for directory in sorted(set(directories)):
        try:
            fd = os.open(fs._strip_protocol(directory), os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # nothing was written there
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class HashingSink:
    """File wrapper handed to ParquetWriter: hashes and counts the bytes as they are written,
    so a part's sha256 costs no second read. ``durable``: fsync the file before closing it."""

    def __init__(self, f: Any, *, durable: bool = False) -> None:
        self._f = f
        self._durable = durable
        self.sha = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self._f.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._f.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._durable:
                self._f.flush()
                os.fsync(self._f.fileno())
            self._f.close()


def write_atomically(fs: Any, path: str, data: bytes) -> None:
    """Readers see no file or the whole file: a rename where renames are atomic, else one PUT
    (S3, GCS and Azure make an object visible all at once or not at all). On a local
    filesystem the file and the rename are durable when this returns."""
    directory = path.rsplit("/", 1)[0]
    fs.makedirs(directory, exist_ok=True)
    if not _RENAME_ATOMIC.intersection(_protocols(fs)):
        fs.pipe_file(path, data)
        return
    tmp = f"{directory}/{_TMP_PREFIX}{uuid.uuid4().hex}-{os.path.basename(path)}"
    try:
        with fs.open(tmp, "wb") as f:
            sink = HashingSink(f, durable=is_local(fs))
            sink.write(data)
            sink.close()
        fs.mv(tmp, path)
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    fsync_dirs(fs, [directory])


def next_part_number(fs: Any, table_dir: str) -> int:
    """One more than the highest ``part-NNNNN`` in ``table_dir`` (1 if none): after a resume the
    kept parts are there, and a name is never reused."""
    fs.makedirs(table_dir, exist_ok=True)
    try:
        names = [os.path.basename(p) for p in fs.ls(table_dir, detail=False)]
    except FileNotFoundError:  # object stores have no empty directories
        names = []
    numbers = [int(n[5:10]) for n in names if n.startswith("part-") and n[5:10].isdigit()]
    return max(numbers, default=0) + 1


def delete_except(fs: Any, directory: str, keep: Iterable[str]) -> list[str]:
    """Delete every file under ``directory`` whose relative path is not in ``keep``."""
    if not fs.exists(directory):
        return []
    kept = set(keep)
    prefix = directory.rstrip("/") + "/"
    deleted = []
    for path in sorted(fs.find(directory)):
        rel = path[len(prefix) :] if path.startswith(prefix) else path
        if rel not in kept:
            fs.rm(path)
            deleted.append(rel)
    return deleted


def sha256_of(fs: Any, path: str) -> tuple[str, int]:
    """``(hex digest, size)`` of a file, streamed: memory stays small whatever its size."""
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def group_manifest_name(group: int, writer: str) -> str:
    """A group's part's manifest, named with its writer: a stalled try that wakes up after its
    retry took the group over writes a manifest of its own, which nothing records or reads."""
    return f"_group-{group:03d}-{writer}.json"


def group_writer_id(group: int, token: str) -> str:
    """In the group's part file names: its files are told from the other groups' (a rerun of
    one group deletes only its own unrecorded files) and from a stalled writer's."""
    return f"g{group:03d}-{token[:12]}"
