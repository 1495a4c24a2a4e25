"""The local driver JVM's class archive: written once, mapped after, and never a cause of
failure (a corrupt file, a killed writer, an unwritable directory, turned off)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import override_settings

from django_mysqlq.contrib.spark import classarchive

ROOT = Path(__file__).resolve().parents[2]

#: A session in a process of its own (the archive is written as that process ends): says
#: which files of the cache directory its JVM has mapped, then stays alive when told to.
SCRIPT = """
import json, sys, time, django
django.setup()
from django_mysqlq.contrib.spark import build_session
spark = build_session("local[1]", {"spark.ui.enabled": "false"})
assert spark.range(1000).count() == 1000
pid = spark._jvm.java.lang.ProcessHandle.current().pid()
with open(f"/proc/{pid}/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})
print(json.dumps({"options": spark.sparkContext.getConf().get(
    "spark.driver.extraJavaOptions"), "mapped": mapped}), flush=True)
if sys.argv[1:] == ["stay"]:
    time.sleep(600)
"""


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache)}


def _session(cache: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=_env(cache),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return _ours(json.loads(done.stdout.strip().splitlines()[-1]), cache)


def _ours(found: dict[str, object], cache: Path) -> dict[str, object]:
    """Only the files of the cache directory (the JDK's base archive is mapped too)."""
    mapped = found["mapped"]
    assert isinstance(mapped, list)
    return {**found, "mapped": [path for path in mapped if path.startswith(str(cache))]}


def _archives(cache: Path) -> list[Path]:
    return sorted((cache / "django-mysqlq").glob("spark-classes-*"))


@pytest.mark.spark
def test_the_first_session_writes_the_archive_and_the_next_maps_it_a_corrupt_one_is_ignored(
        tmp_path: Path):
    pytest.importorskip("pyspark")
    first = _session(tmp_path)
    assert "-XX:ArchiveClassesAtExit=" in str(first["options"])
    [archive] = _archives(tmp_path)
    assert archive.suffix == ".jsa" and archive.stat().st_size > 1_000_000

    second = _session(tmp_path)
    assert f"-XX:SharedArchiveFile={archive}" in str(second["options"])
    assert second["mapped"] == [str(archive)], "the JVM did not map the archive"

    archive.chmod(0o644)
    archive.write_bytes(b"not a class archive" * 1000)
    third = _session(tmp_path)  # the JVM checks the file and runs without it
    assert third["mapped"] == []
    assert _archives(tmp_path) == [archive]


@pytest.mark.spark
def test_a_writer_killed_leaves_no_archive_where_a_later_session_would_map_it(tmp_path: Path):
    pytest.importorskip("pyspark")
    with subprocess.Popen([sys.executable, "-c", SCRIPT, "stay"], cwd=ROOT,
                          env=_env(tmp_path), stdout=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            json.loads(proc.stdout.readline())
            os.kill(proc.pid, signal.SIGKILL)  # Python only: its JVM sees stdin end
            proc.wait(timeout=30)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and _jvm_alive(proc.pid):
                time.sleep(0.5)
        finally:
            if _jvm_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
    assert all(path.name.endswith(".part") for path in _archives(tmp_path))
    later = _session(tmp_path)
    assert later["mapped"] == [] and "-XX:ArchiveClassesAtExit=" in str(later["options"])
    assert [p.suffix for p in _archives(tmp_path) if not p.name.endswith(".part")] == [".jsa"]


def _jvm_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_plan_turned_off_unwritable_given_a_path_and_stale_parts_removed(
        tmp_path: Path, monkeypatch):
    pytest.importorskip("pyspark")
    assert classarchive.plan("", "/usr/bin/java", "") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    auto = classarchive.plan("auto", "/usr/bin/java", "/usr/share/java/x.jar")
    assert auto is not None and auto.path.parent == tmp_path / "cache" / "django-mysqlq"
    assert auto.part is not None and auto.part.name.endswith(f".{os.getpid()}.part")
    other = classarchive.plan("auto", "/usr/bin/java", "")
    assert other is not None and other.path != auto.path  # another jar set, another file

    given = tmp_path / "mine.jsa"
    given.write_bytes(b"x")
    mapped = classarchive.plan(str(given), "/usr/bin/java", "")
    assert mapped == classarchive.ClassArchive(given, None)
    assert mapped.java_options.startswith(f"-XX:SharedArchiveFile={given} ")

    stale = given.with_name("new.jsa.123.part")
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * classarchive.STALE_SECONDS,) * 2)
    classarchive.plan(str(given.with_name("new.jsa")), "/usr/bin/java", "")
    assert not stale.exists()

    blocker = tmp_path / "a-file"  # its "directory" can't be made: no archive, no error
    blocker.write_bytes(b"")
    assert classarchive.plan(str(blocker / "a.jsa"), "/usr/bin/java", "") is None


def test_the_session_gets_the_archive_option_only_for_a_local_driver_with_its_own_options(
        tmp_path: Path):
    pytest.importorskip("pyspark")
    from django.conf import settings

    from django_mysqlq.contrib.spark.session import session_conf

    path = tmp_path / "a.jsa"
    with override_settings(MYSQLQ={**settings.MYSQLQ, "SPARK_CLASS_ARCHIVE": str(path)}):
        assert f"-XX:ArchiveClassesAtExit={path}." in session_conf("local[*]")[
            "spark.driver.extraJavaOptions"]
        assert "Archive" not in session_conf("yarn")["spark.driver.extraJavaOptions"]
        assert session_conf("local[2]", {"spark.driver.extraJavaOptions": "-Xmx1g"})[
            "spark.driver.extraJavaOptions"] == "-Xmx1g"
    with override_settings(MYSQLQ={**settings.MYSQLQ, "SPARK_CLASS_ARCHIVE": ""}):
        assert "Archive" not in session_conf("local[*]")["spark.driver.extraJavaOptions"]
