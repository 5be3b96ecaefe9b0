"""Streaming Parquet staging of one window's changes, in bounded memory.

Per table version (one schema) rows go through three stages: ``add_rows`` (a ROW event's rows,
still serialized: the capture path) or ``add_change`` (one decoded row) appends them to a
:class:`~airflow_provider_vitess.staging.buffer.RowBuffer` (no per-value work: the hot path);
past ``min(row_group_bytes, 4 MiB)`` of serialized rows (exact) or ``min(row_group_bytes,
16 MiB)`` of decoded ones (estimated) the buffer becomes Arrow record batches; when the batches
pass ``row_group_bytes`` (Arrow's exact ``nbytes``) they are written to the table's open part
file as one row group. So memory holds at most one batch of buffered rows and one row group per
table version, and a global bound (``max_buffered_bytes``) flushes the biggest buffers early
when many tables are active.

``checkpoint()`` closes the open part files and returns them (the caller records them with a
VGTID, so a killed process can resume and keep them); ``finish()`` writes the manifest last.
The manifest is written atomically: on filesystems with an atomic rename (local, HDFS) to a
temporary name then renamed; on object stores (S3, GCS, Azure) with a single PUT, which those
stores make visible all at once or not at all.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_vitess._proto import query_pb2
from airflow_provider_vitess.decoding.events import Operation, RawRows, RowChange
from airflow_provider_vitess.exceptions import StagingError, staged_before
from airflow_provider_vitess.staging.buffer import RowBuffer, W
from airflow_provider_vitess.staging.files import (
    MANIFEST_NAME,
    check_name,
    delete_except,
    open_location,
    window_dir,
    write_atomically,
)
from airflow_provider_vitess.staging.hashing import ColumnHasher
from airflow_provider_vitess.staging.manifest import (
    DdlRecord,
    Manifest,
    PartInfo,
    TableManifest,
    TableSchema,
)
from airflow_provider_vitess.staging.part_files import PartFiles
from airflow_provider_vitess.staging.raw_blocks import RawBlock
from airflow_provider_vitess.staging.row_images import absent_columns
from airflow_provider_vitess.staging.zero_dates import ZeroDatePolicies
from airflow_provider_vitess.vgtid import Vgtid

_PY_BATCH_MAX = 16 << 20  # decoded Python rows held before they become an Arrow batch
# Serialized rows held before they become one: their conversion allocates a few times their
# size at once (joined buffer, index arrays, taken columns), so a smaller batch keeps the peak
# low. Measured on a catch-up window: 4 MiB peaks ~80 MiB below 16 MiB, at the same speed.
_RAW_BATCH_MAX = 4 << 20


def utc_now() -> datetime.datetime:
    """This worker's clock, for a manifest's ``created_at`` (for people; merges go by
    ``source_ts_max``, the source's clocks)."""
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass
class _TableState:
    keyspaces: dict[str, None] = field(default_factory=dict)
    schemas: dict[str, TableSchema] = field(default_factory=dict)  # json -> schema, first seen first
    buffers: dict[str, RowBuffer] = field(default_factory=dict)  # schema json -> live buffer


class WindowStager:
    """Stages one window's changes as Parquet parts plus a manifest (see the module docstring).

    ``key_columns`` maps table -> the columns whose before image is staged (the unique key);
    a table not in it gets every column. ``max_buffered_bytes`` (default 4 x
    ``row_group_bytes``) bounds the rows held in memory over all tables. ``zero_dates`` says
    what a zero or invalid date is staged as, per table (default NULL; see :mod:`.zero_dates`).
    """

    def __init__(
        self,
        location: str,
        sync_id: str,
        window_seq: int,
        *,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        row_group_bytes: int = 64 << 20,
        max_buffered_bytes: int | None = None,
        compression: str = "snappy",
        storage_options: Mapping[str, Any] | None = None,
        writer_id: str | None = None,
        zero_dates: ZeroDatePolicies | None = None,
        hashing: ColumnHasher | None = None,
        manifest_name: str = MANIFEST_NAME,
    ) -> None:
        if row_group_bytes <= 0:
            raise StagingError(f"row_group_bytes must be > 0, got {row_group_bytes}")
        self.location = location
        self.sync_id = check_name("sync id", sync_id)
        self.window_seq = window_seq
        self._storage_options = storage_options
        # A shard group's part of a window has a manifest of its own (capture/groups.py).
        self.manifest_name = manifest_name
        self._fs, root = open_location(location, storage_options)
        self._dir = window_dir(root, sync_id, window_seq)
        self._key_columns = {t: tuple(cols) for t, cols in (key_columns or {}).items()}
        self._zero_dates = zero_dates or ZeroDatePolicies()
        self._hashing = hashing if hashing else None  # hash_columns: see .hashing
        self._row_group_bytes = row_group_bytes
        self._py_limit = min(row_group_bytes, _PY_BATCH_MAX)
        self._raw_limit = min(row_group_bytes, _RAW_BATCH_MAX)
        self._max_buffered = max_buffered_bytes or 4 * row_group_bytes
        self._parts = PartFiles(
            self._fs,
            self._dir,
            sync_id=self.sync_id,
            window_seq=window_seq,
            compression=compression,
            writer_id=writer_id,
        )
        self._tables: dict[str, _TableState] = {}
        # table -> keyspace -> shard ("" = every shard) -> buffer. Nested rather than keyed by a
        # (keyspace, shard, table) tuple: building and hashing that tuple per row costs more.
        self._routes: dict[str, dict[str, dict[str, RowBuffer]]] = {}
        self._ddls: list[DdlRecord] = []
        self._buffered = 0
        self._manifest: Manifest | None = None

    # -- feeding -------------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Estimated bytes of rows held in memory (Python rows plus Arrow batches)."""
        return self._buffered

    def set_schema(
        self, keyspace: str, table: str, fields: Sequence[query_pb2.Field], shard: str = ""
    ) -> None:
        """A FIELD event: later rows of ``table`` from ``keyspace`` (and ``shard``) use ``fields``.

        Pass the FIELD event's ``shard``: shards switch schema at different moments during a
        DDL, so each (keyspace, shard) routes to its own table version. Without a shard the
        schema applies to every shard of the keyspace (and replaces their own). The same
        schema again is a no-op; a version no shard uses any more has its part file closed,
        and a new version starts a new part.
        """
        self._check_open()
        check_name("table", table)
        hashing = self._hashing
        # The converters by the source's types (a FLOAT hashes its canonical text), then the fields
        # as staged (a hashed column is a string).
        hashed = hashing.converters(table, fields) if hashing is not None else None
        if hashing is not None:
            fields = hashing.staged_fields(table, fields)
        schema = TableSchema.from_fields(table, fields, self._key_columns.get(table))
        state = self._tables.setdefault(table, _TableState())
        state.keyspaces.setdefault(keyspace, None)
        key = schema.to_json()
        buf = state.buffers.get(key)
        if buf is None:
            state.schemas.setdefault(key, schema)
            buf = state.buffers[key] = RowBuffer(table, schema, self._zero_dates.for_table(table), hashed)
        shards = self._routes.setdefault(table, {}).setdefault(keyspace, {})
        if shards.get(shard) is buf and shard:
            return
        if not shard:
            shards.clear()  # keyspace-wide: replaces the shards' own (and those cached by _route)
        shards[shard] = buf
        live = {id(b) for by_shard in self._routes[table].values() for b in by_shard.values()}
        for k, b in list(state.buffers.items()):
            if id(b) not in live:
                self._close_part(b)
                del state.buffers[k]

    def add_change(
        self,
        keyspace: str,
        table: str,
        shard: str,
        op: Operation,
        commit_ts: int,
        seq: int,
        before: tuple[Any, ...] | None,
        after: tuple[Any, ...] | None,
        absent: list[str] | None = None,
    ) -> None:
        """Buffer one row change; ``seq`` orders it in the window (strictly increasing).
        ``absent``: the columns a partial after image left out (:mod:`.row_images`)."""
        try:
            buf = self._routes[table][keyspace][shard]
        except KeyError:
            buf = self._route(keyspace, shard, table)
        if buf.hashed:
            # Decoded values are clear values: only raw rows (add_rows) are hashed.
            raise StagingError(
                f"table {table!r} has hash_columns: its rows are staged from the raw ROW events "
                "(add_rows with RawRows), never from decoded values"
            )
        flat = buf.flat
        if absent:
            buf.absent[len(flat) // W] = absent
        flat += (
            op,
            keyspace,
            shard,
            commit_ts,
            seq,
            buf.null_after if after is None else after,
            buf.null_before if before is None else (before if buf.key_all else buf.key_of(before)),
        )
        if len(flat) >= buf.next_check:
            self._check(buf)

    def add_rows(
        self,
        keyspace: str,
        table: str,
        shard: str,
        commit_ts: int,
        first_seq: int,
        changes: Sequence[RowChange],
    ) -> None:
        """Buffer the row changes of one ROW event; their seqs are ``first_seq``, +1, +2...

        A :class:`~airflow_provider_vitess.decoding.events.RawRows` (what the reader produces)
        stays serialized until its batch is converted, column by column; other sequences are
        added row by row, as ``add_change`` does.
        """
        if not isinstance(changes, RawRows):
            for seq, change in enumerate(changes, first_seq):
                absent = None
                if change.present_columns is not None or change.json_partial_columns:
                    buf = self._routes.get(table, {}).get(keyspace, {}).get(shard) or self._route(
                        keyspace, shard, table
                    )
                    absent = absent_columns(change, buf.schema, table, buf.where(keyspace, shard, seq))
                self.add_change(
                    keyspace,
                    table,
                    shard,
                    change.operation,
                    commit_ts,
                    seq,
                    change.before,
                    change.after,
                    absent,
                )
            return
        if not changes.n_rows:
            return
        try:
            buf = self._routes[table][keyspace][shard]
        except KeyError:
            buf = self._route(keyspace, shard, table)
        if buf.flat:
            self._buffered += buf.to_batch()  # decoded rows first: keep the order
        self._buffered += buf.add_block(RawBlock(changes, keyspace, shard, commit_ts, first_seq))
        self._check(buf)

    def add_ddl(self, keyspace: str, shard: str, statement: str, commit_ts: int) -> None:
        self._check_open()
        self._ddls.append(DdlRecord(keyspace, shard, statement, commit_ts))

    def _route(self, keyspace: str, shard: str, table: str) -> RowBuffer:
        shards = self._routes.get(table, {}).get(keyspace, {})
        buf = shards.get("")
        if buf is not None:
            shards[shard] = buf  # cache the keyspace-wide route under the shard
            return buf
        self._check_open()
        raise StagingError(
            f"row of table {table!r} (keyspace {keyspace!r}, shard {shard!r}) arrived before its "
            "schema: call set_schema with the table's FIELD event first"
        )

    # -- memory bound --------------------------------------------------------------------------

    def _check(self, buf: RowBuffer) -> None:
        """Sample the buffer's footprint; convert, write or flush when over a bound."""
        if buf.blocks and buf.flat:  # a decoded row after raw ones: convert both, in order
            self._buffered += buf.to_batch()
        self._buffered += buf.sample(self._py_limit)
        if buf.py_bytes >= self._py_limit or buf.raw_bytes >= self._raw_limit:
            self._buffered += buf.to_batch()
            if buf.arrow_bytes >= self._row_group_bytes:
                self._write_row_group(buf)
        while self._buffered > self._max_buffered:
            biggest = max(
                (b for s in self._tables.values() for b in s.buffers.values()), key=lambda b: b.buffered
            )
            if not biggest.buffered:
                return
            self._buffered += biggest.to_batch()
            self._write_row_group(biggest)

    # -- part files ----------------------------------------------------------------------------

    def _write_row_group(self, buf: RowBuffer) -> None:
        size = buf.arrow_bytes
        table = buf.take_batches()
        if table is None:
            return
        self._buffered -= size
        self._parts.write(buf, table)

    def _close_part(self, buf: RowBuffer) -> None:
        """Flush what is buffered and close the part file (the next row opens a new one)."""
        self._buffered += buf.to_batch()
        self._write_row_group(buf)
        self._parts.close(buf)

    # -- checkpoint, finish, abort -------------------------------------------------------------

    def checkpoint(self) -> list[PartInfo]:
        """Close every open part; return the parts closed since the last checkpoint."""
        self._check_open()
        for state in self._tables.values():
            for buf in state.buffers.values():
                self._close_part(buf)
        return self._parts.take_closed()

    def finish(
        self,
        start_vgtid: Vgtid,
        stop_vgtid: Vgtid | None,
        end_vgtid: Vgtid,
        *,
        parts: Sequence[PartInfo] = (),
        ddls: Sequence[DdlRecord] = (),
        stats: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Close all parts and write the manifest, last and atomically.

        The manifest lists ``parts`` (committed before a resume, from the caller's checkpoint
        store) and every part this stager closed; a part given in both is listed once.
        ``ddls`` are DDLs recorded before a resume, listed before this stager's own.
        """
        self.checkpoint()
        listed: dict[str, PartInfo] = {}
        for part in (*parts, *self._parts.all_parts):
            seen = listed.setdefault(part.path, part)
            if seen.sha256 != part.sha256:
                raise StagingError(
                    f"window {self.sync_id}/{self.window_seq}: part {part.path} is listed twice with "
                    f"different checksums ({seen.sha256} and {part.sha256})"
                )
        manifest = Manifest(
            sync_id=self.sync_id,
            window_seq=self.window_seq,
            start_vgtid=start_vgtid,
            stop_vgtid=stop_vgtid,
            end_vgtid=end_vgtid,
            tables=self._table_manifests(list(listed.values())),
            ddls=(*ddls, *self._ddls),
            stats=dict(stats or {}),
            created_at=utc_now().isoformat(),
            location=self.location,
            storage_options=self._storage_options,
        )
        try:
            text = manifest.to_json()
        except (TypeError, ValueError) as exc:
            raise StagingError(f"window {self.sync_id}/{self.window_seq}: stats are not JSON: {exc}") from exc
        self._write_manifest(text.encode())
        self._manifest = manifest
        self._routes.clear()  # add_change now fails: a staged window is immutable
        self._parts.listed()
        return manifest

    def _table_manifests(self, parts: Sequence[PartInfo]) -> dict[str, TableManifest]:
        by_table: dict[str, list[PartInfo]] = {}
        for p in parts:
            by_table.setdefault(p.table, []).append(p)
        for name in self._tables:
            by_table.setdefault(name, [])
        out = {}
        for name in sorted(by_table):
            tparts = sorted(by_table[name], key=lambda p: p.path)
            state = self._tables.get(name, _TableState())
            schemas: dict[str, TableSchema] = {}
            for p in tparts:
                if p.schema_json not in schemas:
                    schemas[p.schema_json] = TableSchema.from_json(p.schema_json)
            for key, schema in state.schemas.items():
                schemas.setdefault(key, schema)
            keyspaces = dict.fromkeys(ks for p in tparts for ks in p.keyspaces)
            keyspaces.update(state.keyspaces)
            ops: Counter[str] = Counter()
            for p in tparts:
                ops.update(p.op_counts)
            latest = list(schemas.values())[-1]
            out[name] = TableManifest(
                table=name,
                keyspaces=tuple(keyspaces),
                key_columns=latest.key_columns,
                schemas=tuple(schemas.values()),
                parts=tuple(tparts),
                op_counts=dict(sorted(ops.items())),
            )
        return out

    def _write_manifest(self, data: bytes) -> None:
        final = f"{self._dir}/{self.manifest_name}"
        if self._fs.exists(final):
            raise StagingError(
                f"window {self.sync_id}/{self.window_seq} already has a manifest ({final}): a staged "
                "window is immutable; merge it instead of staging it again"
            )
        write_atomically(self._fs, final, data)

    def abort(self, *, keep_checkpointed: bool = False) -> None:
        """Close and delete this stager's files that no manifest lists.

        With ``keep_checkpointed`` the parts already returned by :meth:`checkpoint` stay (the
        caller recorded them to resume); otherwise they go too. No-op after :meth:`finish`.
        """
        if self._manifest is not None:
            return
        self._parts.delete(keep_checkpointed=keep_checkpointed)
        self._tables.clear()
        self._routes.clear()
        self._buffered = 0

    @staticmethod
    def discard_uncommitted(
        location: str,
        sync_id: str,
        window_seq: int,
        keep: Iterable[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """On resume: delete the window's files not in ``keep`` (paths relative to the window
        directory, as in :attr:`PartInfo.path`). Returns the deleted relative paths.

        Refuses on a window that has a manifest: its files are immutable.
        """
        fs, root = open_location(location, storage_options)
        wdir = window_dir(root, sync_id, window_seq)
        if fs.exists(f"{wdir}/{MANIFEST_NAME}"):
            raise StagingError(staged_before(sync_id, window_seq))
        return delete_except(fs, wdir, keep)

    def _check_open(self) -> None:
        if self._manifest is not None:
            raise StagingError(
                f"window {self.sync_id}/{self.window_seq} is finished: its files are immutable"
            )
