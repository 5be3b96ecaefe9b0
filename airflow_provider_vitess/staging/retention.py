"""Which staged windows may go (those no later merge can read any more), and deleting one.

A merge reads its own window and, as context, earlier windows (``merge/job/lookback.py``: at most
``MAX_WINDOWS_BACK`` of them). Windows commit in order, so once window ``n`` is COMMITTED every
window up to ``n`` is merged, and the merges still to come (``n + 1`` onwards) look back no
further than ``n + 1 - MAX_WINDOWS_BACK``. Anything older is dead weight: :func:`prune_committed`
deletes it. The merge task calls it once, after COMMITTED (:func:`prune_after_commit` takes the
committed window's manifest path, which the checkpoint store records).

``keep`` may be raised (an audit trail of staged windows) but never lowered below the look-back:
a merge that finds an earlier window gone merges without it, which can drop a row moved between
shards across that window's stop (``merge/job/window_rows.py``).

Two kinds of windows go earlier, as soon as a later window is COMMITTED (``gone_early``, from
the checkpoint store): a snapshot (a copy of whole tables, by far the largest window; the
look-back ends at a copy anyway), and a discarded (FAILED) window, whose changes a later window
read again and which no merge reads (``merge/job/lookback.py`` skips it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from typing import Any

from airflow_provider_vitess.exceptions import StagingError
from airflow_provider_vitess.staging.files import MANIFEST_NAME, check_name, open_location, window_dir

log = logging.getLogger(__name__)

# How many windows back a merge's look-back may read (``merge/job/lookback.py``): bounds it when
# windows are tiny (each one costs a manifest and some footers), and so what retention keeps.
MAX_WINDOWS_BACK = 20

_WINDOW_DIR = re.compile(r"window=(\d{10})$")
_MANIFEST_PATH = re.compile(
    rf"^(?P<root>.*)/(?P<sync>[^/]+)/window=(?P<seq>\d{{10}})/{re.escape(MANIFEST_NAME)}$"
)


def prunable(
    committed_seq: int, staged: list[int], keep: int = MAX_WINDOWS_BACK, gone_early: Collection[int] = ()
) -> list[int]:
    """The staged window seqs no merge after ``committed_seq`` can read: the newest ``keep``
    committed windows stay, except the ``gone_early`` ones (snapshots, discarded windows) before
    ``committed_seq``; every window not committed yet stays."""
    if keep < MAX_WINDOWS_BACK:
        raise StagingError(
            f"keep={keep} staged windows is fewer than a merge may read back ({MAX_WINDOWS_BACK}); "
            "later merges would lose the context of rows moved between shards"
        )
    early = set(gone_early)
    return sorted(
        seq for seq in staged if seq <= committed_seq - keep or (seq < committed_seq and seq in early)
    )


def prune_committed(
    location: str,
    sync_id: str,
    committed_seq: int,
    *,
    keep: int = MAX_WINDOWS_BACK,
    gone_early: Collection[int] = (),
    storage_options: Mapping[str, Any] | None = None,
) -> list[int]:
    """Deletes the staged windows of ``sync_id`` that :func:`prunable` lets go; returns their seqs.

    Call it after window ``committed_seq`` is COMMITTED (never before: an uncommitted window is
    the only copy of its changes until its merge is durable). Idempotent: a rerun finds less.
    """
    fs, root = open_location(location, storage_options)
    sync_dir = f"{root.rstrip('/')}/{check_name('sync id', sync_id)}"
    try:
        names = fs.ls(sync_dir, detail=False)
    except FileNotFoundError:
        return []
    staged = [int(m.group(1)) for n in names if (m := _WINDOW_DIR.search(n.rstrip("/")))]
    gone = prunable(committed_seq, staged, keep, gone_early)
    for seq in gone:
        delete_window(location, sync_id, seq, storage_options=storage_options)
    if gone:
        log.info(
            "sync %r: deleted %d staged window(s) no merge can read any more (%s; kept the last %d "
            "committed but snapshots and discarded windows)",
            sync_id,
            len(gone),
            ", ".join(map(str, gone)),
            keep,
        )
    return gone


def delete_window(
    location: str, sync_id: str, window_seq: int, *, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Deletes one window's staged files, manifest first: a reader never finds a manifest whose
    parts are going (what is left without it is an unfinished window's debris)."""
    fs, root = open_location(location, storage_options)
    wdir = window_dir(root, sync_id, window_seq)
    if fs.exists(f"{wdir}/{MANIFEST_NAME}"):
        fs.rm(f"{wdir}/{MANIFEST_NAME}")
    if fs.exists(wdir):
        fs.rm(wdir, recursive=True)


def staging_location(manifest_path: str) -> str:
    """The staging location of a window's manifest path (``{location}/{sync_id}/window=.../``)."""
    found = _MANIFEST_PATH.match(manifest_path)
    if found is None:
        raise StagingError(f"{manifest_path!r} is not a staged window's manifest path")
    return found["root"]


def prune_after_commit(
    manifest_path: str,
    *,
    keep: int = MAX_WINDOWS_BACK,
    gone_early: Collection[int] = (),
    storage_options: Mapping[str, Any] | None = None,
) -> list[int]:
    """:func:`prune_committed` for the window whose manifest is ``manifest_path`` (a path or URL
    of the staging layout, ``{location}/{sync_id}/window={seq}/_manifest.json``), just COMMITTED."""
    found = _MANIFEST_PATH.match(manifest_path)
    if found is None:
        raise StagingError(f"{manifest_path!r} is not a staged window's manifest path")
    return prune_committed(
        staging_location(manifest_path),
        found["sync"],
        int(found["seq"]),
        keep=keep,
        gone_early=gone_early,
        storage_options=storage_options,
    )
