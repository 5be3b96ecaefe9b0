"""The repository stands alone: no tracked file points outside it, and the documentation's
relative links resolve to files in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.local import REPO

# Spelled in pieces so this file does not match itself.
OUTSIDE = ("../" + "shared", "/work" + "/", "DESIGN" + ".md")
_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#[^)]*)?\)")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    data = path.read_bytes() if path.is_file() else b""
    if b"\0" in data:
        return None  # binary (images)
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_refers_to_a_path_outside_the_repo() -> None:
    found = []
    for path in _tracked():
        text = _text(path)
        for needle in OUTSIDE:
            if text and needle in text:
                line = text[: text.index(needle)].count("\n") + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {needle}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_markdown_links_resolve_inside_the_repo() -> None:
    broken = []
    tracked = set(_tracked())
    for path in (p for p in tracked if p.suffix == ".md"):
        for target in _LINK.findall(path.read_text()):
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or resolved not in {p.resolve() for p in tracked}:
                broken.append(f"{path.relative_to(REPO)} -> {target}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)
    assert (REPO / "docs" / "index.md") in tracked


def test_ci_runs_the_readmes_two_commands_in_the_readmes_order() -> None:
    """CI proves a newcomer's path: the commands of the README's "Two commands" block, in its
    order, in one checkout (a test that reads what the demo left fails there, not on a laptop);
    then the fleet's tests, which do not fit `make test`'s budget."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Two commands", 1)[1].split("```", 2)[1]
    readme_commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    ci = (REPO / ".ci" / "run").read_text()
    ci_commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert readme_commands == ["make demo", "make test"]
    assert ci_commands == [*readme_commands, "make test-fleet"]
