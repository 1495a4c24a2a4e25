"""Unique tasks for tests/test_unique_jobs.py: each run writes its start and end to
:class:`GateRun` (label, key), so a test sees how often a key really ran."""

import os
import threading
import time

from django_mysqlq import queue_task

from .models import GateRun

#: Seconds a key of ``unique_step`` stays taken after a success.
PERIOD = 3


def _edge(label: str, key: str, seq: int, edge: str, outcome: str = "") -> None:
    GateRun.objects.create(label=label, key=key, seq=seq, edge=edge, outcome=outcome,
                           at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)


@queue_task(unique_for=PERIOD, max_attempts=2, retry_backoff=0.05)
def unique_step(key: str, seq: int, label: str, fail: bool = False,
                sleep_ms: int = 0) -> int:
    _edge(label, key, seq, "start")
    time.sleep(sleep_ms / 1000)
    if fail:
        _edge(label, key, seq, "end", "failed")
        raise RuntimeError(f"{key}#{seq} fails")
    _edge(label, key, seq, "end", "ok")
    return seq


@queue_task(unique_for=0)
def unique_while_queued(key: str, extra: int = 0) -> str:
    return key
