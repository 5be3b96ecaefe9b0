"""Errors raised by the provider, and the one place that says which of them a retry can fix.

Every error names the object that is wrong (table, keyspace, VGTID, host:port)
so the message alone tells a user what to fix. None of them ever carries a
credential.

:func:`is_permanent` is the classification the Airflow edge uses: a permanent error fails the
task at once (no retries burned: the input or the target must be fixed first), anything else
(vtgate unreachable, a lost database connection, a lock held by another run) stays retryable.
"""

from __future__ import annotations


class VitessProviderError(Exception):
    """Base class of every error this provider raises on purpose."""


class InvalidVgtidError(VitessProviderError, ValueError):
    """A VGTID (JSON text or protobuf) that cannot be understood."""


class VitessConnectionError(VitessProviderError, ConnectionError):
    """vtgate cannot be reached, refused the credentials, or timed out."""


class VStreamError(VitessProviderError):
    """A VStream call failed in a way that retrying from the last VGTID cannot fix."""


class VStreamDeadlineError(VStreamError):
    """A bounded read (a stop-position probe, a sensor's poke) did not finish in its time."""


class ShardsGoneError(VStreamError):
    """The position names shards that no longer exist: a reshard finished and its old shards
    were deleted before the sync read past the reshard's journal. The changes between the
    position and the journal went with them; only a new snapshot can bring the sync back."""


class CopyStalledError(VStreamError):
    """A snapshot's copy sent no row on a shard for longer than its stall timeout while vtgate
    kept the stream alive: a copy query that cannot send its first rows within vttablet's
    copy-phase duration is restarted by Vitess for ever (vstream/copy_stall.py). The message
    names the table, the vttablet flag and the remedy; a retry with the same flags would stall
    the same way."""


class ValueDecodeError(VitessProviderError, ValueError):
    """A row value that does not parse as its declared query.Type."""


class CheckpointError(VitessProviderError):
    """The checkpoint store refused an operation (illegal window transition, unknown sync/window).

    Refusing is the point: the committed position must never move past a window whose merge
    is not durable, so the message names the sync, the window seq and the states involved.
    """


class CutUnavailableError(CheckpointError):
    """No consistent cut across a sync's tables exists for the window or time asked: not
    committed yet, older than the store keeps versions for, or gone from Delta's log."""


class SyncLockedError(CheckpointError):
    """Another holder (Airflow dag/run/try) holds the sync's lock and its heartbeat is fresh."""


class UnknownSyncError(CheckpointError):
    """A task that needs the sync's records (a merge) found none in its checkpoint store: its
    capture task wrote to another store (another machine's SQLite default, another connection)
    or under another sync id. "Nothing to do" would hide that for ever."""


class StagingError(VitessProviderError):
    """Changes that cannot be staged: a value its column's Parquet type cannot hold, a row for a
    table without a schema, or a staging location that cannot be written."""


class ZeroDateError(StagingError):
    """A zero or invalid DATE/DATETIME/TIMESTAMP value (``0000-00-00``, ``2020-00-15``) of a
    table whose zero-date policy is ``error``. A retry stages the same value again: the remedy
    is a change of the policy (or of the source row, in a snapshot)."""


class PartialRowImageError(StagingError):
    """A binlog row image the merge cannot apply exactly: a MINIMAL image (columns other than
    BLOB/TEXT left out, or key columns), or a JSON partial update (PARTIAL_JSON). Names the
    server setting and the remedy; a retry reads the same binlog again."""


class UnnamedColumnsError(StagingError):
    """vtgate sent a table's binlog rows with columns named ``@1``, ``@2``...: they were logged
    before a DDL that changed the table's column types, and vttablet (without schema history)
    cannot name them. Every retry reads the same events; a re-snapshot of the table skips them."""


class BinlogSettingsError(VitessProviderError):
    """A tablet's MySQL logs row images the provider cannot apply exactly
    (``binlog_row_image=MINIMAL``, ``binlog_row_value_options=PARTIAL_JSON``): refused before the
    sync reads, naming shard, setting and remedy."""


class CorruptStagedDataError(StagingError):
    """A staged window whose manifest or part files do not match what was written."""


class StagedWindowLostError(StagingError):
    """A STAGED window's files were lost before its merge: the merge discarded it, and the next
    catch-up reads its changes again. Retryable: a retry of the merge finds it gone and goes on."""


class TableListChangedError(VitessProviderError):
    """A table joined the sync's tables (new, or back after leaving) and is not snapshotted yet:
    a catch-up cannot merge it. The snapshot task copies it first, on its own."""


class UnknownKeyspaceError(VitessProviderError, LookupError):
    """A keyspace vtgate does not serve."""


class UnknownTableError(VitessProviderError, LookupError):
    """A table that does not exist in the keyspace."""


class TablesMovedError(VitessProviderError, LookupError):
    """Tables of the sync that a MoveTables switched to another keyspace: vtgate does not follow
    a MoveTables for a VStream client, so the sync must be moved to the target keyspace (a new
    sync, snapshotted there). The message names the tables, the keyspace and the remedy."""


class KeyChoiceError(VitessProviderError, ValueError):
    """No usable unique key for a table, or key overrides that do not fit its source/target.

    The message names the table and either every key found with why it is ineligible, or the
    override column that does not exist / cannot be fed from the source.
    """


class MergePlanError(VitessProviderError):
    """A merge plan that cannot be applied as written."""


class MergeSchemaError(VitessProviderError):
    """A staged schema the target cannot take (names the table and column); nothing was written."""


class TargetIntegrityError(VitessProviderError):
    """A Delta table that is not what the sync last wrote: missing, rolled back (``RESTORE``) or
    ahead of the checkpoint. Merging into it would leave a partial or wrong table, so the merge
    refuses before writing; the message names the table, the versions and the remedy."""


