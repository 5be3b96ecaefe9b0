"""A Delta version's checksum file: the table's facts at that version in one small read.

With each commit Delta writes ``_delta_log/<version>.crc``: one JSON object with the version's
file count and bytes, its metadata (table properties among them) and, while there are at most
a hundred and no retention property expires them, the latest transaction version of every app
id (``setTransactions``). Delta derives it from the previous version's checksum and the commit
itself, with no Spark job. What it says is what the version's snapshot says; the snapshot's
own figures (``DESCRIBE DETAIL``) come from rebuilding the file list of the version with Spark
jobs, which over Spark Connect cost as much as a small table's MERGE.

The file is optional (``spark.databricks.delta.writeChecksumFile.enabled``, other writers, a
crash between the commit and the file): every fact here is None when it is not there, and the
caller asks the table instead. So are facts the file leaves out (``setTransactions`` past its
bound, an older writer's fields).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_vitess.merge.job.delta_log import LogReader, log_file
from airflow_provider_vitess.merge.job.steps import TableSize
from airflow_provider_vitess.utils.jsondoc import JsonDocument

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SetTransaction(JsonDocument):
    appId: str
    version: int


@dataclass(frozen=True)
class ChecksumMetadata(JsonDocument):
    configuration: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Checksum(JsonDocument):
    """The fields of a ``.crc`` file the merge reads, by Delta's names (the others are ignored)."""

    document = "Delta checksum file"
    numFiles: int | None = None
    tableSizeBytes: int | None = None
    metadata: ChecksumMetadata | None = None
    setTransactions: tuple[SetTransaction, ...] | None = None

    @property
    def size(self) -> TableSize | None:
        if self.numFiles is None or self.tableSizeBytes is None:
            return None
        return TableSize(self.numFiles, self.tableSizeBytes)

    @property
    def properties(self) -> dict[str, str] | None:
        return None if self.metadata is None else self.metadata.configuration

    def knows_txns(self) -> bool:
        """Whether the file lists every app id's transaction (else it says nothing of them)."""
        return self.setTransactions is not None

    def txn_version(self, app_id: str) -> int | None:
        """``app_id``'s latest transaction version (None: never written); only when
        :meth:`knows_txns`."""
        assert self.setTransactions is not None
        return max((t.version for t in self.setTransactions if t.appId == app_id), default=None)


def checksum_path(path: str, version: int) -> str:
    return log_file(path, version, "crc")


def read_checksum(spark: SparkSession, path: str, version: int, read: LogReader) -> Checksum | None:
    """The checksum file of the table at ``path`` at ``version`` (one small read with ``read``);
    None when it has none, or one that does not parse (Delta reads the table then, and so do we)."""
    crc = checksum_path(path, version)
    text = read(spark, crc)
    if text is None:
        return None
    try:
        return Checksum.from_json(text, source=crc)
    except ValueError as exc:
        log.warning("%s; the table's own state is read instead", exc)
        return None
