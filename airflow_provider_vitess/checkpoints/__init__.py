"""The metadata/checkpoint store: window states, staged parts, progress, committed VGTID, lock."""

from __future__ import annotations

from airflow_provider_vitess.checkpoints.database import default_url
from airflow_provider_vitess.checkpoints.locking import DEFAULT_STALE_AFTER, SyncLock
from airflow_provider_vitess.checkpoints.schema import head_revision
from airflow_provider_vitess.checkpoints.states import (
    WINDOW_COLUMNS,
    WINDOW_KEYS,
    LockInfo,
    Part,
    Phase,
    TableProgress,
    TargetVersion,
    Window,
    WindowKind,
    WindowState,
    check_transition,
)
from airflow_provider_vitess.checkpoints.store import CheckpointStore

__all__ = [
    "DEFAULT_STALE_AFTER",
    "WINDOW_COLUMNS",
    "WINDOW_KEYS",
    "CheckpointStore",
    "LockInfo",
    "Part",
    "Phase",
    "SyncLock",
    "TableProgress",
    "TargetVersion",
    "Window",
    "WindowKind",
    "WindowState",
    "check_transition",
    "default_url",
    "head_revision",
]
