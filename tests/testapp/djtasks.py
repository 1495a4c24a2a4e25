"""Django ``@task`` functions run by tests/test_tasks_backend.py through MySQLQueueBackend.

Worker subprocesses import this module through MYSQLQ['TASK_MODULES'] (tests/settings.py).
"""

import asyncio
import os
import sys
import threading
import time

from asgiref.sync import sync_to_async

from django_mysqlq.backend.compat import task_finished, task_started
from django_mysqlq.backend.core import MySQLQueueBackend

from . import djmodule  # noqa: F401 - workers load its tasks through this module
from .djjobs import job  # noqa: F401 - and this task
from .models import Ledger

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def add(a, b):
    Ledger.objects.create(label=f"add:{a}+{b}", value=a + b, pid=os.getpid())
    return a + b


@task()
def record(label, value=None):
    Ledger.objects.create(label=label, value=value, pid=os.getpid())
    return {"label": label, "pair": (1, 2)}  # a tuple comes back as a list (JSON)


def _renamed(label):
    Ledger.objects.create(label=label, pid=os.getpid())


#: A task bound to another name than its function's: a worker looks it up at
#: ``tests.testapp.djtasks._renamed`` and finds the plain function (test_tasks_backend).
renamed = task(_renamed)


@task(takes_context=True)
def flaky(context, label, succeed_on):
    """Fails until attempt ``succeed_on``; reports what its context said."""
    result = context.task_result
    Ledger.objects.create(label=f"{label}:attempt", value=context.attempt, pid=os.getpid())
    if context.attempt < succeed_on:
        raise RuntimeError(f"{label} failed on attempt {context.attempt}")
    return {
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "worker_ids": result.worker_ids,
        "errors": [error.exception_class_path for error in result.errors],
        "started_at": result.started_at.isoformat(),
        "last_attempted_at": result.last_attempted_at.isoformat(),
        "args": result.args,
        "backend": result.backend,
        "queue_name": result.task.queue_name,
    }


@task
def always_fails(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    raise ValueError(f"boom {label}")


@task(max_attempts=1)
def fails_once(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    raise KeyError(label)


@task(max_attempts=2, retry_backoff=0)
def two_tries(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    raise ValueError(label)


@task
def sleepy(label, seconds):
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(seconds)
    Ledger.objects.create(label=f"{label}:end", pid=os.getpid())


def _record_thread(label):
    """Records which thread ran the ORM call (it should be the worker's task thread)."""
    Ledger.objects.create(label=f"{label}:{threading.current_thread().name}", pid=os.getpid())


@task
async def async_echo(label):
    await asyncio.sleep(0)
    await sync_to_async(_record_thread)(label)
    return label


@task(takes_context=True)
async def async_with_context(context, label, *, times=1):
    await asyncio.sleep(0)
    return {"attempt": context.attempt, "id": context.task_result.id, "label": label * times}


@task(max_attempts=1)
def exits(label):
    """sys.exit() in a task fails that task, not the worker that runs it."""
    Ledger.objects.create(label=label, pid=os.getpid())
    raise SystemExit(f"{label} called sys.exit")


@task
def returns_nothing(label):
    Ledger.objects.create(label=label, pid=os.getpid())


@task(max_attempts=1)
def nested_error(label):
    raise ValueError(ValueError(f"{label} inner"))


@task
def returns_non_json(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    return object()


@task(queue_name="other")
def on_other_queue(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    return label


@task(takes_context=True)
def reads_results(context, label):
    """Its own result's status and that of the task whose id the Ledger row ``label`` holds
    (enqueued after it, in the same transaction): tests/test_tasks_backend_expectations.py."""
    backend = context.task_result.task.get_backend()
    other = Ledger.objects.get(label=label).value
    return {"own": str(backend.get_result(context.task_result.id).status),
            "other": str(backend.get_result(str(other)).status)}


@task(backend="immediate")
def immediate_only(label):
    """A task of another backend: the queue must never run it."""
    Ledger.objects.create(label=label, pid=os.getpid())


@task(timeout=30)
def timed(value):
    return value


@task(timeout=1, max_attempts=2, retry_backoff=0)
def overruns(label):
    """Sleeps well past its 1 s timeout: a ``--processes`` child fails it and exits."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(60)


def plain_function(label):
    """Not a task: the queue must never call it."""
    Ledger.objects.create(label=label, pid=os.getpid())


alias_of_add = add  # another name for add: not add's own module path


def _record_signal(kind, task_result, **kwargs):
    if task_result.task.module_path.endswith((".flaky", ".always_fails", ".add", ".overruns")):
        handled = sys.exc_info()[0]
        Ledger.objects.create(
            label=f"signal:{kind}:{task_result.id}:{task_result.status}:"
                  f"{handled.__name__ if handled else '-'}",
            value=task_result.attempts, pid=os.getpid())


def _started(sender, task_result, **kwargs):
    _record_signal("started", task_result)


def _finished(sender, task_result, **kwargs):
    _record_signal("finished", task_result)


task_started.connect(_started, sender=MySQLQueueBackend, dispatch_uid="tests.djtasks.started")
task_finished.connect(_finished, sender=MySQLQueueBackend, dispatch_uid="tests.djtasks.finished")


#: What ``returns_unstorable`` returns: each normalizes (Django accepts it) but history
#: can't keep it as it is (tests/test_tasks_backend_expectations.py).
UNSTORABLE = {
    "nan": lambda: {"ratio": float("nan")},
    "int_key": lambda: {1: "one"},
    "surrogate": lambda: ["\ud800"],
    "huge_int": lambda: [10**400],
}


@task
def returns_unstorable(kind):
    return UNSTORABLE[kind]()
