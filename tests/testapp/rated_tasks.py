"""Rate-limited tasks for tests/test_rate_limits*.py: each run writes its start to
:class:`GateRun` (label, key, seq), from which the starts per window are counted."""

import os
import threading
import time

from django_mysqlq import queue_task

from .models import GateRun


def _start(label: str, key: str, seq: int) -> None:
    GateRun.objects.create(label=label, key=key, seq=seq, edge="start", at=time.time(),
                           pid=os.getpid(), thread=threading.current_thread().name)


@queue_task(rate_limit="100/m", max_attempts=5, retry_backoff=0.05)
def per_minute(seq: int, label: str, sleep_ms: int = 0, fail: bool = False) -> int:
    _start(label, "per_minute", seq)
    time.sleep(sleep_ms / 1000)
    if fail:
        raise RuntimeError(f"per_minute #{seq} fails")
    return seq


@queue_task(rate_limit="10/s", rate_limit_key="account", max_attempts=5, retry_backoff=0.05)
def per_account(account: str, seq: int, label: str, sleep_ms: int = 0) -> int:
    _start(label, account, seq)
    time.sleep(sleep_ms / 1000)
    return seq


@queue_task()
def unlimited(seq: int, label: str) -> int:
    _start(label, "unlimited", seq)
    return seq
