"""The merge job's resolved jars: remembered per packages, reused only while all are on disk."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_vitess.merge.jar_cache import cached_jars, remember_jars

KEY = ("io.delta:delta-spark_2.13:4.4.0", None, None)


def _jars(tmp_path: Path, *names: str) -> list[str]:
    out = []
    for name in names:
        (tmp_path / name).write_bytes(b"PK")
        out.append(f"file://{tmp_path / name}")
    return out


def test_jars_are_reused_for_the_same_packages_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    jars = _jars(tmp_path, "a.jar", "b.jar")
    assert cached_jars(cache, KEY) is None
    remember_jars(cache, KEY, jars)
    assert cached_jars(cache, KEY) == jars
    assert (
        cached_jars(cache, ("io.delta:delta-spark_2.13:4.4.0,org.apache.hadoop:hadoop-aws:3.5.0", None, None))
        is None
    )
    assert cached_jars(cache, (*KEY[:2], "org.slf4j:slf4j-api")) is None


def test_a_jar_gone_from_disk_means_resolving_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    jars = _jars(tmp_path, "a.jar", "b.jar")
    remember_jars(cache, KEY, jars)
    (tmp_path / "b.jar").unlink()
    assert cached_jars(cache, KEY) is None


def test_paths_that_are_not_local_files_are_not_remembered(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    remember_jars(cache, KEY, ["hdfs:///jars/a.jar"])
    remember_jars(cache, KEY, [])
    assert cached_jars(cache, KEY) is None


def test_a_damaged_entry_means_resolving_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    remember_jars(cache, KEY, _jars(tmp_path, "a.jar"))
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    assert cached_jars(cache, KEY) is None
