"""A ``--processes`` child's final counts, sent to its supervisor on a pipe of its own.

The supervisor holds no database connection, and a child's exit status says only how it
ended (drained, recycled, a task past its timeout): what it did travels on this pipe.
Each child writes one line when it ends, whichever way it ends (a drain, ``--max-tasks``,
a task past its timeout, a second signal): JSON, a list of ``[database alias, figures]``
(``WorkerStats.as_dict()``) of its workers. A child killed outright (``kill -9``, the
out-of-memory killer) writes nothing: its counts are lost with it.

Runs in a dying process, maybe in a signal handler: takes no lock, writes once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from .stats import Figures

#: A child's report: each of its workers' database alias and figures.
Report = list[tuple[str, Figures]]

#: Longest report read back (a few hundred bytes a database).
MAX_REPORT_BYTES = 1 << 20

_fd: int | None = None
_source: Callable[[], Report] | None = None


def connect(fd: int, source: Callable[[], Report]) -> None:
    """In the child: ``source`` gives the figures to write on ``fd`` at its end."""
    global _fd, _source
    _fd, _source = fd, source


def send() -> None:
    """Write this process's report, once (nothing outside a supervisor's child)."""
    global _fd
    fd, _fd = _fd, None
    if fd is None or _source is None:
        return
    try:
        data = memoryview(json.dumps(_source()).encode() + b"\n")
        while data:
            data = data[os.write(fd, data):]
    except (OSError, ValueError, TypeError):  # the supervisor is gone: nobody to tell
        pass
    finally:
        os.close(fd)


def receive(fd: int) -> Report | None:
    """In the supervisor, once the child has ended: its report, or None if it sent none.
    Closes ``fd``."""
    chunks: list[bytes] = []
    try:
        os.set_blocking(fd, False)
        while sum(map(len, chunks)) < MAX_REPORT_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (BlockingIOError, OSError):
        pass
    finally:
        os.close(fd)
    lines = b"".join(chunks).splitlines()
    if not lines:
        return None
    try:
        found = json.loads(lines[0])
        return [(str(alias), {str(key): value for key, value in figures.items()
                              if isinstance(value, int | float)})
                for alias, figures in found]
    except (ValueError, TypeError, AttributeError):
        return None
