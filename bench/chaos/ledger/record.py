"""Ledger writes from inside tasks that ride out lost connections and server restarts.

A write retried after its connection died may have landed already: the unique
``(run, edge)`` key and ``INSERT IGNORE`` make the retry harmless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import uuid

from django.db import DatabaseError, InterfaceError, OperationalError, connections, models

from .models import Edge, Execution

#: The connection alias ledger rows are written on (never the task's transaction).
LEDGER = "ledger"
#: How long one ledger write keeps retrying: longer than a server restart.
PATIENCE_SECONDS = 90.0

_current = threading.local()


def remember(message_id: int, attempt: int) -> None:
    """Note which message this thread is about to run (from the ``task_started`` signal)."""
    _current.message = (message_id, attempt)


def current() -> tuple[int, int]:
    """``(message id, attempt)`` this thread runs, as :func:`remember` noted it."""
    message: tuple[int, int] = getattr(_current, "message", (0, 0))
    return message


@dataclasses.dataclass(frozen=True)
class Run:
    run: str
    token: str
    kind: str
    message_id: int
    attempt: int


def write(row: models.Model) -> None:
    """Insert ``row`` on the ledger connection, retrying through outages (its unique run
    key makes a retry of a write that landed harmless)."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    delay = 0.05
    while True:
        try:
            type(row)._default_manager.using(LEDGER).bulk_create([row], ignore_conflicts=True)
            return
        except (OperationalError, InterfaceError):
            with contextlib.suppress(DatabaseError):
                connections[LEDGER].close()
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _row(run: Run, edge: str) -> Execution:
    return Execution(run=run.run, edge=edge, token=run.token, message_id=run.message_id,
                     attempt=run.attempt, kind=run.kind, pid=os.getpid(),
                     thread=threading.current_thread().name[:100], at=time.time())


def start(token: str, kind: str) -> Run:
    message_id, attempt = current()
    run = Run(uuid.uuid4().hex, token, kind, message_id, attempt)
    write(_row(run, Edge.START))
    return run


def end(run: Run) -> None:
    write(_row(run, Edge.END))
