"""Has a sync anything to do? The pure decisions behind ``VitessChangesSensor`` and its trigger.

A sync has work when its tables changed after the committed VGTID. Comparing GTID positions is
not enough to tell: a shard's position moves with every transaction of its MySQL server, on any
table (on a small cluster every keyspace may even share one server). So the sensor streams from
the committed VGTID with the sync's table filter and looks at what comes out:

* a ROW event of one of the tables: rows changed (the answer, with table, shard, commit time);
* a DDL event naming one of the tables (vtgate already drops DDLs of other tables), or a FIELD
  event (a table's columns, sent before its rows and after a schema change): its schema moved;
* a JOURNAL event of the keyspace: it was resharded, the sync must move to the new shards.

Separately, ``lag`` (transactions between the committed and the current position of a shard,
whatever tables they touched) may trigger a run on its own: a sync whose tables are quiet still
has to move its checkpoint before the server purges the binlogs it points into.

"No change" is an answer only for a read that reached the position the wait took at its start
(:func:`unscanned_verdict`). A read cut by the timeout before that (other tables' traffic on the
shard takes longer to scan than the timeout) says ``scan_unfinished``: the run goes on and its
catch-up reads what the sensor could not, instead of every run skipping while the backlog grows.

The decisions do no I/O: the trigger (``triggers.changes``, asyncio) feeds the detector the
events of its stream; the poking sensor reads through :func:`read_changes`, given a way to open a
stream (``VitessHook.open_vstream_raw``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_provider_vitess._proto import binlogdata_pb2
from airflow_provider_vitess.checkpoints.states import WINDOW_COLUMNS
from airflow_provider_vitess.decoding.events import (
    DdlEvent,
    Event,
    FieldEvent,
    JournalEvent,
    RowEvent,
    VgtidEvent,
)
from airflow_provider_vitess.exceptions import InvalidVgtidError
from airflow_provider_vitess.vgtid import CURRENT, Vgtid, transactions_missing
from airflow_provider_vitess.vstream.reader import OpenStream, RetryPolicy, VStreamReader
from airflow_provider_vitess.vstream.request import StreamTarget, table_filter

# Why a sensor says "run now". The first four come from the stream; the others from the start.
ROW, DDL, FIELD, JOURNAL, LAG = "row", "ddl", "field", "journal", "lag"
NO_CHECKPOINT, COPY_UNFINISHED = "no_checkpoint", "copy_unfinished"
# The wait ended before its read reached the position it took at its start: not "no change".
SCAN_UNFINISHED = "scan_unfinished"

_NONE_TEXTS = ("", "none", "null")
_STATEMENT_QUOTE = 200


@dataclass(frozen=True)
class Change:
    """The first sign that a sync has work: what kind, where, and when it was committed."""

    reason: str
    keyspace: str = ""
    shard: str = ""
    table: str = ""
    commit_ts: int = 0  # binlog timestamp, seconds since the epoch; 0 when not known
    rows: int = 0  # row changes in the ROW event (a transaction may send several events)
    statement: str = ""  # the DDL, truncated
    lag: Mapping[str, int] | None = None  # "keyspace/shard" -> transactions behind, for LAG

    def summary(self) -> dict[str, Any]:
        """A small JSON-able dict: the sensor's XCom value and the trigger's event payload."""
        out: dict[str, Any] = {"reason": self.reason}
        for name in ("keyspace", "shard", "table", "statement"):
            value = getattr(self, name)
            if value:
                out[name] = value
        if self.rows:
            out["rows"] = self.rows
        if self.commit_ts:
            out["commit_ts"] = self.commit_ts
            out["commit_time"] = datetime.fromtimestamp(self.commit_ts, tz=timezone.utc).isoformat()
        if self.lag is not None:
            out["lag"] = dict(self.lag)
        return out

    @classmethod
    def from_summary(cls, data: Mapping[str, Any]) -> Change:
        return cls(
            reason=str(data["reason"]),
            keyspace=str(data.get("keyspace", "")),
            shard=str(data.get("shard", "")),
            table=str(data.get("table", "")),
            commit_ts=int(data.get("commit_ts", 0)),
            rows=int(data.get("rows", 0)),
            statement=str(data.get("statement", "")),
            lag=None if data.get("lag") is None else {str(k): int(v) for k, v in data["lag"].items()},
        )


def parse_start_vgtid(text: str | None) -> Vgtid | None:
    """The VGTID a user (or a template) gave; empty, ``None`` or ``null`` mean "no checkpoint".

    A rendered template of a missing XCom is the text ``None``: that is the never-synced case,
    not an error.
    """
    if text is None or text.strip().lower() in _NONE_TEXTS:
        return None
    return Vgtid.from_json(text)


def start_verdict(committed: Vgtid | None, keyspace: str = "") -> Change | None:
    """A reason to run at once, decided from the committed VGTID alone; None means "watch".

    Never snapshotted: the snapshot must run. A position still in its copy phase (table
    last-PKs, or no position yet) means the snapshot is unfinished: it must go on. ``current``
    is a request, not a committed position. A VGTID of another keyspace than the sensor's is
    refused: the stream would never show the sensor's tables.
    """
    if committed is None:
        return Change(NO_CHECKPOINT, keyspace=keyspace)
    if keyspace and keyspace not in committed.keyspaces:
        raise InvalidVgtidError(
            f"the start VGTID is for keyspace(s) {', '.join(committed.keyspaces)}, not {keyspace!r}"
        )
    for sg in committed.shard_gtids:
        if sg.gtid == CURRENT:
            raise InvalidVgtidError(
                f"the start VGTID's entry for keyspace {sg.keyspace!r} shard {sg.shard!r} is 'current', "
                "a request rather than a committed position"
            )
    if committed.is_copying:
        return Change(COPY_UNFINISHED, keyspace=keyspace or committed.keyspaces[0])
    return None


def lag_by_shard(committed: Vgtid, current: Vgtid) -> dict[str, int]:
    """Transactions in ``current`` missing from ``committed``, per ``keyspace/shard`` of ``current``.

    A shard that ``committed`` does not know (a reshard since) counts all its transactions.
    """
    lags: dict[str, int] = {}
    for sg in current.shard_gtids:
        if not sg.shard or sg.gtid in ("", CURRENT):
            continue
        mine = committed.shard(sg.keyspace, sg.shard)
        have = mine.gtid if mine is not None and mine.gtid != CURRENT else ""
        lags[f"{sg.keyspace}/{sg.shard}"] = transactions_missing(have, sg.gtid)
    return lags


def lag_verdict(committed: Vgtid, current: Vgtid, threshold: int | None) -> Change | None:
    """A LAG change when some shard is more than ``threshold`` transactions behind."""
    if threshold is None:
        return None
    lags = lag_by_shard(committed, current)
    if lags and max(lags.values()) > threshold:
        return Change(LAG, keyspace=current.keyspaces[0], lag=lags)
    return None


def unscanned_verdict(keyspace: str, read_to: Vgtid | None, watch_stop: Vgtid | None) -> Change | None:
    """At the end of a wait that found no change: None ("no change") only when the read reached
    ``watch_stop``, the keyspace's position when the wait began; otherwise a SCAN_UNFINISHED
    change, its ``lag`` the transactions per shard left unread (every one when a position is
    unknown). The run then goes on: its catch-up reads the rest, whatever the sensor's timeout."""
    if read_to is not None and watch_stop is not None and read_to.has_reached(watch_stop):
        return None
    lag = lag_by_shard(read_to, watch_stop) if read_to is not None and watch_stop is not None else None
    return Change(SCAN_UNFINISHED, keyspace=keyspace, lag=lag)


