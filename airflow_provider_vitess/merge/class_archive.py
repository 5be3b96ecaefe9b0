"""A class-data archive for the merge job's local spark-submit: its JVM maps Spark's classes.

A spark-submit on a local master starts a JVM for one window, and a fresh JVM loads and
verifies the classes of Spark, Delta and their libraries before the job does anything: seconds
of each small window's merge. The JDK's class-data sharing (CDS) keeps those classes, parsed and
verified, in an archive the next JVM maps instead. The first local submit of a set of jars
writes one (``-XX:ArchiveClassesAtExit``: the JVM writes it as it exits; once, ~200 MB on disk,
and that submit takes seconds longer, ~30 s for a snapshot's merge on 2 cores); later submits
map it (``-XX:SharedArchiveFile``): a small window's merge ~25% faster (bench_merge_latency.py).

An archive is keyed by the submit's jars or packages, ``SPARK_HOME`` when set, and the ``java``
that runs it (path and modification time: an upgraded JDK writes a new one); not by the
spark-submit binary, so a wrapper around the same Spark maps the same archive. A JVM whose
class path differs from the archive's maps none of it and runs as usual. A *damaged* archive,
though, aborts the JVM: so an archive is written under a name of its own, checked by a JVM that
maps it (``java -XX:SharedArchiveFile=... -version``, a fraction of a second), and only then
renamed into place, atomically (:func:`settle`); and after a spark-submit that failed before its
job reported, the archive it mapped is checked again and removed if it no longer maps.
Each use marks an archive used; one unused for two weeks (a new Spark, jar set or JDK makes a
new key) is removed when another is written.

Pure file and process I/O on the machine that runs spark-submit; no Airflow, no Spark.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SHARED_ARCHIVE = "-XX:SharedArchiveFile="
ARCHIVE_AT_EXIT = "-XX:ArchiveClassesAtExit="
# How long the check of a new archive may take (it maps the file and prints the version).
CHECK_SECONDS = 60.0
ABANDONED_SECONDS = 600.0
# An archive no submit has mapped for this long is removed when another is written: each is
# ~200 MB, and a new Spark, jar set or JDK makes a new key and leaves the old archive unused. A
# submit that still names a removed archive starts as usual, mapping nothing (the JVM's default
# -Xshare:auto), and writes it again next time.
UNUSED_SECONDS = 14 * 24 * 3600.0
# The JVM writing an archive warns of each class it leaves out (~1,400 lines in a merge task's log).
QUIET_DUMP = "-Xlog:cds*=off"
# The check's JVM aborts on a damaged archive: no crash report or core file left behind for it.
QUIET_ABORT = (f"-XX:ErrorFile={os.devnull}", "-XX:-CreateCoredumpOnCrash")


def java_executable(env: Mapping[str, str]) -> str | None:
    """The ``java`` spark-submit runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = env.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java", path=env.get("PATH"))


@dataclass(frozen=True)
class ArchiveUse:
    """What one submit does with the archive of its key: maps ``path`` (``writing`` None), or
    writes ``writing``, to be renamed ``path`` when a JVM maps it (:func:`settle`)."""

    path: Path
    writing: Path | None
    java: str

    @property
    def option(self) -> str:
        """The driver JVM's option for this use."""
        if self.writing is not None:
            return f"{ARCHIVE_AT_EXIT}{self.writing} {QUIET_DUMP}"
        return f"{SHARED_ARCHIVE}{self.path}"


def archive_for(cache_dir: Path, key: Sequence[str | None], java: str) -> ArchiveUse:
    """Map the archive of ``key`` (the submit's jars or packages) and ``java``, or write it."""
    real = os.path.realpath(java)
    try:
        stamp = str(int(os.stat(real).st_mtime))
    except OSError:
        stamp = ""
    digest = hashlib.sha256(json.dumps([*key, real, stamp]).encode()).hexdigest()[:24]
    path = cache_dir / f"{digest}.jsa"
    if path.is_file():
        _mark_used(path)
        return ArchiveUse(path, None, java)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache_dir)
    return ArchiveUse(path, cache_dir / f"{digest}.{uuid.uuid4().hex}.writing", java)