class TargetModeError(MergePlanError):
    """A target mode, metadata option or ``targets`` entry that is not valid (names it and what
    is allowed), or metadata columns whose names a source column already has."""


class TargetModeChangedError(TargetIntegrityError):
    """A Delta table built in one target mode (or with other metadata columns) that the merge is
    asked to write in another: refused, nothing written; the remedy is a new target location
    and a re-snapshot of the table."""


# The remedy for a target ahead of its checkpoint store. Not a re-snapshot: the store numbers its
# windows below the table's, so the snapshot would be taken for already applied, again and again.
STORE_REMEDY = (
    "Point checkpoint_conn_id at the store that wrote the tables, or copy that store into this "
    "one (python -m airflow_provider_vitess.store_copy --from-conn OLD --to-conn NEW, see "
    "'Moving the checkpoint store' in docs/troubleshooting.md); or rebuild the tables: give the "
    "sync a new target_location (or delete its Delta tables) and run it again"
)


def staged_before(sync_id: str, seq: int) -> str:
    """Why a window the store plans anew already has a manifest in staging: its number was
    staged and committed before, by a run of this sync that the store does not know of."""
    return (
        f"window {sync_id}/{seq} has a manifest: its files were staged before and are not "
        "discarded, but the checkpoint store plans the window anew: the store was restored from "
        "an older backup or replaced (or another store's sync of this id stages here). "
        f"{STORE_REMEDY}"
    )


class UnsupportedDeltaError(VitessProviderError):
    """The Delta Lake of the Spark that merges does not say which version a write committed (a
    Delta build other than the one the provider pins): the merge cannot tell its commit from a
    skip, so it stops rather than report a write as ``already_applied``."""


class MergeInterruptedError(VitessProviderError):
    """The merge task was killed while its merge ran on Spark Connect: its operations were
    interrupted, nothing more was committed, and the window stays STAGED for the next run (the
    Delta transaction ids skip whatever a table committed before the kill)."""


class DeltaFeatureError(UnsupportedDeltaError):
    """The merge needs a Delta Lake feature that the cluster's Delta release lacks (type widening
    of an existing column on Delta 3.x): the message names the feature, the column and the Delta
    release that has it; the table is left as it was."""


class SparkSubmitSetupError(VitessProviderError):
    """The worker's spark-submit cannot start (a ``SPARK_HOME`` without Spark, a driver Python
    that is not on the worker): it would exit with code 127 on every retry. The message names
    the setting and the remedy (see ``merge/submit_env.py``)."""


class KeyChangedError(KeyChoiceError):
    """A table's key is not the one its Delta table was built with (a new override, a new
    primary key at the source): the table must be re-snapshotted with the new key."""


class FreshnessBreachError(VitessProviderError):
    """The sync's data is older than its ``freshness_sla``. No longer raised by the provider: a
    merge past its objective succeeds (its asset events must reach the consumers), warns and
    returns ``breached: true``. Kept importable for code that catches or raises it (a check task
    of the user's); not retried if raised (a retry changes nothing)."""


class ColumnChoiceError(VitessProviderError, ValueError):
    """``include_columns``, ``exclude_columns`` or ``hash_columns`` that cannot apply: both
    include and exclude for one table, an unknown column, a key column left out or hashed, or
    no salt for the hashes. The message names the table, the column and the remedy."""


class ColumnsChangedError(ColumnChoiceError):
    """A table's column choice is not the one its Delta table was built with: the table must be
    re-snapshotted with the new choice (or the old choice restored)."""


class KeyConflictError(VitessProviderError):
    """One key held by two shards at once: the table's key is unique per shard only (it does not
    include the primary vindex column). Merging would keep one of the two rows, so the merge
    refuses; the message names table, key value, shards and the remedy (a key that includes the
    vindex column, then a re-snapshot)."""


class SingleHostSettingsError(VitessProviderError):
    """A task runs under an executor that may run a sync's tasks on several hosts (Celery,
    Kubernetes, ...) with a setting that holds on one host only: the default SQLite checkpoint
    store, or a staging or target location on the worker's disk. The message names each setting
    and its remedy (a shared store and object storage); nothing was read or written."""


# Errors no retry can fix: the task fails at once with the message (and its remedy).
PERMANENT_ERRORS: tuple[type[VitessProviderError], ...] = (
    InvalidVgtidError,
    ValueDecodeError,
    CorruptStagedDataError,
    ZeroDateError,
    UnknownKeyspaceError,
    UnknownTableError,
    TablesMovedError,
    KeyChoiceError,
    ColumnChoiceError,
    MergePlanError,
    MergeSchemaError,
    TargetIntegrityError,
    ShardsGoneError,
    CopyStalledError,
    UnsupportedDeltaError,
    TableListChangedError,
    UnknownSyncError,
    KeyConflictError,
    PartialRowImageError,
    BinlogSettingsError,
    FreshnessBreachError,
    SparkSubmitSetupError,
    SingleHostSettingsError,
)


def is_permanent(exc: BaseException) -> bool:
    """True if retrying the task cannot help (see :data:`PERMANENT_ERRORS`)."""
    return isinstance(exc, PERMANENT_ERRORS)


def permanent_by_name(type_name: str) -> bool:
    """:func:`is_permanent` for an error known only by its class name (reported by the Spark
    job across the process boundary)."""
    pending: list[type] = list(PERMANENT_ERRORS)
    while pending:
        cls = pending.pop()
        if cls.__name__ == type_name:
            return True
        pending.extend(cls.__subclasses__())
    return False


class SyncSettingsError(VitessProviderError, ValueError):
    """A sync's description (``capture/sync.VitessSync``) is refused: the message names the
    setting and the remedy."""