def _name_pattern(table: str) -> re.Pattern[str]:
    # A table name as a word of the statement: `t`, t, db.t, `db`.`t`, but not t_old or old_t.
    return re.compile(rf"(?<![\w$]){re.escape(table)}(?![\w$])", re.IGNORECASE)


def _quote(statement: str) -> str:
    statement = " ".join(statement.split())
    if len(statement) > _STATEMENT_QUOTE:
        return statement[: _STATEMENT_QUOTE - 3] + "..."
    return statement


class ChangeDetector:
    """Finds the first change of ``tables`` (bare names) of ``keyspace`` in a stream of events.

    Push events one by one (:meth:`push`) or a response at a time (:meth:`scan`). A ROW event
    of a table is the answer. A FIELD event of a table is kept back for one event: vtgate sends
    it right before the table's first rows, and the summary should then name the row change;
    followed by anything else (a schema change with no rows yet) it is the answer itself. A DDL
    naming a table and a JOURNAL of the keyspace are answers too. The detector also keeps the
    latest VGTID seen: a new stream may resume there without missing a change.
    """

    def __init__(self, keyspace: str, tables: Sequence[str]) -> None:
        if not tables:
            raise ValueError("ChangeDetector needs at least one table")
        self.keyspace = keyspace
        self.tables = tuple(sorted(set(tables)))
        self._patterns = [_name_pattern(t) for t in self.tables]
        self.position: binlogdata_pb2.VGtid | None = None
        self.events_seen = 0
        self._pending: Change | None = None

    def _mine(self, keyspace: str, table: str) -> bool:
        return (not keyspace or not self.keyspace or keyspace == self.keyspace) and table in self.tables

    def _other_keyspace(self, keyspace: str) -> bool:
        return bool(self.keyspace and keyspace and keyspace != self.keyspace)

    def table_in(self, statement: str) -> str:
        """The first of the tables a statement names (as a whole word), or ``""``."""
        return next((t for t, p in zip(self.tables, self._patterns, strict=True) if p.search(statement)), "")

    def classify(self, event: Event) -> Change | None:
        """The change one event stands for, or None (positions, heartbeats, other tables)."""
        if isinstance(event, RowEvent):
            if event.is_internal_table or not self._mine(event.keyspace, event.table):
                return None
            return Change(
                ROW,
                keyspace=event.keyspace,
                shard=event.shard,
                table=event.table,
                commit_ts=event.timestamp,
                rows=len(event.changes),
            )
        if isinstance(event, FieldEvent):
            if event.is_internal_table or not self._mine(event.keyspace, event.table):
                return None
            return Change(
                FIELD,
                keyspace=event.keyspace,
                shard=event.shard,
                table=event.table,
                commit_ts=event.timestamp,
            )
        if isinstance(event, DdlEvent):
            table = self.table_in(event.statement)
            if self._other_keyspace(event.keyspace) or not table:
                return None
            return Change(
                DDL,
                keyspace=event.keyspace,
                shard=event.shard,
                table=table,
                commit_ts=event.timestamp,
                statement=_quote(event.statement),
            )
        if isinstance(event, JournalEvent):
            if self._other_keyspace(event.keyspace):
                return None
            return Change(JOURNAL, keyspace=event.keyspace, shard=event.shard, commit_ts=event.timestamp)
        return None

    def push(self, event: Event) -> Change | None:
        """The answer, once this event settles it; None while there is none (yet)."""
        self.events_seen += 1
        if isinstance(event, VgtidEvent):
            self.position = event.vgtid
        change = self.classify(event)
        if change is not None and change.reason == FIELD:
            if self._pending is None:
                self._pending = change
            return None
        if change is not None and (change.reason == ROW or self._pending is None):
            self._pending = None
            return change
        if isinstance(event, FieldEvent):
            return None  # another table's columns: the pending FIELD may still be followed by rows
        return self.flush()

    def flush(self) -> Change | None:
        """A FIELD change still kept back (call at the end of a response or of a read)."""
        pending, self._pending = self._pending, None
        return pending

    def scan(self, events: Iterable[Event]) -> Change | None:
        """The answer among one response's events, or None."""
        for event in events:
            change = self.push(event)
            if change is not None:
                return change
        return self.flush()

    def resume_from(self, start: Vgtid) -> Vgtid:
        """Where a new stream starts: the latest VGTID seen, else ``start``."""
        return start if self.position is None else Vgtid.from_proto(self.position)


