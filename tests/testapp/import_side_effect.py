"""A module that must never be imported by a worker: importing it leaves a marker file.

tests/test_tasks_backend.py names it in a hand-made ``django.tasks:`` message.
"""

import os
from pathlib import Path

_marker = os.environ.get("MYSQLQ_TEST_IMPORT_MARKER")
if _marker:
    Path(_marker).write_text(f"imported by {os.getpid()}\n")


def run(*args, **kwargs):
    if _marker:
        Path(_marker).write_text("called\n")
