"""The merge job's resolved jars, remembered so that later submits skip dependency resolution.

``spark-submit --packages`` resolves the Maven coordinates with Ivy on every submit, even when
every jar is already in the Ivy cache: seconds of each small window's merge. The first submit of
a set of packages still resolves them (Spark's own resolution, so the jar set is exactly
Spark's), and the job reports the jar files it was given (``spark.jars``); the operator keeps
that list here, keyed by the packages (and repositories / exclusions), and passes it as
``--jars`` from then on. An entry whose jars are no longer all on disk (the Ivy cache was
cleaned) is ignored and resolved again.

Pure file I/O on the machine that runs spark-submit; no Airflow, no Spark.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/airflow-provider-vitess/spark-jars`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airflow-provider-vitess" / "spark-jars"


def _entry(cache_dir: Path, key: Sequence[str | None]) -> Path:
    digest = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:24]
    return cache_dir / f"{digest}.json"


def cached_jars(cache_dir: Path, key: Sequence[str | None]) -> list[str] | None:
    """The jars recorded for ``key`` (packages, repositories, exclusions), if all still exist."""
    try:
        entry = json.loads(_entry(cache_dir, key).read_text())
    except (OSError, ValueError):
        return None
    jars = [str(j) for j in entry.get("jars") or []]
    if entry.get("key") != list(key) or not jars or not all(Path(_local(j)).is_file() for j in jars):
        return None
    return jars


def remember_jars(cache_dir: Path, key: Sequence[str | None], jars: Sequence[str]) -> None:
    """Record the jars a resolution of ``key`` gave (atomically: readers see all or nothing)."""
    local = [j for j in jars if j]
    if not local or not all(Path(_local(j)).is_file() for j in local):
        return  # not local files (a cluster's paths, URLs): nothing this machine can reuse
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = _entry(cache_dir, key)
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": list(key), "jars": local}, indent=1))
    tmp.replace(entry)


def _local(jar: str) -> str:
    return urlparse(jar).path if jar.startswith("file:") else jar
