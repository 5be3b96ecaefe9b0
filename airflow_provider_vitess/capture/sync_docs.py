"""The sync object's reference tables, generated from the models (names, types, defaults and
``Field(description=...)``), so ``docs/reference.md`` cannot drift from the code
(``tests/unit/house/test_sync_reference.py`` fails when it does).

    python -m airflow_provider_vitess.capture.sync_docs --markdown          # print the tables
    python -m airflow_provider_vitess.capture.sync_docs --write docs/reference.md  # refresh them

``--write`` replaces what lies between :data:`BEGIN` and :data:`END` in the file.
"""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from airflow_provider_vitess.capture.sync import TableSpec, VitessSync
from airflow_provider_vitess.capture.sync_parts import (
    CaptureSettings,
    ChangeWait,
    ReadBudget,
    SparkConnect,
    SparkSubmit,
    TargetDefaults,
)

__all__ = ["BEGIN", "END", "MODELS", "markdown", "replace_block"]

BEGIN = "<!-- sync-options:begin (generated: python -m airflow_provider_vitess.capture.sync_docs) -->"
END = "<!-- sync-options:end -->"
# In the order a reader meets them: the sync, its tables, then its parts.
MODELS: tuple[type[BaseModel], ...] = (
    VitessSync,
    TableSpec,
    ReadBudget,
    ChangeWait,
    TargetDefaults,
    CaptureSettings,
    SparkSubmit,
    SparkConnect,
)


def _type(annotation: Any) -> str:
    """A field's type as a reader writes its value (JSON's list for a tuple)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if origin is Annotated:  # a validator's (text accepted for a list): the type is the first
        return _type(args[0])
    if origin in (Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if origin is tuple:
        return f"list[{_type(args[0])}]" if len(args) == 2 and args[1] is Ellipsis else "list"
    if origin is dict:
        return f"dict[{_type(args[0])}, {_type(args[1])}]"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"`{annotation.__name__}`"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}()`"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(model: type[BaseModel]) -> str:
    """One model's table: its docstring's first paragraph, then a row per field."""
    doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    rows = [
        f"#### `{model.__name__}`",
        "",
        doc,
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, field in model.model_fields.items():
        rows.append(
            f"| `{name}` | {_cell(_type(field.annotation))} | {_cell(_default(field))} "
            f"| {_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def markdown() -> str:
    """Every model's table, between the markers."""
    return "\n\n".join([BEGIN, *(table(m) for m in MODELS), END])


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the markers (included) replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are not in the file, in that order")
    return text[:start] + block + text[end + len(END) :]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the tables")
    group.add_argument("--write", type=Path, help="replace the tables in this Markdown file")
    options = parser.parse_args(argv)
    if options.write:
        path: Path = options.write
        path.write_text(replace_block(path.read_text(encoding="utf-8"), markdown()), encoding="utf-8")
    else:
        print(markdown())


if __name__ == "__main__":
    main()
