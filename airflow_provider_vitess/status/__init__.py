"""Sync status for dashboards: JSON documents built from a checkpoint store."""

from __future__ import annotations

# Where the status plugin mounts its app in the API server; the page is at its root.
URL_PREFIX = "/vitess"
STATUS_PAGE_PATH = f"{URL_PREFIX}/"
