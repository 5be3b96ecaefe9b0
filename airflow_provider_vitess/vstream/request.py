"""Every VStream request of the provider is built here: position, table filter, flags, and the
connection's tablet type and cells.

One builder so a setting of the connection reaches every read the same way: the snapshot, the
catch-up window, the stop-position probe, the changes sensor and its trigger. (Each used to
build its own request, and the capture runner once left out the connection's tablet type.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from airflow_provider_vitess._proto import binlogdata_pb2, topodata_pb2, vtgate_pb2
from airflow_provider_vitess.vgtid import Vgtid


class _TargetConfig(Protocol):
    """The part of a ``VitessConnectionConfig`` a request uses."""

    @property
    def tablet_type(self) -> str: ...
    @property
    def cells(self) -> tuple[str, ...]: ...


def tablet_type_of(value: int | str) -> topodata_pb2.TabletType:
    """The proto enum of a tablet type given by name (any case) or number."""
    wrapper = topodata_pb2.TabletType
    try:
        number = (
            wrapper.Value(value.upper()) if isinstance(value, str) else wrapper.Value(wrapper.Name(value))
        )
        return cast(topodata_pb2.TabletType, number)
    except ValueError:
        names = ", ".join(topodata_pb2.TabletType.keys())
        raise ValueError(f"unknown tablet type {value!r}; expected one of {names}") from None


def quote_identifier(name: str) -> str:
    """``name`` as a backquoted identifier of the filter's SQL (vttablet parses it with Vitess's
    MySQL grammar): no name from a user reaches that text unquoted."""
    return "`" + name.replace("`", "``") + "`"


def table_filter(
    tables: Sequence[str], columns: Mapping[str, Sequence[str] | None] | None = None
) -> binlogdata_pb2.Filter:
    """One rule per table (exact names: a rule's ``match`` is a name, never a pattern here).

    ``columns``: per table, the only columns to stream (column control, ``capture/columns.py``):
    vttablet projects every copied and binlog row onto them, so the others never leave it. A
    table without an entry (or with None) streams every column."""
    chosen = columns or {}

    def select(table: str) -> str:
        names = chosen.get(table)
        if names is not None and not names:
            raise ValueError(f"table {table!r}: an empty column list selects nothing")
        listed = "*" if names is None else ", ".join(map(quote_identifier, names))
        return f"select {listed} from {quote_identifier(table)}"

    return binlogdata_pb2.Filter(rules=[binlogdata_pb2.Rule(match=t, filter=select(t)) for t in tables])


def vstream_request(
    vgtid: Vgtid | binlogdata_pb2.VGtid | None = None,
    *,
    tablet_type: int | str = "PRIMARY",
    filter: binlogdata_pb2.Filter | None = None,
    flags: vtgate_pb2.VStreamFlags | None = None,
    reshard_journals: bool = False,
) -> vtgate_pb2.VStreamRequest:
    """A ``VStreamRequest`` (``vgtid`` None: a template a reader completes per call).

    ``reshard_journals`` asks vtgate for its reshard JOURNAL events (whatever ``flags`` say):
    without them vtgate moves a stream to the new shards silently."""
    request = vtgate_pb2.VStreamRequest(tablet_type=tablet_type_of(tablet_type))
    if vgtid is not None:
        request.vgtid.CopyFrom(vgtid.to_proto() if isinstance(vgtid, Vgtid) else vgtid)
    if filter is not None:
        request.filter.CopyFrom(filter)
    if flags is not None:
        request.flags.CopyFrom(flags)
    if reshard_journals:
        request.flags.include_reshard_journal_events = True
    return request


@dataclass(frozen=True)
class StreamTarget:
    """What a connection says about where to stream from: the tablet type and the cells."""

    tablet_type: str = "PRIMARY"
    cells: tuple[str, ...] = ()

    @classmethod
    def of(cls, config: _TargetConfig) -> StreamTarget:
        return cls(config.tablet_type, tuple(config.cells))

    def flags(self, **overrides: Any) -> vtgate_pb2.VStreamFlags:
        """VStreamFlags with the connection's cells; ``overrides`` set any other flag field."""
        flags = vtgate_pb2.VStreamFlags(**overrides)
        if self.cells and not flags.cells:
            flags.cells = ",".join(self.cells)
        return flags

    def request(
        self,
        vgtid: Vgtid | binlogdata_pb2.VGtid,
        tables: Sequence[str] = (),
        columns: Mapping[str, Sequence[str] | None] | None = None,
        **flags: Any,
    ) -> vtgate_pb2.VStreamRequest:
        """The request for ``tables`` (none: the whole keyspace) from ``vgtid``; ``columns``: per
        table, the only columns to stream (see :func:`table_filter`)."""
        return vstream_request(
            vgtid,
            tablet_type=self.tablet_type,
            filter=table_filter(tables, columns) if tables else None,
            flags=self.flags(**flags),
        )
