"""The VGTID: where a VStream is, per keyspace/shard, and how far each table's copy has got.

A VGTID is the only safe checkpoint of a VStream (see docs/design.md), so it must survive storage
exactly: JSON text (XCom, metadata table) and protobuf (the VStream request) both round-trip
losslessly, and malformed input fails loudly with a message naming the entry and the problem.

Positions are Vitess "flavored" texts. Only two flavors matter for VStream:
``MySQL56/<uuid>:1-5:7-9,<uuid2>:1-3`` (GTID sets; gaps are legal) and
``MariaDB/0-1-123,1-2-7`` (one domain-server-sequence per domain). ``current`` (a request for
the newest position) and the empty text (stream from the beginning, i.e. copy first) are
requests, not positions; ``""`` compares as the empty set, ``current`` cannot be compared.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from airflow_provider_vitess._proto import binlogdata_pb2, query_pb2
from airflow_provider_vitess.exceptions import InvalidVgtidError

CURRENT = "current"
MYSQL56 = "MySQL56"
MARIADB = "MariaDB"
_MAX_QUOTE = 200
_ENTRY_KEYS = ("keyspace", "shard", "gtid", "table_p_ks")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_INTERVAL = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_MARIADB_GTID = re.compile(r"^([0-9]+)-([0-9]+)-([0-9]+)$")


def _q(value: object) -> str:
    """Quote a value for an error message, truncated: inputs can be megabytes of JSON."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _MAX_QUOTE:
        text = f"{text[:_MAX_QUOTE]}...({len(text)} chars)"
    return f"'{text}'"


def _type_name(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else type(value).__name__)


# ---------------------------------------------------------------------------------------------
# Positions


@dataclass(frozen=True)
class Position:
    """A parsed position. ``flavor == ""`` is the empty position (no transactions at all).

    MySQL56: ``uuid_sets`` maps each lower-cased server UUID to sorted, merged, inclusive
    intervals. MariaDB: ``domains`` holds (domain, server, sequence), one per domain, sorted.
    """

    flavor: str
    uuid_sets: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    domains: tuple[tuple[int, int, int], ...] = ()


@functools.lru_cache(maxsize=4096)
def parse_position(text: str) -> Position:
    """Parse a flavored position; cached because every VGTID event repeats the same texts."""
    if text == "":
        return Position("")
    if text == CURRENT:
        raise InvalidVgtidError(f"{_q(CURRENT)} is a request for the newest position, not a position")
    flavor, sep, body = text.partition("/")
    if not sep:
        raise InvalidVgtidError(
            f"position {_q(text)} has no flavor prefix (expected 'MySQL56/...' or 'MariaDB/...')"
        )
    if flavor == MYSQL56:
        return Position(MYSQL56, uuid_sets=_parse_mysql56(body))
    if flavor == MARIADB:
        return Position(MARIADB, domains=_parse_mariadb(body))
    raise InvalidVgtidError(
        f"unknown GTID flavor {_q(flavor)} in position {_q(text)} (expected MySQL56 or MariaDB)"
    )


def _parse_mysql56(body: str) -> tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    def bad(why: str) -> InvalidVgtidError:
        return InvalidVgtidError(f"invalid MySQL56 GTID set {_q(body)}: {why}")

    sets: dict[str, list[tuple[int, int]]] = {}
    # MySQL prints gtid_executed with a newline after each comma; empty items are skipped like Vitess does.
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        uuid, _, tail = item.partition(":")
        if not _UUID.match(uuid):
            raise bad(f"{_q(uuid)} is not a server UUID")
        if not tail:
            raise bad(f"{_q(item)} has no interval (expected uuid:start-end)")
        for text in tail.split(":"):
            m = _INTERVAL.match(text)
            if not m:
                raise bad(f"interval {_q(text)} is not 'N' or 'N-M' with positive integers")
            start, end = int(m[1]), int(m[2] or m[1])
            if start < 1 or end < start:
                raise bad(f"interval {_q(text)} must satisfy 1 <= start <= end")
            sets.setdefault(uuid.lower(), []).append((start, end))
    return tuple((uuid, _merge(ivs)) for uuid, ivs in sorted(sets.items()))


