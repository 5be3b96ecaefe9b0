"""The local spark-submit's class-data archive: written once by a real JVM, mapped after, never
put in place damaged, and added to the driver's options only where they are the provider's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_vitess.merge import class_archive
from airflow_provider_vitess.merge.spark_conf import DRIVER_JAVA_OPTIONS, QUICK_JIT

JAVA = class_archive.java_executable(dict(os.environ))
pytestmark = pytest.mark.skipif(JAVA is None, reason="no java on PATH (make installs Java 17)")
KEY = (None, "io.delta:delta-spark_2.13:4.4.0", None, None, None)


def _run_jvm(use: class_archive.ArchiveUse) -> str:
    """A JVM started with the use's options, as the driver's is (``-version``: it loads classes,
    and with ``ArchiveClassesAtExit`` writes them as it exits); its output."""
    assert JAVA is not None
    done = subprocess.run([JAVA, *use.option.split(), "-version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_first_jvm_writes_the_archive_and_the_next_maps_it(tmp_path: Path) -> None:
    assert JAVA is not None
    first = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert first.writing is not None
    # Quiet: writing a merge's classes, the JVM warned of ~1,400 it left out, into the task log.
    assert first.option == f"-XX:ArchiveClassesAtExit={first.writing} -Xlog:cds*=off"
    _run_jvm(first)
    assert first.writing.stat().st_size > 0
    class_archive.settle(first, failed=False)
    assert first.path.is_file() and not first.writing.exists()
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]

    later = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert later.writing is None and later.option == f"-XX:SharedArchiveFile={first.path}"
    _run_jvm(later)  # maps it
    class_archive.settle(later, failed=True)  # a failed submit: the archive still maps, it stays
    assert first.path.is_file()


def test_other_jars_or_another_java_get_an_archive_of_their_own(tmp_path: Path) -> None:
    assert JAVA is not None
    delta = class_archive.archive_for(tmp_path, KEY, JAVA)
    s3 = (KEY[0], f"{KEY[1]},org.apache.hadoop:hadoop-aws:3.4.1", *KEY[2:])
    with_s3 = class_archive.archive_for(tmp_path, s3, JAVA)
    assert delta.path != with_s3.path
    assert delta.path == class_archive.archive_for(tmp_path, KEY, JAVA).path
    newer = tmp_path / "jdk" / "bin" / "java"  # an upgraded JDK: same path, new file
    newer.parent.mkdir(parents=True)
    newer.write_text("#!/bin/sh\n")
    before = class_archive.archive_for(tmp_path, KEY, str(newer)).path
    os.utime(newer, (time.time() + 60, time.time() + 60))
    assert class_archive.archive_for(tmp_path, KEY, str(newer)).path != before


def test_a_damaged_archive_is_never_put_in_place_and_one_that_broke_is_removed(tmp_path: Path) -> None:
    """A JVM aborts on a damaged archive (checked here on the real JVM), so one written in part
    (a JVM killed as it wrote it) is removed, not renamed; and a mapped one that no longer loads
    is removed after a failed submit, so the next submit writes it again."""
    assert JAVA is not None
    good = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert good.writing is not None
    _run_jvm(good)
    whole = good.writing.read_bytes()
    part = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert part.writing is not None
    part.writing.write_bytes(whole[: len(whole) // 2])
    aborted = subprocess.run(
        [JAVA, f"-XX:SharedArchiveFile={part.writing}", *class_archive.QUIET_ABORT, "-version"],
        capture_output=True,
    )
    assert aborted.returncode != 0  # the premise: the JVM does not start with it
    class_archive.settle(part, failed=False)
    assert not part.path.exists() and not part.writing.exists()

    class_archive.settle(good, failed=False)
    assert good.path.is_file()
    good.path.write_bytes(whole[: len(whole) // 2])  # broken in place since
    mapped = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert mapped.writing is None
    class_archive.settle(mapped, failed=False)  # a submit that worked: not checked, kept
    assert good.path.exists()
    class_archive.settle(mapped, failed=True)
    assert not good.path.exists()
    assert class_archive.archive_for(tmp_path, KEY, JAVA).writing is not None  # written again


def _aged(path: Path, seconds: float) -> Path:
    path.write_bytes(b"part")
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_an_archive_left_by_a_killed_submit_or_unused_for_weeks_is_removed_by_a_later_one(
    tmp_path: Path,
) -> None:
    assert JAVA is not None
    left = _aged(tmp_path / "0123.abandoned.writing", class_archive.ABANDONED_SECONDS + 60)
    fresh = _aged(tmp_path / "0123.being-written.writing", 0)
    unused = _aged(tmp_path / "4567.jsa", class_archive.UNUSED_SECONDS + 60)
    recent = _aged(tmp_path / "89ab.jsa", class_archive.UNUSED_SECONDS - 3600)
    class_archive.archive_for(tmp_path, KEY, JAVA)  # a new key: this submit writes its archive
    assert not left.exists() and fresh.exists()
    assert not unused.exists() and recent.exists()


def test_mapping_an_archive_marks_it_used(tmp_path: Path) -> None:
    assert JAVA is not None
    written = class_archive.archive_for(tmp_path, KEY, JAVA)
    old = _aged(written.path, class_archive.UNUSED_SECONDS + 60)
    use = class_archive.archive_for(tmp_path, KEY, JAVA)
    assert use.writing is None and use.path == old
    assert time.time() - old.stat().st_mtime < 60  # a submit of another key now keeps it
    other = class_archive.archive_for(tmp_path, (*KEY[:-1], "other.jar"), JAVA)
    assert other.writing is not None and old.exists()


def _local_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, conf: dict[str, str] | None
) -> dict[str, Any]:
    """The hook arguments the operator's backend builds for a local master, the archive added."""
    from airflow_provider_vitess.merge.plan import MergePlan, TableTarget, WindowToMerge
    from airflow_provider_vitess.operators.merge import VitessMergeOperator
    from airflow_provider_vitess.operators.merge_backends import SparkSubmitMerge

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = VitessMergeOperator(
        task_id="merge",
        sync_id="s",
        target_location=str(tmp_path / "delta"),
        conn_id="spark_x",
        jars_cache_dir=str(tmp_path / "jars"),
        conf=conf,
    )
    backend = op._make_backend()
    assert isinstance(backend, SparkSubmitMerge)
    plan = MergePlan(
        "s",
        (WindowToMerge(1, str(tmp_path / "staging" / "s" / "window=0000000001" / "_manifest.json")),),
        {"t": TableTarget("t", str(tmp_path / "delta" / "t"), ("id",), ("id",))},
    )
    job = backend.job(plan, tmp_path / "plan.json", tmp_path / "report.json")
    return {"job": job, "use": backend._class_archive(job)}


