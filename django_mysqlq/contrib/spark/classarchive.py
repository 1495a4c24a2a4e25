"""A class-data-sharing (CDS) archive for the local driver JVM.

A local session's JVM loads and verifies some 15,000 of Spark's classes before it runs
anything: on 2 cores that is most of a session's 6 s start and of its first job's 3 s.
Java 13+ can write the classes a run loaded to an archive at exit
(``-XX:ArchiveClassesAtExit``) and map them in later runs (``-XX:SharedArchiveFile``):
measured here, start 6.2 -> 2.9 s and first job 3.0 -> 1.1 s (docs/performance.md).

The first local session of a given Java, PySpark and jar set writes the archive when its
process ends (a few seconds, once); later ones map it. The JVM writes to a file named
after its process, and only a JVM that ended cleanly has its file renamed into place, so
two first runs side by side, or a killed one, never leave a half-written archive where a
later run would map it. A stale or mismatched archive costs nothing but the speed-up:
the JVM checks it and runs without it (its CDS log lines are turned off).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("django_mysqlq.pipeline")

#: ``MYSQLQ["SPARK_CLASS_ARCHIVE"]``: the cache directory's file.
AUTO = "auto"
#: The JVM's CDS log (mismatch warnings, classes it skips while dumping) stays quiet.
QUIET = "-Xlog:cds=off,cds+dynamic=off"
#: How long the end of a process waits for its JVM to write the archive.
DUMP_SECONDS = 120.0
#: Files left by writers that never finished (killed) are removed after this long.
STALE_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True)
class ClassArchive:
    """Where the archive is, and whether this session writes it (``part``) or maps it."""

    path: Path
    part: Path | None

    @property
    def java_options(self) -> str:
        if self.part is None:
            return f"-XX:SharedArchiveFile={self.path} {QUIET}"
        return f"-XX:ArchiveClassesAtExit={self.part} {QUIET}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "django-mysqlq"


def _stamp(path: str) -> list[Any]:
    try:
        stat = os.stat(path)
    except OSError:
        return [path, None]
    return [os.path.realpath(path), stat.st_size, stat.st_mtime_ns]


def archive_key(java: str, jars: str) -> str:
    """What the archive depends on: the JVM, PySpark's jars, the extra jars."""
    import pyspark

    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    parts = [_stamp(java), pyspark.__version__, spark_home,
             [_stamp(jar) for jar in jars.split(",") if jar and "://" not in jar]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def plan(setting: str, java: str, jars: str) -> ClassArchive | None:
    """The archive this local session maps, or writes when there is none yet; None when
    the setting is ``""`` or the directory can't be written (the session runs without)."""
    if not setting:
        return None
    if setting == AUTO:
        path = cache_dir() / f"spark-classes-{archive_key(java, jars)}.jsa"
    else:
        path = Path(setting).expanduser()
    if path.is_file():
        return ClassArchive(path, None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logger.info("No Spark class archive (%s): sessions start without one.", exc)
        return None
    if not os.access(path.parent, os.W_OK):
        return None
    _remove_stale_parts(path)
    return ClassArchive(path, path.with_name(f"{path.name}.{os.getpid()}.part"))


def _remove_stale_parts(path: Path) -> None:
    now = time.time()
    for part in path.parent.glob(f"{path.name}.*.part"):
        try:
            if now - part.stat().st_mtime > STALE_SECONDS:
                part.unlink()
        except OSError:
            pass


def finish_at_exit(archive: ClassArchive, gateway: Any) -> None:
    """Once this process is done with Spark, end its JVM (which writes the archive as it
    exits) and move a complete archive into place."""
    proc = getattr(gateway, "proc", None)
    if archive.part is None or proc is None:
        return
    atexit.register(_finish, archive, proc)


def _finish(archive: ClassArchive, proc: subprocess.Popen[bytes]) -> None:
    part = archive.part
    assert part is not None
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway ends when its stdin does
        code = proc.wait(timeout=DUMP_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("The Spark JVM did not end in time to write its class archive (%s).", exc)
        return
    try:
        if code == 0 and part.is_file() and part.stat().st_size > 0 \
                and not archive.path.exists():
            os.replace(part, archive.path)
            logger.info("Wrote the Spark class archive %s: later sessions start faster.",
                        archive.path)
        else:
            part.unlink(missing_ok=True)
    except OSError as exc:
        logger.info("Could not keep the Spark class archive %s (%s).", archive.path, exc)
