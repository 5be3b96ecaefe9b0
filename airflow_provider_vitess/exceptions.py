"""Errors raised by the provider.

Every error names the object that is wrong (table, keyspace, VGTID, host:port)
so the message alone tells a user what to fix. None of them ever carries a
credential.
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


class ShardsGoneError(VStreamError):
    """The position names shards that no longer exist: a reshard finished and its old shards
    were deleted before the sync read past the reshard's journal. The changes between the
    position and the journal went with them; only a new snapshot can bring the sync back."""


class ValueDecodeError(VitessProviderError, ValueError):
    """A row value that does not parse as its declared query.Type."""


class CheckpointError(VitessProviderError):
    """The checkpoint store refused an operation (illegal window transition, unknown sync/window).

    Refusing is the point: the committed position must never move past a window whose merge
    is not durable, so the message names the sync, the window seq and the states involved.
    """


class SyncLockedError(CheckpointError):
    """Another holder (Airflow dag/run/try) holds the sync's lock and its heartbeat is fresh."""


class StagingError(VitessProviderError):
    """Changes that cannot be staged: a value its column's Parquet type cannot hold, a row for a
    table without a schema, or a staging location that cannot be written."""


class CorruptStagedDataError(StagingError):
    """A staged window whose manifest or part files do not match what was written."""


class UnknownKeyspaceError(VitessProviderError, LookupError):
    """A keyspace vtgate does not serve."""


class UnknownTableError(VitessProviderError, LookupError):
    """A table that does not exist in the keyspace."""


class KeyChoiceError(VitessProviderError, ValueError):
    """No usable unique key for a table, or key overrides that do not fit its source/target.

    The message names the table and either every key found with why it is ineligible, or the
    override column that does not exist / cannot be fed from the source.
    """