def test_the_operators_local_submit_takes_the_archive_unless_the_user_sets_jvm_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ours = _local_job(monkeypatch, tmp_path, None)
    use = ours["use"]
    assert use is not None and use.path.parent == tmp_path / "jars" / "class-archives"
    assert ours["job"]["conf"][DRIVER_JAVA_OPTIONS] == f"{QUICK_JIT} {use.option}"
    theirs = _local_job(monkeypatch, tmp_path, {DRIVER_JAVA_OPTIONS: "-Xss4m"})
    assert theirs["use"] is None
    assert theirs["job"]["conf"][DRIVER_JAVA_OPTIONS] == "-Xss4m"


def test_a_cache_path_with_a_space_gets_no_archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Spark splits ``spark.driver.extraJavaOptions`` at whitespace: such a path would reach the JVM
    as two options, so the submit runs without an archive."""
    spaced = tmp_path / "a home"
    spaced.mkdir()
    job = _local_job(monkeypatch, spaced, None)
    assert job["use"] is None
    assert job["job"]["conf"][DRIVER_JAVA_OPTIONS] == QUICK_JIT


def test_no_archive_is_written_where_a_conf_dir_is_on_the_class_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A JVM writing an archive with a non-empty directory on its class path runs the job, then
    fails as it exits (on the real spark-submit: the README DAG of
    tests/integration/dags/test_s3_sync.py, whose SPARK_CONF_DIR holds spark-defaults.conf): a conf
    dir that spark-class puts there means no archive."""
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    assert class_archive.writing_refused({"SPARK_CONF_DIR": str(conf_dir)}, {}, None) is None  # empty
    (conf_dir / "spark-defaults.conf").write_text("spark.jars.ivy /tmp/ivy\n")
    refused = class_archive.writing_refused({"SPARK_CONF_DIR": str(conf_dir)}, {}, None)
    assert refused is not None and "non-empty directory" in refused
    home = tmp_path / "spark"
    assert class_archive.writing_refused({}, {}, str(home)) is None  # <spark_home>/conf: not there
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "log4j2.properties").write_text("")
    assert class_archive.writing_refused({}, {}, str(home))
    assert class_archive.writing_refused({"HADOOP_CONF_DIR": str(conf_dir)}, {}, None)
    assert class_archive.writing_refused({"SPARK_DIST_CLASSPATH": "/opt/hadoop/etc"}, {}, None)
    assert class_archive.writing_refused({}, {"spark.driver.extraClassPath": "/opt/x"}, None)
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert _local_job(monkeypatch, tmp_path, None)["use"] is None
