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


class ValueDecodeError(VitessProviderError, ValueError):
    """A row value that does not parse as its declared query.Type."""
