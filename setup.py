"""Build hook: generate the protobuf/gRPC stubs from ``protos/`` before packaging.

All metadata lives in pyproject.toml; this file only adds the code-generation step.

The stubs are written into the source tree (``airflow_provider_vitess/_proto/``) rather than
into ``build/`` so that an editable install (``pip install -e .``), a regular install and a
wheel all see the same files. They are git-ignored and regenerated on every build.

Regenerate by hand (what ``make protos`` runs)::

    python setup.py build_protos
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import ClassVar

from setuptools import Command, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "airflow_provider_vitess" / "_proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")

# protoc emits "import query_pb2 as query__pb2" (top-level module names); inside our
# package those must be relative imports, or they would only resolve if _proto/ were on sys.path.
_ABSOLUTE_IMPORT = re.compile(r"^import (?P<mod>\w+_pb2) as (?P<alias>\w+)$", re.MULTILINE)


# protoc also names the module its message classes claim to live in ("query_pb2"); pickle looks
# classes up by that name, so it must be the real, importable one.
_MODULE_NAME = re.compile(r"BuildTopDescriptorsAndMessages\(DESCRIPTOR, '(?P<mod>\w+_pb2)', _globals\)")
PACKAGE = "airflow_provider_vitess._proto"


def _relativize(text: str, local_modules: set[str]) -> str:
    def repl(match: re.Match[str]) -> str:
        if match["mod"] not in local_modules:
            return match[0]
        return f"from . import {match['mod']} as {match['alias']}"

    def module(match: re.Match[str]) -> str:
        return f"BuildTopDescriptorsAndMessages(DESCRIPTOR, '{PACKAGE}.{match['mod']}', _globals)"

    return _MODULE_NAME.sub(module, _ABSOLUTE_IMPORT.sub(repl, text))


def generate_protos() -> list[Path]:
    """Run protoc on every protos/*.proto; raise on any failure. Returns the files written."""
    try:
        from grpc_tools import protoc  # imported lazily: only the generation step needs it
    except ImportError as exc:  # pragma: no cover - depends on the build environment
        raise SystemExit(
            "generating the Vitess protobuf stubs needs grpcio-tools (pip install 'grpcio-tools>=1.60')"
        ) from exc
    import grpc_tools

    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files found in {PROTO_DIR}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto

    with tempfile.TemporaryDirectory(prefix="vitess-protos-") as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(p) for p in protos),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed (exit status {rc}) on {', '.join(p.name for p in protos)}")

        local_modules = {f"{p.stem}_pb2" for p in protos}
        generated = sorted(p for p in Path(tmp).iterdir() if p.name.endswith(GENERATED_SUFFIXES))
        expected = {f"{p.stem}{suffix}" for p in protos for suffix in GENERATED_SUFFIXES}
        missing = expected - {p.name for p in generated}
        if missing:
            raise SystemExit(f"protoc did not produce: {', '.join(sorted(missing))}")

        OUT_DIR.mkdir(parents=True, exist_ok=True)
        written = []
        for src in generated:
            dest = OUT_DIR / src.name
            text = _relativize(src.read_text(encoding="utf-8"), local_modules)
            # Rewrite only on change, so repeated builds leave mtimes (and caches) alone.
            if not dest.exists() or dest.read_text(encoding="utf-8") != text:
                dest.write_text(text, encoding="utf-8")
            written.append(dest)

    # A proto that was removed or renamed must not leave a stale stub behind.
    for stale in OUT_DIR.iterdir():
        if stale.name.endswith(GENERATED_SUFFIXES) and stale.name not in expected:
            stale.unlink()
    return written


class BuildProtos(Command):
    """``python setup.py build_protos``: only regenerate the stubs."""

    description = "generate airflow_provider_vitess/_proto stubs from protos/*.proto"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        for path in generate_protos():
            print(f"generated {path.relative_to(ROOT)}")


class BuildPyWithProtos(build_py):
    """build_py that generates the stubs first (also runs for editable installs)."""

    def run(self) -> None:
        self.run_command("build_protos")
        # build_py computes its data-file list lazily; drop any list computed before the
        # stubs existed so the generated .pyi files are picked up.
        self.__dict__.pop("data_files", None)
        super().run()


setup(cmdclass={"build_protos": BuildProtos, "build_py": BuildPyWithProtos})