def _merge(intervals: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sort and coalesce overlapping or adjacent intervals (1-5 and 6-9 are one run 1-9)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def _parse_mariadb(body: str) -> tuple[tuple[int, int, int], ...]:
    domains: dict[int, tuple[int, int, int]] = {}
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        m = _MARIADB_GTID.match(item)
        if not m:
            raise InvalidVgtidError(
                f"invalid MariaDB GTID set {_q(body)}: {_q(item)} is not domain-server-sequence"
            )
        domain, server, seq = int(m[1]), int(m[2]), int(m[3])
        if domain in domains:
            raise InvalidVgtidError(f"invalid MariaDB GTID set {_q(body)}: domain {domain} appears twice")
        domains[domain] = (domain, server, seq)
    return tuple(sorted(domains.values()))


def _comparable(a: str, b: str) -> tuple[Position, Position]:
    pa, pb = parse_position(a), parse_position(b)
    if pa.flavor and pb.flavor and pa.flavor != pb.flavor:
        raise InvalidVgtidError(f"cannot compare positions of different flavors: {_q(a)} and {_q(b)}")
    return pa, pb


def position_contains(a: str, b: str) -> bool:
    """True if position ``a`` has reached ``b``: every transaction in ``b`` is also in ``a``.

    MySQL56 compares transaction sets (so a gap in ``a`` that ``b`` covers means "not reached");
    MariaDB compares sequence numbers per domain, the server id being irrelevant to order.
    """
    pa, pb = _comparable(a, b)
    if pb.flavor == MYSQL56:
        have = dict(pa.uuid_sets)
        for uuid, wanted in pb.uuid_sets:
            runs = have.get(uuid, ())
            for start, end in wanted:
                if not any(rs <= start and end <= re_ for rs, re_ in runs):
                    return False
        return True
    if pb.flavor == MARIADB:
        have_seq = {domain: seq for domain, _, seq in pa.domains}
        return all(have_seq.get(domain, -1) >= seq for domain, _, seq in pb.domains)
    return True  # b is the empty position


def transactions_missing(a: str, b: str) -> int:
    """How many transactions of ``b`` are not in ``a``: a lag figure for progress reporting."""
    pa, pb = _comparable(a, b)
    if pb.flavor == MYSQL56:
        have = dict(pa.uuid_sets)
        missing = 0
        for uuid, wanted in pb.uuid_sets:
            for start, end in wanted:
                covered = sum(max(0, min(end, he) - max(start, hs) + 1) for hs, he in have.get(uuid, ()))
                missing += end - start + 1 - covered
        return missing
    if pb.flavor == MARIADB:
        have_seq = {domain: seq for domain, _, seq in pa.domains}
        return sum(max(0, seq - have_seq.get(domain, 0)) for domain, _, seq in pb.domains)
    return 0


# ---------------------------------------------------------------------------------------------
# VGTID value


@dataclass(frozen=True)
class TableLastPK:
    """A table's last copied primary key during the copy phase.

    ``lastpk`` is the serialized ``query.QueryResult`` (deterministic encoding), or None when the
    proto field is unset. Keeping the bytes rather than a decoded form keeps the value hashable
    and lossless, including fields of QueryResult that this package does not know about.
    """

    table_name: str
    lastpk: bytes | None = None

    def query_result(self) -> query_pb2.QueryResult | None:
        if self.lastpk is None:
            return None
        result = query_pb2.QueryResult()
        result.ParseFromString(self.lastpk)
        return result


@dataclass(frozen=True)
class ShardGtid:
    """Position of one shard. An empty ``shard`` stands for all shards of the keyspace."""

    keyspace: str
    shard: str
    gtid: str
    table_last_pks: tuple[TableLastPK, ...] = field(default=())

    def __post_init__(self) -> None:
        # Accept any iterable (e.g. a list) but store a tuple so the value stays immutable.
        object.__setattr__(self, "table_last_pks", tuple(self.table_last_pks))

    @property
    def is_copying(self) -> bool:
        return bool(self.table_last_pks) or self.gtid == ""


@dataclass(frozen=True)
class Vgtid:
    """A VStream position over shards; immutable and validated on construction."""

    shard_gtids: tuple[ShardGtid, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_gtids", tuple(self.shard_gtids))
        if not self.shard_gtids:
            raise InvalidVgtidError("VGTID has no shard entries")
        seen: dict[tuple[str, str], int] = {}
        for i, sg in enumerate(self.shard_gtids):
            _check_entry(i, sg, seen)

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def current(cls, keyspace: str, shards: Iterable[str]) -> Vgtid:
        """Start every named shard at its newest position (no copy)."""
        return cls(tuple(ShardGtid(keyspace, shard, CURRENT) for shard in shards))

    @classmethod
    def for_keyspace(cls, keyspace: str, gtid: str = CURRENT) -> Vgtid:
        """All shards of a keyspace, resolved by vtgate: ``current`` or ``""`` (copy first)."""
        return cls((ShardGtid(keyspace, "", gtid),))

    @classmethod
    def from_proto(cls, message: binlogdata_pb2.VGtid) -> Vgtid:
        entries = []
        for sg in message.shard_gtids:
            pks = tuple(
                TableLastPK(
                    pk.table_name,
                    pk.lastpk.SerializeToString(deterministic=True) if pk.HasField("lastpk") else None,
                )
                for pk in sg.table_p_ks
            )
            entries.append(ShardGtid(sg.keyspace, sg.shard, sg.gtid, pks))
        return cls(tuple(entries))

    def to_proto(self) -> binlogdata_pb2.VGtid:
        message = binlogdata_pb2.VGtid()
        for sg in self.shard_gtids:
            out = message.shard_gtids.add(keyspace=sg.keyspace, shard=sg.shard, gtid=sg.gtid)
            for pk in sg.table_last_pks:
                tlpk = out.table_p_ks.add(table_name=pk.table_name)
                if pk.lastpk is not None:
                    tlpk.lastpk.ParseFromString(pk.lastpk)
                    tlpk.lastpk.SetInParent()  # an empty QueryResult is still "set"
        return message

    @classmethod
    def from_json(cls, text: str | bytes) -> Vgtid:
        """Parse the JSON text written by :meth:`to_json`.

        Also accepts protobuf's JSON form of a VGtid (``{"shard_gtids": [...]}``), which is how
        vtgate and Vitess tools print one. Entries are numbered from 0 in error messages.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidVgtidError(
                f"VGTID is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except UnicodeDecodeError as exc:
            raise InvalidVgtidError(f"VGTID is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
        if isinstance(data, dict) and set(data) == {"shard_gtids"}:
            data = data["shard_gtids"]
        if not isinstance(data, list):
            raise InvalidVgtidError(
                "VGTID JSON must be a list of shard entries (or an object with only 'shard_gtids'), "
                f"got {_type_name(data)}: {_q(data)}"
            )
        return cls(tuple(_entry_from_json(i, item) for i, item in enumerate(data)))

    def to_json(self) -> str:
        """Compact, deterministic JSON: the same VGTID always gives the same text."""
        entries = [
            {
                "keyspace": sg.keyspace,
                "shard": sg.shard,
                "gtid": sg.gtid,
                "table_p_ks": [_pk_to_json(pk) for pk in sg.table_last_pks],
            }
            for sg in self.shard_gtids
        ]
        return json.dumps(entries, separators=(",", ":"), ensure_ascii=False)

    # -- queries and updates ------------------------------------------------------------------

    @property
    def keyspaces(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(sg.keyspace for sg in self.shard_gtids))

    @property
    def is_copying(self) -> bool:
        return any(sg.is_copying for sg in self.shard_gtids)

    def shard(self, keyspace: str, shard: str) -> ShardGtid | None:
        return next((sg for sg in self.shard_gtids if (sg.keyspace, sg.shard) == (keyspace, shard)), None)

    def replace_shard(self, entry: ShardGtid) -> Vgtid:
        """A copy with ``entry`` in place of the same keyspace/shard, or appended if absent."""
        key = (entry.keyspace, entry.shard)
        if self.shard(*key) is None:
            return replace(self, shard_gtids=(*self.shard_gtids, entry))
        return replace(
            self,
            shard_gtids=tuple(entry if (sg.keyspace, sg.shard) == key else sg for sg in self.shard_gtids),
        )

    def has_reached(self, stop: Vgtid) -> bool:
        """True if every shard of ``stop`` is in ``self`` at or past stop's position.

        A shard missing from ``self`` has not reached anything; neither has a shard still in
        its copy phase (table last-PKs present), whose rows are not all there yet.
        """
        for sg in stop.shard_gtids:
            if not sg.shard or sg.gtid == CURRENT:
                raise InvalidVgtidError(
                    f"stop VGTID entry (keyspace {_q(sg.keyspace)}, shard {_q(sg.shard)}) is not a "
                    "resolved position: capture the stop from a VGTID event, not from a request"
                )
            mine = self.shard(sg.keyspace, sg.shard)
            if mine is None or mine.table_last_pks or mine.gtid == CURRENT:
                return False
            if not position_contains(mine.gtid, sg.gtid):
                return False
        return True


# ---------------------------------------------------------------------------------------------
# Validation and JSON helpers


def _where(i: int, keyspace: object = None, shard: object = None) -> str:
    parts = [f"keyspace {_q(keyspace)}"] if isinstance(keyspace, str) and keyspace else []
    if isinstance(shard, str) and shard:
        parts.append(f"shard {_q(shard)}")
    return f"VGTID entry {i}" + (f" ({', '.join(parts)})" if parts else "")


def _check_entry(i: int, sg: ShardGtid, seen: dict[tuple[str, str], int]) -> None:
    where = _where(i, sg.keyspace, sg.shard)
    if not sg.keyspace:
        raise InvalidVgtidError(f"{where} has an empty 'keyspace'")
    if not sg.shard and sg.gtid not in (CURRENT, ""):
        raise InvalidVgtidError(
            f"{where} has an empty 'shard' with gtid {_q(sg.gtid)}: "
            "only 'current' or '' may stand for all shards of a keyspace"
        )
    key = (sg.keyspace, sg.shard)
    if key in seen:
        raise InvalidVgtidError(f"{where} repeats entry {seen[key]}")
    seen[key] = i
    if sg.gtid != CURRENT:
        try:
            parse_position(sg.gtid)
        except InvalidVgtidError as exc:
            raise InvalidVgtidError(f"{where}: {exc}") from None
    tables: set[str] = set()
    for j, pk in enumerate(sg.table_last_pks):
        if not isinstance(pk, TableLastPK) or not pk.table_name:
            raise InvalidVgtidError(f"{where} table_p_ks[{j}] has no 'table_name'")
        if pk.table_name in tables:
            raise InvalidVgtidError(f"{where} table_p_ks[{j}] repeats table {_q(pk.table_name)}")
        tables.add(pk.table_name)
        if pk.lastpk is not None:
            try:
                query_pb2.QueryResult.FromString(pk.lastpk)
            except DecodeError as exc:
                raise InvalidVgtidError(
                    f"{where} table_p_ks[{j}] ({_q(pk.table_name)}) lastpk is not a query.QueryResult: {exc}"
                ) from None


def _entry_from_json(i: int, item: object) -> ShardGtid:
    if not isinstance(item, dict):
        raise InvalidVgtidError(f"VGTID entry {i} must be an object, got {_type_name(item)}: {_q(item)}")
    where = _where(i, item.get("keyspace"), item.get("shard"))
    unknown = [k for k in item if k not in _ENTRY_KEYS]
    if unknown:
        raise InvalidVgtidError(
            f"{where} has unknown key {_q(unknown[0])} (expected {', '.join(_ENTRY_KEYS)})"
        )
    for name in ("keyspace", "shard", "gtid"):
        if name not in item:
            raise InvalidVgtidError(f"{where} has no {name!r}")
        if not isinstance(item[name], str):
            raise InvalidVgtidError(f"{where} {name!r} must be a string, got {_type_name(item[name])}")
    pks = item.get("table_p_ks")
    pks = [] if pks is None else pks
    if not isinstance(pks, list):
        raise InvalidVgtidError(f"{where} 'table_p_ks' must be a list, got {_type_name(pks)}")
    return ShardGtid(
        item["keyspace"],
        item["shard"],
        item["gtid"],
        tuple(_pk_from_json(where, j, pk) for j, pk in enumerate(pks)),
    )


def _pk_from_json(where: str, j: int, pk: object) -> TableLastPK:
    if not isinstance(pk, dict):
        raise InvalidVgtidError(f"{where} table_p_ks[{j}] must be an object, got {_type_name(pk)}")
    unknown = [k for k in pk if k not in ("table_name", "lastpk")]
    if unknown:
        raise InvalidVgtidError(
            f"{where} table_p_ks[{j}] has unknown key {_q(unknown[0])} (expected table_name, lastpk)"
        )
    name = pk.get("table_name")
    if not isinstance(name, str) or not name:
        raise InvalidVgtidError(f"{where} table_p_ks[{j}] has no 'table_name'")
    raw = pk.get("lastpk")
    if raw is None:
        return TableLastPK(name)
    if not isinstance(raw, dict):
        raise InvalidVgtidError(f"{where} table_p_ks[{j}] ({_q(name)}) 'lastpk' must be an object")
    result = query_pb2.QueryResult()
    try:
        json_format.ParseDict(raw, result)
    except json_format.ParseError as exc:
        raise InvalidVgtidError(
            f"{where} table_p_ks[{j}] ({_q(name)}) 'lastpk' is not a query.QueryResult: {_q(str(exc))}"
        ) from None
    return TableLastPK(name, result.SerializeToString(deterministic=True))


def _pk_to_json(pk: TableLastPK) -> dict[str, Any]:
    out: dict[str, Any] = {"table_name": pk.table_name}
    result = pk.query_result()
    if result is not None:
        # Proto field names (not camelCase), as Vitess and Debezium print them; int64 as strings,
        # bytes as base64: the protobuf JSON mapping, which parses back to the same message.
        out["lastpk"] = json_format.MessageToDict(result, preserving_proto_field_name=True)
    return out
