"""The pipeline stays optional: nothing of the app imports pyspark, and the command says
what to install where it is missing."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT

CHECK = """
import sys
import django
django.setup()
import django_mysqlq, django_mysqlq.admin, django_mysqlq.ops
from django_mysqlq.worker import loop, supervisor
from django.contrib import admin
admin.autodiscover()
from django.core.management import get_commands, load_command_class
for name in ("runqueueworker", "queuestats", "queuepipeline"):
    load_command_class(get_commands()[name], name)
from django.test import Client
from django.contrib.auth.models import User
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("pyspark", "py4j"))
assert not loaded, loaded
print("no pyspark")
"""

MISSING = """
import sys
sys.modules["pyspark"] = None  # as if it were not installed
import django
django.setup()
from django.core.management import call_command, CommandError
try:
    call_command("queuepipeline", "report", "--output", "/nonexistent/x")
except CommandError as exc:
    print(exc)
"""


def _run(code: str, **environ: str) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **environ}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_app_the_admin_and_the_worker_never_import_pyspark():
    assert "no pyspark" in _run(CHECK)


def test_without_pyspark_the_command_says_what_to_install():
    out = _run(MISSING)
    assert 'pip install "django-mysqlq[spark]"' in out and "Java 17" in out


NO_JAVA = """
import django
django.setup()
from django.core.management import call_command, CommandError
try:
    call_command("queuepipeline", "report", "--output", "/nonexistent/x")
except CommandError as exc:
    print(exc)
from pyspark import SparkContext
print("gateway:", SparkContext._gateway)
"""


def test_without_java_the_command_says_what_to_install_and_starts_no_jvm(tmp_path):
    import pytest

    pytest.importorskip("pyspark")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _run(NO_JAVA, PATH=str(empty), JAVA_HOME="")
    assert "needs a Java 17+ runtime" in out and "no java on the PATH" in out
    assert "apt-get install openjdk-17-jre-headless" in out and "JAVA_HOME" in out
    assert "gateway: None" in out
    out = _run(NO_JAVA, PATH=str(empty), JAVA_HOME=str(empty))
    assert f"JAVA_HOME is {empty}, but {empty}/bin/java is not there" in out
    assert "openjdk-17-jre-headless" in out and "gateway: None" in out


def test_a_java_older_than_pyspark_needs_is_refused_before_spark_starts(tmp_path):
    import pytest

    pytest.importorskip("pyspark")
    from django_mysqlq.contrib.spark import java
    from django_mysqlq.contrib.spark.errors import PipelineError

    old = tmp_path / "bin" / "java"
    old.parent.mkdir()
    old.write_text('#!/bin/sh\necho \'java version "1.8.0_351"\' >&2\n')
    old.chmod(0o755)
    assert java.version_of(str(old)) == 8
    with pytest.raises(PipelineError, match=r"is Java 8; this PySpark needs Java 17 or later"):
        java.check({"JAVA_HOME": str(tmp_path)})
    with pytest.raises(PipelineError, match="is Java 8"):
        java.check({"PATH": str(old.parent)})
    new = tmp_path / "new" / "java"
    new.parent.mkdir()
    new.write_text('#!/bin/sh\necho \'openjdk version "21.0.2" 2024-01-16\' >&2\n')
    new.chmod(0o755)
    assert java.check({"PATH": str(new.parent)}) == str(new)