def settle(use: ArchiveUse, *, failed: bool) -> None:
    """After the submit: the archive it wrote renamed into place if a JVM maps it (a JVM writes
    it as it exits normally, so a job that reported and then a wrapper that failed leave a good
    one; a killed JVM leaves none or part of one), else removed. ``failed`` (the submit failed
    before its job reported, a JVM that did not start among the causes): the archive it mapped
    is checked again, and removed if it no longer maps, so it cannot fail every later submit."""
    if use.writing is None:
        if failed and use.path.is_file() and not _maps(use.java, use.path):
            use.path.unlink(missing_ok=True)
            log.warning("class-data archive %s no longer loads: removed", use.path)
        return
    try:
        if use.writing.is_file() and use.writing.stat().st_size > 0 and _maps(use.java, use.writing):
            use.writing.replace(use.path)
            log.info("class-data archive written for later submits: %s", use.path)
    finally:
        use.writing.unlink(missing_ok=True)


# What spark-launcher puts on the driver's class path besides Spark's jars (its buildClassPath):
# a JVM writing an archive runs the job, then fails at exit ("Error: non-empty directory") when
# one of these is a non-empty directory, and a merge that committed would be reported failed.
CLASS_PATH_DIRS = ("HADOOP_CONF_DIR", "YARN_CONF_DIR")
CLASS_PATH_SETTINGS = ("SPARK_DIST_CLASSPATH", "SPARK_PREPEND_CLASSES", "SPARK_TESTING")


def writing_refused(env: Mapping[str, str], conf: Mapping[str, str], spark_home: str | None) -> str | None:
    """Why a JVM could not write an archive for this driver (None: it can): a non-empty directory
    spark-class puts on its class path (the conf dir, ``SPARK_CONF_DIR`` else
    ``<spark_home>/conf``; ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR``), or class path settings that may
    name one (``SPARK_DIST_CLASSPATH``, ``spark.driver.extraClassPath``, Spark's own test ones)."""
    conf_dir = env.get("SPARK_CONF_DIR") or (f"{spark_home}/conf" if spark_home else None)
    dirs = [conf_dir, *(env.get(name) for name in CLASS_PATH_DIRS)]
    for found in dirs:
        if found and Path(found).is_dir() and any(Path(found).iterdir()):
            return f"{found} is a non-empty directory on the driver's class path"
    for name in CLASS_PATH_SETTINGS:
        if env.get(name):
            return f"{name} is set"
    if conf.get("spark.driver.extraClassPath"):
        return "spark.driver.extraClassPath is set"
    return None


def _mark_used(archive: Path) -> None:
    """Its modification time set to now: the last use :func:`_remove_stale` goes by (access
    times are not kept on many mounts)."""
    # A cache another user owns refuses it: the archive is still mapped, only aged sooner.
    with contextlib.suppress(OSError):
        os.utime(archive)


def _remove_stale(cache_dir: Path) -> None:
    """Archives being written by submits that were killed (a JVM writes its archive in the
    seconds before it exits, so one untouched for :data:`ABANDONED_SECONDS` is not being
    written), and archives no submit has mapped for :data:`UNUSED_SECONDS`."""
    now = time.time()
    for pattern, age in (("*.writing", ABANDONED_SECONDS), ("*.jsa", UNUSED_SECONDS)):
        for stale in cache_dir.glob(pattern):
            try:
                if now - stale.stat().st_mtime > age:
                    stale.unlink()
            except OSError:
                continue  # removed by another submit meanwhile


def _maps(java: str, archive: Path) -> bool:
    """Whether a JVM starts with ``archive`` (one of another class path starts, mapping none of
    it; a damaged one aborts)."""
    try:
        done = subprocess.run(
            [java, f"{SHARED_ARCHIVE}{archive}", *QUIET_ABORT, "-version"],
            capture_output=True,
            timeout=CHECK_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
