"""``VStreamResponse`` bytes read through *views* (pure): messages with the upstream field numbers
in which ``VEvent.row_event`` is the serialized ``RowEvent`` as vtgate sent it and
``RowEvent.row_changes`` is ``repeated bytes``, so no row is parsed (``docs/design.md``,
Decoding).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from airflow_provider_vitess._proto import binlogdata_pb2, vtgate_pb2

_PACKAGE = "airflow_provider_vitess.wire_view"
F = descriptor_pb2.FieldDescriptorProto


def _copy_as_bytes(file: descriptor_pb2.FileDescriptorProto, message: Any, name: str, field: str) -> None:
    """``message``'s type, field for field (CopyToProto keeps fully qualified type names), added
    to ``file`` as ``name`` with ``field`` read as bytes."""
    copy = file.message_type.add()
    message.DESCRIPTOR.CopyToProto(copy)
    copy.name = name
    (as_bytes,) = (f for f in copy.field if f.name == field)
    as_bytes.type = F.TYPE_BYTES
    as_bytes.ClearField("type_name")


def _view_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="airflow_provider_vitess/wire_view.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=[binlogdata_pb2.DESCRIPTOR.name],
    )
    _copy_as_bytes(file, binlogdata_pb2.VEvent, "VEvent", "row_event")
    # repeated bytes: each row change stays serialized; only their count is read.
    _copy_as_bytes(file, binlogdata_pb2.RowEvent, "RowEventHeader", "row_changes")
    (events,) = vtgate_pb2.VStreamResponse.DESCRIPTOR.fields
    response = file.message_type.add(name="VStreamResponse")
    response.field.add(
        name=events.name,
        number=events.number,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=f".{_PACKAGE}.VEvent",
    )
    return file


def _view_classes() -> tuple[Any, Any]:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName("airflow_provider_vitess/wire_view.proto")
    except KeyError:
        pool.Add(_view_file())
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.VStreamResponse")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.RowEventHeader")),
    )


ResponseView, RowEventHeader = _view_classes()
EventView = message_factory.GetMessageClass(ResponseView.DESCRIPTOR.fields_by_name["events"].message_type)


def parse_response(data: bytes) -> Any:
    """A ``VStreamResponse`` whose events read like ``binlogdata.VEvent`` but for ``row_event``
    (bytes). Raises ``google.protobuf.message.DecodeError`` on bytes that are not one."""
    return ResponseView.FromString(data)


def parse_event(data: bytes) -> Any:
    """One serialized ``binlogdata.VEvent`` as the view events of :func:`parse_response` read."""
    return EventView.FromString(data)


def parse_row_event_header(data: bytes) -> Any:
    """``table_name``, ``keyspace``, ``shard``, ``flags``, ``is_internal_table`` of a serialized
    ``binlogdata.RowEvent``; ``row_changes`` is each row change still serialized."""
    return RowEventHeader.FromString(data)


def to_vevent(view: Any) -> binlogdata_pb2.VEvent:
    """The real ``binlogdata.VEvent`` of a view event (for the rare event kept whole)."""
    return binlogdata_pb2.VEvent.FromString(view.SerializeToString())
