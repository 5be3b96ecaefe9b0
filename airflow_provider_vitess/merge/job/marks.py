"""Which read of the source a table's commit of a window holds: its mark.

A window's commit carries (app id, window seq) as its transaction version, which makes a rerun
skip it: exactly once. But the seq alone cannot tell two reads that got the same number apart.
A checkpoint store restored from a backup taken before window N was merged plans a new window
N from its older position; if window N's staged files are gone too (a new staging location),
nothing else tells the two apart, and the table, holding the old window N, would take the new
one for applied and lose what it read past the old one. So each window's commit also carries a
mark: the seq and a digest of the positions the window was read between (its manifest's start
and end VGTIDs), in the format's commit metadata (Delta: the commit's ``userMetadata``). A rerun
of the same window has the same mark; another read of the same seq has another
(``.integrity``). A window read again between the same positions holds the same changes, so a
mark that matches is one that may be skipped.
"""

from __future__ import annotations

import hashlib
import json

from airflow_provider_vitess.staging.manifest import Manifest

_SEQ, _READ = "vitess_window", "read"


def read_id(manifest: Manifest) -> str:
    """A digest of the positions the window was read between."""
    text = f"{manifest.start_vgtid.to_json()}|{manifest.end_vgtid.to_json()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def commit_mark(manifest: Manifest) -> str:
    """The mark of the window's commits (compact JSON, shown in the table's history)."""
    return json.dumps({_SEQ: manifest.window_seq, _READ: read_id(manifest)}, separators=(",", ":"))


def parse_mark(text: str | None) -> tuple[int, str] | None:
    """(window seq, read digest) of a commit's metadata; None when it is not a mark (another
    writer's metadata, or a commit of a provider that wrote none)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    seq, read = doc.get(_SEQ), doc.get(_READ)
    if isinstance(seq, int) and not isinstance(seq, bool) and isinstance(read, str):
        return seq, read
    return None
