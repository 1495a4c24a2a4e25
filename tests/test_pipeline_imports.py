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


def _run(code: str) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_app_the_admin_and_the_worker_never_import_pyspark():
    assert "no pyspark" in _run(CHECK)


def test_without_pyspark_the_command_says_what_to_install():
    out = _run(MISSING)
    assert 'pip install "django-mysqlq[spark]"' in out and "Java 17" in out
