"""The Parquet part files of one staged window: named, opened, written a row group at a time,
closed with their checksums, and deleted again when the window is given up.

One part file is open per table version (one :class:`RowBuffer`) at a time; closing it yields a
:class:`PartInfo` (rows, bytes, SHA-256, schema, op counts), which the capture runner records
with a VGTID so a killed run can keep it. :class:`~.writer.WindowStager` decides *when* rows go
to a file (its memory bounds); this module owns the files themselves.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging import arrow_types
from airflow_provider_vitess.staging.buffer import RowBuffer
from airflow_provider_vitess.staging.files import (
    HashingSink,
    check_name,
    fsync_dirs,
    is_local,
    next_part_number,
)
from airflow_provider_vitess.staging.manifest import PartInfo


@dataclass
class _OpenPart:
    path: str  # relative to the window directory
    sink: HashingSink
    writer: pq.ParquetWriter
    rows: int = 0


class PartFiles:
    """The part files one stager writes under ``window_dir`` (on file system ``fs``)."""

    def __init__(
        self,
        fs: Any,
        window_dir: str,
        *,
        sync_id: str,
        window_seq: int,
        compression: str,
        writer_id: str | None,
    ) -> None:
        self._fs = fs
        self._dir = window_dir
        self._meta = {"sync_id": sync_id, "window_seq": window_seq}
        self._compression = compression
        # In part names: two writers of one window (a stalled holder that woke up after another
        # took the sync over) never write the same file, whatever part number each counts to.
        self._writer_id = f"-{check_name('writer id', writer_id)}" if writer_id else ""
        self._next: dict[str, int] = {}  # table -> next part number (listed once per table)
        self._open: dict[RowBuffer, _OpenPart] = {}
        self._closed: list[PartInfo] = []  # closed since the last checkpoint
        self.all_parts: list[PartInfo] = []  # every part closed
        self._own_files: list[str] = []  # relative paths created and not yet listed by a manifest

    def write(self, buf: RowBuffer, table: pa.Table) -> None:
        """Append ``table`` (the buffer's batches) to ``buf``'s open part as one row group."""
        part = self._open.get(buf) or self._open_part(buf)
        try:
            part.writer.write_table(table, row_group_size=max(1, table.num_rows))
        except OSError as exc:
            raise StagingError(f"cannot write staged part {self._dir}/{part.path}: {exc}") from exc
        part.rows += table.num_rows

    def _open_part(self, buf: RowBuffer) -> _OpenPart:
        number = self._next.get(buf.table)
        if number is None:
            number = next_part_number(self._fs, f"{self._dir}/{buf.table}")
        self._next[buf.table] = number + 1
        path = f"{buf.table}/part-{number:05d}{self._writer_id}.parquet"
        self._own_files.append(path)
        meta = {**self._meta, "table": buf.table, "schema": buf.schema.to_dict()}
        try:
            sink = HashingSink(self._fs.open(f"{self._dir}/{path}", "wb"), durable=is_local(self._fs))
            writer = pq.ParquetWriter(
                sink,
                buf.arrow_schema.with_metadata({b"vitess.staging": json.dumps(meta).encode()}),
                compression=self._compression,
                # Dictionaries and statistics on every column cost 3x the write time; keep
                # them where they pay: repeated values, and the ordering columns.
                use_dictionary=buf.dictionary_columns,
                write_statistics=[arrow_types.COMMIT_TS, arrow_types.SEQ],
            )
        except OSError as exc:
            raise StagingError(f"cannot create staged part {self._dir}/{path}: {exc}") from exc
        part = self._open[buf] = _OpenPart(path, sink, writer)
        return part

    def close(self, buf: RowBuffer) -> None:
        """Close ``buf``'s open part, if any (its rows already written); the next write opens
        a new one."""
        part = self._open.pop(buf, None)
        if part is None:
            return
        try:
            part.writer.close()
            part.sink.close()
        except OSError as exc:
            raise StagingError(f"cannot close staged part {self._dir}/{part.path}: {exc}") from exc
        info = PartInfo(
            table=buf.table,
            path=part.path,
            rows=part.rows,
            bytes=part.sink.size,
            sha256=part.sink.sha.hexdigest(),
            schema_json=buf.schema_json,
            op_counts=dict(sorted(buf.op_counts.items())),
            keyspaces=tuple(buf.keyspaces),
        )
        buf.reset_counts()
        self._closed.append(info)
        self.all_parts.append(info)

    def take_closed(self) -> list[PartInfo]:
        """The parts closed since the last call, their names (and new directories) durable
        before anyone records them."""
        closed, self._closed = self._closed, []
        parents = {self._dir.rsplit("/", 1)[0], self._dir}
        fsync_dirs(self._fs, parents | {f"{self._dir}/{p.table}" for p in closed})
        return closed

    def listed(self) -> None:
        """A manifest now lists the files: none of them is this writer's to delete any more."""
        self._own_files = []

    def delete(self, *, keep_checkpointed: bool) -> None:
        """Close the open parts and delete the files created here; with ``keep_checkpointed``
        the parts already handed out by :meth:`take_closed` stay."""
        keep = {p.path for p in self.all_parts if p not in self._closed} if keep_checkpointed else set()
        for part in self._open.values():
            for closer in (part.writer, part.sink):
                with contextlib.suppress(Exception):  # the file is deleted next anyway
                    closer.close()
        self._open.clear()
        for rel in self._own_files:
            if rel not in keep and self._fs.exists(f"{self._dir}/{rel}"):
                self._fs.rm(f"{self._dir}/{rel}")
        self._own_files = [r for r in self._own_files if r in keep]
