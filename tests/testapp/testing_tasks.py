"""Tasks for the test mode and ``django_mysqlq.testing`` tests (tests/test_immediate.py,
tests/test_testing_drain.py). They run in the test process, so no worker imports them."""

import asyncio

from django_mysqlq import queue_task

from .models import Ledger


@queue_task(max_attempts=3, retry_backoff=0)
def echo(label, *items, flag=None):
    """Writes a row; returns what it got, as the task saw it (tuples arrive as lists)."""
    Ledger.objects.create(label=label, pid=0)
    return {"items": list(items), "types": [type(item).__name__ for item in items],
            "flag": flag}


@queue_task(max_attempts=3, retry_backoff=0)
def breaks(label):
    Ledger.objects.create(label=label, pid=0)
    raise ValueError(f"broken {label}")


@queue_task(atomic=True)
def writes_then_breaks(label):
    Ledger.objects.create(label=label, pid=0)
    raise RuntimeError(f"rolled back {label}")


@queue_task(max_attempts=3, retry_backoff=0)
def breaks_until(label, good_on):
    """Fails until its ``good_on``-th run (counted by its rows)."""
    Ledger.objects.create(label=label, pid=0)
    if Ledger.objects.filter(label=label).count() < good_on:
        raise RuntimeError(f"{label} not yet")
    return "finally"


@queue_task
def returns_object(label):
    Ledger.objects.create(label=label, pid=0)
    return object()


@queue_task
async def async_echo(label):
    await asyncio.sleep(0)
    return label.upper()


@queue_task
def chain(label, remaining):
    """Enqueues the next link: a drain must run messages enqueued by the tasks it runs."""
    Ledger.objects.create(label=f"{label}:{remaining}", pid=0)
    if remaining:
        chain.enqueue(label, remaining - 1)


@queue_task
def keyword_only(*, account, dry_run=False):
    return account


@queue_task(queue="elsewhere")
def elsewhere(label):
    Ledger.objects.create(label=label, pid=0)
