"""Tasks the test suite enqueues; worker subprocesses import them by autodiscovery."""

import os
import time

from django.db import connection

from django_mysqlq import queue_task

from .models import Ledger


@queue_task()
def record(label: str, value: int | None = None) -> int:
    Ledger.objects.create(label=label, value=value, pid=os.getpid())
    return value if value is not None else 0


@queue_task(max_attempts=3, retry_backoff=0.1)
def always_fails(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise ValueError(f"boom {label}")


@queue_task(max_attempts=3, retry_backoff=0.1)
def fails_until(label: str, succeed_on: int) -> str:
    Ledger.objects.create(label=label, pid=os.getpid())
    if Ledger.objects.filter(label=label).count() < succeed_on:
        raise RuntimeError("not yet")
    return "ok"


@queue_task()
def slow(label: str, seconds: float) -> None:
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(seconds)
    Ledger.objects.create(label=f"{label}:end", pid=os.getpid())


@queue_task(queue="other")
def on_other_queue(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())


@queue_task()
def closes_connection(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    connection.close()


@queue_task()
async def async_record(label: str) -> str:
    from asgiref.sync import sync_to_async

    await sync_to_async(Ledger.objects.create)(label=label, pid=os.getpid())
    return label


@queue_task(timeout=0.2)
def overruns(label: str) -> None:
    time.sleep(0.8)
    Ledger.objects.create(label=label, pid=os.getpid())


@queue_task(atomic=True)
def atomic_record(label: str) -> str:
    Ledger.objects.create(label=label, pid=os.getpid())
    return label


@queue_task(atomic=True, max_attempts=2, retry_backoff=0)
def atomic_fails_after_write(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise RuntimeError("after the write")


@queue_task(timeout=0.3, max_attempts=2, retry_backoff=0)
def hangs(label: str) -> None:
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(60)


@queue_task(max_attempts=1)
def stress_step(token: str, sleep_ms: int) -> None:
    """Records its start and end, so overlapping executions of one message would show."""
    Ledger.objects.create(label=f"{token}:start", pid=os.getpid())
    time.sleep(sleep_ms / 1000)
    Ledger.objects.create(label=f"{token}:end", pid=os.getpid())