def watched_columns(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """What the changes sensor streams of each table under column control (``capture/columns.py``;
    from the sync's recorded config): its key columns only. The sensor needs to see that a row
    changed, not its values, so an excluded or hashed column does not reach it either."""
    recorded = dict(config.get(WINDOW_COLUMNS) or {})
    keys = dict(config.get("keys") or {})
    out = {}
    for table, record in recorded.items():
        restricted = record.get("include") is not None or record.get("exclude") or record.get("hash")
        key = keys.get(table) or {}
        if restricted and key.get("source_columns"):
            out[table] = list(key["source_columns"])
    return out


@dataclass(frozen=True)
class ChangeScan:
    """What one bounded read found: the first change (or None) and where it read up to."""

    change: Change | None
    read_to: Vgtid
    reached_stop: bool


def read_changes(
    open_stream: OpenStream,
    detector: ChangeDetector,
    start: Vgtid,
    stop: Vgtid,
    *,
    target: StreamTarget,
    seconds: float,
    columns: Mapping[str, Sequence[str]] | None = None,
) -> ChangeScan:
    """Reads the detector's tables from ``start`` until a change, ``stop`` or ``seconds``; a
    later read may go on from ``read_to``. The call's own deadline (the opener's) bounds it:
    past that, the read stops rather than reconnects."""
    reader = VStreamReader(
        open_stream,
        vgtid=start,
        # Tables under column control: their key columns only (capture/columns.watched_columns).
        filter=table_filter(detector.tables, columns),
        # A reshard is a change: without its journal vtgate would switch shards silently.
        flags=target.flags(heartbeat_interval=1, include_reshard_journal_events=True),
        tablet_type=target.tablet_type,
        retry=RetryPolicy(max_attempts=3, max_elapsed=seconds, retry_deadline_exceeded=False),
    )
    deadline = time.monotonic() + seconds
    events = reader.events()
    try:
        for event in events:
            change = detector.push(event)
            if change is not None:
                return ChangeScan(change, detector.resume_from(start), reached_stop=False)
            if isinstance(event, VgtidEvent) and detector.resume_from(start).has_reached(stop):
                read_to = detector.resume_from(start)
                return ChangeScan(detector.flush(), read_to, reached_stop=True)
            if time.monotonic() > deadline:
                break
    finally:
        events.close()
    read_to = detector.resume_from(start)
    return ChangeScan(detector.flush(), read_to, reached_stop=False)
