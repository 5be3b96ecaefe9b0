"""The package's import graph: no cycle, and no arrow up the layers of docs/architecture.md.

The graph is read from the source (``ast``), not from an import: every ``import`` and ``from ...
import`` counts, at module level and inside functions alike (a lazy import hides a cycle from
Python, not from the design). ``from package import name`` points at the submodule ``name`` when
there is one, else at the package's ``__init__``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.local import PACKAGE_SOURCE, REPO

PACKAGE = "airflow_provider_vitess"
ROOT = REPO
SOURCE = PACKAGE_SOURCE
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Rooms (dotted paths below the package) by layer, as docs/architecture.md's table states them;
# a module may import from its own layer or a lower one. The longest matching room decides
# (``vstream.request`` sits below the rest of ``vstream``). Layer 0 is what every layer shares.
LAYERS: dict[str, int] = {
    # the Airflow edge
    "operators": 4,
    "sensors": 4,
    "triggers": 4,
    "plugins": 4,
    "lineage": 4,
    "dag_factory": 4,
    "deadlines": 4,
    "connections": 4,
    "get_provider_info": 4,
    "store_copy": 4,
    "utils.task": 4,
    # capture / merge
    "capture": 3,
    "merge": 3,
    "keys": 3,
    "consistent_reads": 3,
    # vstream / staging / checkpoints
    "vstream": 2,
    "staging": 2,
    "checkpoints": 2,
    # decoding (vtgate's bytes to events and values), vgtid / hooks
    "decoding": 1,
    "vgtid": 1,
    "vstream.request": 1,
    "hooks": 1,
    # shared by all
    "exceptions": 0,
    "keyrange": 0,
    "delta_txns": 0,
    "object_storage": 0,
    "versions": 0,
    "single_host": 0,
    "utils": 0,
}

# Cycles known and not fixed yet, each a sorted tuple of its modules (issue 27: remove an entry
# once its cycle is broken; the test fails on an entry that no longer is a cycle). None now.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package (generated protobuf code aside): name -> (file, is package)."""
    out = {}
    for file in SOURCE.rglob("*.py"):
        parts = list(file.relative_to(SOURCE.parent).with_suffix("").parts)
        if "_proto" in parts:
            continue
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (file, package)
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The package module ``name`` is, or lies in (an attribute of a module: the module)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def _imported(module: str) -> Iterator[str]:
    file, package = MODULES[module]
    here = module if package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        for name in names:
            target = _owner(name) if name.startswith(PACKAGE) else None
            if target is not None and target != module:
                yield target


GRAPH = {module: set(_imported(module)) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def layer(module: str) -> int:
    rel = module.removeprefix(PACKAGE).removeprefix(".")
    if not rel:  # the package's __init__: its version, nothing else
        return 0
    rooms = [room for room in LAYERS if rel == room or rel.startswith(room + ".")]
    if not rooms:
        raise AssertionError(
            f"{module} is in no layer: place its room in docs/architecture.md's table and in LAYERS here"
        )
    return LAYERS[max(rooms, key=len)]


def test_the_graph_is_read_from_every_import_of_the_source() -> None:
    # A function-level import counts as much as a module-level one.
    assert (
        "airflow_provider_vitess.merge.job.connect_tables"
        in GRAPH["airflow_provider_vitess.merge.job.delta_access"]
    )
    assert "airflow_provider_vitess.merge.plan" in GRAPH["airflow_provider_vitess.merge.runner"]
    assert len(GRAPH) > 100


def test_the_cycle_finder_finds_a_cycle_and_only_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == {("a", "b", "c")}


def test_no_import_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert cycles - KNOWN_CYCLES == set(), "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
    assert KNOWN_CYCLES - cycles == set(), "KNOWN_CYCLES lists a cycle that is gone: remove it"


def test_no_module_imports_from_a_higher_layer() -> None:
    up = sorted(
        f"{module} (layer {layer(module)}) -> {target} (layer {layer(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert up == []


@pytest.mark.parametrize("room", sorted(r for r in LAYERS if LAYERS[r] > 0))
def test_each_layered_room_is_in_the_architecture_table(room: str) -> None:
    table = "\n".join(line for line in ARCHITECTURE.read_text().splitlines() if line.startswith("|"))
    top, _, rest = room.partition(".")
    named = {f"`{top}/`", f"`{top}.py`", f"`{room.replace('.', '/')}.py`"} | (
        {f"`{rest}`"} if rest else set()
    )
    assert any(name in table for name in named), f"{room} is not in docs/architecture.md's layer table"
    if rest:  # a module of a room: both named, in the same row
        rows = [
            line
            for line in table.splitlines()
            if re.search(rf"`{re.escape(room.replace('.', '/'))}\.py`", line)
        ]
        assert rows, f"{room} is not in docs/architecture.md's layer table"
