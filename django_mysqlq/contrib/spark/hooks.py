"""A test hook: stop a pipeline job at a named step, so a test can kill it there.

With ``MYSQLQ_PIPELINE_PAUSE_AT=<step>`` in the environment, the job writes the file
named by ``MYSQLQ_PIPELINE_PAUSE_FILE`` the first time it reaches that step, then
sleeps until it is killed. Without it, :func:`checkpoint` does nothing.
"""

from __future__ import annotations

import os
import time

PAUSE_AT = "MYSQLQ_PIPELINE_PAUSE_AT"
PAUSE_FILE = "MYSQLQ_PIPELINE_PAUSE_FILE"

_reached: set[str] = set()


def checkpoint(step: str) -> None:
    """Pause here for good if the environment asks for ``step`` (tests only)."""
    if os.environ.get(PAUSE_AT) != step or step in _reached:
        return
    _reached.add(step)
    marker = os.environ.get(PAUSE_FILE)
    if marker:
        with open(marker, "w") as file:
            file.write(f"{os.getpid()} {step}\n")
    while True:
        time.sleep(3600)
