"""The tests are laid out like the code (tests/README.md): every test module in a room of its tier,
shared helpers in ``tests/support/``, and no module importing a test module. A test module that
imports another runs that module's module-level code (and, through pytest, can pull its fixtures
into a second module); what two modules share belongs in ``tests/support/``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.local import REPO
from tests.support.scheduling import LONG_FIRST, SHARED_TABLES

TESTS = REPO / "tests"
TIERS = ("unit", "job", "integration")


def _modules(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py") if "__pycache__" not in path.parts)


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, dotted, relative imports resolved (``from a import b`` is
    both ``a`` and ``a.b``: ``b`` may be a module)."""
    package = _dotted(path).rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _is_test_module(dotted: str) -> bool:
    return dotted.startswith("tests.") and dotted.rsplit(".", 1)[-1].startswith("test_")


def test_no_module_imports_a_test_module() -> None:
    found = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules(TESTS, REPO / "bench", REPO / "dev")
        for name in sorted(_imported(path))
        if _is_test_module(name) and name != _dotted(path)
    ]
    assert not found, "move what they share into tests/support/:\n" + "\n".join(found)


def test_every_test_module_is_in_a_room_of_its_tier() -> None:
    outside = [
        str(path.relative_to(REPO))
        for path in _modules(TESTS)
        if path.name.startswith("test_")
        and path.parts[len(TESTS.parts)] in ("unit", "integration")
        and len(path.relative_to(TESTS).parts) != 3
    ]
    assert not outside, f"put each in tests/<tier>/<room>/ (tests/README.md lists the rooms): {outside}"
    stray = [str(p.relative_to(REPO)) for p in TESTS.glob("*.py") if p.name.startswith("test_")]
    assert not stray, f"test modules belong to a tier: {stray}"
    no_init = [
        str(d.relative_to(REPO))
        for d in TESTS.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert not no_init, f"a directory of test modules needs an __init__.py: {no_init}"


def test_module_names_are_unique_within_a_tier_and_the_scheduling_lists_name_real_ones() -> None:
    """tests/support/scheduling.py names integration modules by their stem."""
    for tier in TIERS:
        stems = [p.stem for p in _modules(TESTS / tier) if p.name.startswith("test_")]
        assert sorted(stems) == sorted(set(stems)), f"tests/{tier}: two modules of one name"
    integration = {p.stem for p in _modules(TESTS / "integration") if p.name.startswith("test_")}
    named = {m for modules in SHARED_TABLES.values() for m in modules} | set(LONG_FIRST)
    assert named <= integration, f"not an integration module: {sorted(named - integration)}"
