"""The binlog row image settings of the tablets a sync streams from, checked before it reads.

An UPDATE's binlog after image is whole with ``binlog_row_image=FULL``; with ``NOBLOB`` it
leaves out the BLOB/TEXT columns the statement did not set, and vtgate says which
(:mod:`airflow_provider_vitess.staging.row_images`): the merge keeps their earlier value, exact.
With ``MINIMAL`` it leaves out every column not set, and with MySQL's
``binlog_row_value_options=PARTIAL_JSON`` a JSON column holds an edit of the document: neither
can be applied exactly, so a sync of such a keyspace is refused at its first task, naming shard,
setting and remedy, rather than failing mid-window (or, before, writing NULLs).

A session aimed at one shard (``USE `keyspace:shard@type```) reads the tablet's global
variables, one round trip per shard. A session may still set its own value; the stager refuses
the rows that that leaves out of reach.
"""

from __future__ import annotations

import logging

import sqlalchemy

from airflow_provider_vitess.capture.source import quote
from airflow_provider_vitess.exceptions import BinlogSettingsError
from airflow_provider_vitess.hooks.protocol import VitessClient
from airflow_provider_vitess.staging.row_images import REMEDY
from airflow_provider_vitess.vstream.moves import shards_of

log = logging.getLogger(__name__)

APPLIED_EXACTLY = ("FULL", "NOBLOB")
_UNKNOWN_VARIABLE = 1193  # MariaDB has no binlog_row_value_options
_NO_TABLET = "no healthy tablet available"  # vtgate's words for a tablet type it cannot reach


def row_image_settings(hook: VitessClient, keyspace: str, tablet_type: str) -> dict[str, tuple[str, str]]:
    """Per shard: (binlog_row_image, binlog_row_value_options) of the tablet type streamed from
    (its primary's when vtgate serves queries from no tablet of that type: the stream then
    fails by itself, naming the type)."""
    out = {}
    with hook.connect_sql() as conn:
        # Autocommit: vtgate refuses to aim a session inside a transaction at a replica or rdonly
        # tablet, and a session without autocommit is always inside one.
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            for shard in shards_of(hook, keyspace):
                image = None
                for kind in dict.fromkeys((tablet_type.lower(), "primary")):
                    conn.exec_driver_sql(f"USE {quote(hook, f'{keyspace}:{shard}@{kind}')}")
                    try:
                        image = str(conn.exec_driver_sql("SELECT @@global.binlog_row_image").scalar_one())
                        break
                    except sqlalchemy.exc.DBAPIError as exc:
                        if _NO_TABLET not in str(exc) or kind == "primary":
                            raise
                        log.info(
                            "%s/%s: no %s tablet serves queries; reading the primary's", keyspace, shard, kind
                        )
                        conn.rollback()
                assert image is not None  # the primary answered, or its error was raised
                try:
                    options = conn.exec_driver_sql("SELECT @@global.binlog_row_value_options").scalar_one()
                except sqlalchemy.exc.DBAPIError as exc:
                    if exc.orig is None or exc.orig.args[:1] != (_UNKNOWN_VARIABLE,):
                        raise
                    options = ""
                conn.rollback()
                out[shard] = (image.upper(), str(options or "").upper())
        finally:
            conn.invalidate()  # the session is aimed at one shard now: never back into the pool
    return out


def refuse_inexact_images(hook: VitessClient, sync_id: str, keyspace: str, tablet_type: str) -> None:
    """Raises :class:`BinlogSettingsError` when a shard's tablet logs MINIMAL images or partial
    JSON updates (module docstring)."""
    settings = row_image_settings(hook, keyspace, tablet_type)
    bad = {
        shard: (image, options)
        for shard, (image, options) in settings.items()
        if image not in APPLIED_EXACTLY or "PARTIAL_JSON" in options
    }
    if not bad:
        log.info("binlog row images of keyspace %s: %s", keyspace, {s: v[0] for s, v in settings.items()})
        return
    found = "; ".join(
        f"{keyspace}/{shard} ({tablet_type.lower()}): binlog_row_image={image}"
        + (f", binlog_row_value_options={options}" if options else "")
        for shard, (image, options) in sorted(bad.items())
    )
    raise BinlogSettingsError(
        f"sync {sync_id!r}: {found}. Such images leave out values the merge cannot complete "
        f"(MINIMAL: every column an UPDATE did not set; PARTIAL_JSON: JSON edits instead of "
        f"documents), so the sync stopped before reading. {REMEDY}"
    )
