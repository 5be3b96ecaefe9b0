"""The checkpoint store's tables (SQLAlchemy 2 declarative), portable to SQLite, MariaDB/MySQL
and PostgreSQL.

Every table is prefixed ``vitess_sync_`` so the store can live inside an existing Airflow
metadata database. The schema is created and evolved by the Alembic scripts in
``migrations/versions`` only; these models describe the head revision (a test compares them).

Portability choices:
- VGTIDs, paths and holder texts are ``Text`` (VGTIDs of many shards with table last-PKs are
  long), so they are never part of a key: MySQL cannot index unbounded text.
- Keyed strings stay below MySQL's 3072-byte index limit at 4 bytes per utf8mb4 character.
- Timestamps are stored as naive UTC and returned aware (``UtcDateTime``): PostgreSQL, MySQL
  and SQLite disagree on time zones, and MySQL needs ``fsp=6`` not to drop the microseconds.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

PREFIX = "vitess_sync_"
VERSION_TABLE = f"{PREFIX}alembic_version"
SYNC_ID_LENGTH = 200
NAME_LENGTH = 255
ENUM_LENGTH = 16

# Deterministic constraint names: migrations can refer to them and PostgreSQL, MariaDB and
# SQLite then agree on them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATES = ("PLANNED", "STAGED", "MERGED", "COMMITTED", "FAILED")
KINDS = ("snapshot", "catchup")
PHASES = ("copying", "copied", "streaming")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """Naive UTC in the database, aware UTC in Python; naive input is refused, not guessed."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=False))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the checkpoint store only stores UTC-aware times")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SyncRow(Base):
    """One configured sync: a keyspace and the tables mirrored from it."""

    __tablename__ = f"{PREFIX}sync"

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    keyspace: Mapped[str] = mapped_column(String(NAME_LENGTH))
    tables: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class WindowRow(Base):
    """One window of a sync; ``seq`` counts from 1 and doubles as Delta's txnVersion."""

    __tablename__ = f"{PREFIX}window"
    __table_args__ = (
        CheckConstraint(_in("state", STATES), name="state"),
        CheckConstraint(_in("kind", KINDS), name="kind"),
        # open_window() looks for the unfinished window among thousands of committed ones.
        Index("ix_vitess_sync_window_open", "sync_id", "state"),
    )

    sync_id: Mapped[str] = mapped_column(
        String(SYNC_ID_LENGTH), ForeignKey(SyncRow.sync_id), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    state: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    start_vgtid: Mapped[str] = mapped_column(Text)
    stop_vgtid: Mapped[str | None] = mapped_column(Text)
    end_vgtid: Mapped[str | None] = mapped_column(Text)
    # Latest position at which staged parts were recorded: where a killed window resumes.
    resume_vgtid: Mapped[str | None] = mapped_column(Text)
    manifest_path: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


def _window_fk() -> ForeignKeyConstraint:
    # A constraint object belongs to one table, hence a fresh one per referring table.
    return ForeignKeyConstraint(["sync_id", "seq"], [WindowRow.sync_id, WindowRow.seq])


class WindowPartRow(Base):
    """A staged file of a window; ``part_no`` keys it because paths are unbounded text."""

    __tablename__ = f"{PREFIX}window_part"
    __table_args__ = (_window_fk(),)

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    part_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    path: Mapped[str] = mapped_column(Text)
    table_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    row_count: Mapped[int] = mapped_column(BigInteger)
    byte_count: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    resume_vgtid: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The shard group that staged it (a snapshot copied by groups); None: the window's one reader.
    group_no: Mapped[int | None] = mapped_column(Integer)


class WindowGroupRow(Base):
    """One shard group's part of a window read by several groups at once (``capture/groups.py``):
    the shards it reads, its state (PLANNED until its part's manifest is written, then STAGED),
    where its read ended and its manifest. The window becomes STAGED once every group is."""

    __tablename__ = f"{PREFIX}window_group"
    __table_args__ = (
        _window_fk(),
        CheckConstraint(_in("state", ("PLANNED", "STAGED")), name="state"),
    )

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    shards: Mapped[list[str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    end_vgtid: Mapped[str | None] = mapped_column(Text)
    manifest_path: Mapped[str | None] = mapped_column(Text)
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # A snapshot's group: where its copy resumes (its last checkpoint, with table last-PKs).
    resume_vgtid: Mapped[str | None] = mapped_column(Text)


class GroupProgressRow(Base):
    """One table's copy progress in one shard group of a snapshot copied by groups: the group's
    rows copied and ``count(*)`` of its shards. The window's figures are their sums
    (``checkpoints/progress.py``)."""

    __tablename__ = f"{PREFIX}group_progress"
    __table_args__ = (
        _window_fk(),
        CheckConstraint(_in("phase", PHASES), name="phase"),
    )

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    table_name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    rows_known: Mapped[int | None] = mapped_column(BigInteger)
    rows_copied: Mapped[int] = mapped_column(BigInteger)
    phase: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class TableProgressRow(Base):
    __tablename__ = f"{PREFIX}table_progress"
    __table_args__ = (
        _window_fk(),
        CheckConstraint(_in("phase", PHASES), name="phase"),
    )

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    table_name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    rows_known: Mapped[int | None] = mapped_column(BigInteger)
    rows_copied: Mapped[int] = mapped_column(BigInteger)
    phase: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    key_columns: Mapped[list[str] | None] = mapped_column(JSON)
    key_source: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class CheckpointRow(Base):
    """The committed position: moved only by ``CheckpointStore.commit`` of a MERGED window."""

    __tablename__ = f"{PREFIX}checkpoint"

    sync_id: Mapped[str] = mapped_column(
        String(SYNC_ID_LENGTH), ForeignKey(SyncRow.sync_id), primary_key=True
    )
    committed_vgtid: Mapped[str] = mapped_column(Text)
    committed_seq: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Every source transaction committed before it is in the targets (``checkpoints/freshness``).
    as_of: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # The oldest window a consistent cut can be taken at (``checkpoints/versions``); None: any.
    versions_from: Mapped[int | None] = mapped_column(Integer)
    # The freshness objective (seconds) the merge task was given; None: none (``freshness``).
    freshness_sla: Mapped[float | None] = mapped_column(Float)


class LockRow(Base):
    """At most one holder per sync; no foreign key, a lock may precede ``ensure_sync``."""

    __tablename__ = f"{PREFIX}lock"

    sync_id: Mapped[str] = mapped_column(String(SYNC_ID_LENGTH), primary_key=True)
    holder: Mapped[str] = mapped_column(Text)
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # New for every taking of the lock: the fence every write under the lock is checked against.
    token: Mapped[str | None] = mapped_column(String(32))


class TargetRow(Base):
    """The last window merged into a sync's table, and that commit's version in the table's
    format (None: the table was covered by a snapshot without rows, so no table was made).
    ``table_version`` was ``delta_version`` before revision 0006."""

    __tablename__ = f"{PREFIX}target"

    sync_id: Mapped[str] = mapped_column(
        String(SYNC_ID_LENGTH), ForeignKey(SyncRow.sync_id), primary_key=True
    )
    table_name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    merged_seq: Mapped[int] = mapped_column(Integer)
    table_version: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class WindowVersionRow(Base):
    """The version a committed window produced in one of its sync's tables: the rows a
    consistent cut across tables is read from (``checkpoints/versions.py``). A table a window did
    not change has no row for it: its version is the one of its latest row before.
    ``table_format``, ``snapshot_id`` (Iceberg's commit, which its time travel names) and
    ``catalog`` (the JDBC catalog an Iceberg table is named in) are NULL in the rows written
    before revision 0007: Delta tables."""

    __tablename__ = f"{PREFIX}window_version"

    sync_id: Mapped[str] = mapped_column(
        String(SYNC_ID_LENGTH), ForeignKey(SyncRow.sync_id), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    table_version: Mapped[int] = mapped_column(BigInteger)  # delta_version before revision 0006
    path: Mapped[str] = mapped_column(Text)
    merged_at: Mapped[datetime] = mapped_column(UtcDateTime)
    table_format: Mapped[str | None] = mapped_column(String(16))
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger)
    catalog: Mapped[str | None] = mapped_column(String(128))
