"""Typed JSON documents: frozen dataclasses that pydantic parses, checks and dumps.

The staging manifest, the merge plan and report and the recorded key choices stay plain
frozen dataclasses (positional, cheap to build, compared by value, ``dataclasses.replace``);
:class:`JsonDocument` gives them their one way to and from JSON: pydantic's ``TypeAdapter`` of
the class checks every field's type on the way in (``plugins/documents.py`` serves its models
with the same library), and :func:`problems` says what is wrong field by field, e.g.
``tables.orders.parts.0.rows: Input should be a valid integer, got string``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BeforeValidator, TypeAdapter, ValidationError

D = TypeVar("D", bound="JsonDocument")
_SHOWN = 5  # problems listed in one message; the rest are counted


_ADAPTERS: dict[object, TypeAdapter[Any]] = {}


def adapter(cls: Any) -> TypeAdapter[Any]:
    """The pydantic adapter of a type, built once (building one costs milliseconds)."""
    found = _ADAPTERS.get(cls)
    if found is None:
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return found


class JsonDocument:
    """Mixin of a frozen dataclass that is (a part of) a JSON document.

    ``from_json`` of a class with a ``document`` name raises ``error("<source> is not a valid
    <document>: <problems>")``, ``source`` naming where the text came from (a file); without
    one it raises pydantic's ``ValidationError`` (a ``ValueError``) for its caller to report.
    """

    document: ClassVar[str] = ""
    error: ClassVar[type[Exception]] = ValueError
    strict: ClassVar[bool] = False  # True: no "5" for 5, no 1 for true (documents only we write)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: tuples as lists, enums as their values."""
        out: dict[str, Any] = adapter(type(self)).dump_python(self, mode="json")
        return out

    def to_json(self) -> str:
        return adapter(type(self)).dump_json(self).decode()

    @classmethod
    def from_dict(cls: type[D], data: Mapping[str, Any]) -> D:
        doc: D = adapter(cls).validate_python(data, strict=cls.strict)
        return doc

    @classmethod
    def from_json(cls: type[D], text: str | bytes, *, source: str = "") -> D:
        try:
            doc: D = adapter(cls).validate_json(text, strict=cls.strict)
        except ValidationError as exc:
            if not cls.document:
                raise
            said = f"{source} is not" if source else "not"
            raise cls.error(f"{said} a valid {cls.document}: {problems(exc)}") from None
        return doc


def null_is(empty: object) -> BeforeValidator:
    """For an optional list or map field: null reads as ``empty`` (as a missing key does)."""
    return BeforeValidator(lambda value: empty if value is None else value)


def problems(exc: ValidationError) -> str:
    """Each problem of a document named by its field path, in the document's order."""
    said = [_problem(e) for e in exc.errors(include_url=False)]
    more = f" (and {len(said) - _SHOWN} more)" if len(said) > _SHOWN else ""
    return "; ".join(said[:_SHOWN]) + more


def _problem(error: Any) -> str:
    loc = tuple(str(part) for part in error["loc"])
    where = ".".join(loc)
    kind = error["type"]
    if kind == "missing":
        return f"missing key {loc[-1]!r}" + (f" in {'.'.join(loc[:-1])}" if len(loc) > 1 else "")
    if kind in ("dataclass_type", "model_type", "dict_type"):
        return f"{where or 'the document'} must be a JSON object, got {_json_type(error['input'])}"
    if kind == "value_error":  # our own checks (a VGTID, a format version): their message as is
        return f"{where}: {error['ctx']['error']}"
    if kind.startswith("json_"):
        return str(error["msg"])
    said = f"{where}: {error['msg']}" if where else str(error["msg"])
    return f"{said}, got {_json_type(error['input'])}"


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else type(value).__name__)
