"""Tasks the test suite enqueues; worker subprocesses import them by autodiscovery."""

import functools
import os
import sys
import time

from django.db import connection

from django_mysqlq import queue_task
from django_mysqlq.signals import task_finished

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


@queue_task()
def slow_first_time(label: str, seconds: float) -> None:
    """Sleeps on its first run only: the re-run after a crash finishes at once."""
    first = not Ledger.objects.filter(label=f"{label}:start").exists()
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    if first:
        time.sleep(seconds)
    Ledger.objects.create(label=f"{label}:end", pid=os.getpid())


def wait_for_gate(gate: str, seconds: float) -> None:
    """Sleep until the file ``gate`` exists, ``seconds`` at most. A test holds a task
    running for as long as it needs, however loaded the machine, then ends it at once by
    creating the file (a file, not a row: it works with the database out of reach)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


@queue_task()
def slow_until_opened(label: str, gate: str, seconds: float = 60.0) -> None:
    """``slow`` until the file ``gate`` exists (``wait_for_gate``)."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    wait_for_gate(gate, seconds)
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


def _logged(func):  # a plain decorator: its wrapper is sync and returns the coroutine
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


@queue_task()
@_logged
async def wrapped_async_record(label: str) -> str:
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


async def _async_record(label: str) -> str:
    from asgiref.sync import sync_to_async

    await sync_to_async(Ledger.objects.create)(label=label, pid=os.getpid())
    return label


@queue_task(atomic=True, max_attempts=2, retry_backoff=0)
def atomic_returns_coroutine(label: str):
    # Plain to look at, async in what it returns: no declaration check can see it.
    Ledger.objects.create(label=f"{label}:sync", pid=os.getpid())
    return _async_record(label)


@queue_task(timeout=0.3, max_attempts=2, retry_backoff=0)
def hangs(label: str) -> None:
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(60)


@queue_task(timeout=1, max_attempts=2, retry_backoff=0)
def sleeps_past_timeout(label: str) -> None:
    """Sleeps well past its 1 s timeout: a ``--processes`` child fails it and exits
    (tests/test_supervisor.py); its ``task_finished`` is recorded (below)."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(60)


def _sleeper_finished(sender, message_id, attempt, outcome, error, **kwargs):
    """``task_finished`` of ``sleeps_past_timeout`` as a Ledger row: the outcome, the
    error and the exception being handled as the receiver runs (``-``: none)."""
    if getattr(sender, "name", None) != sleeps_past_timeout.name:
        return
    handled = sys.exc_info()[0]
    Ledger.objects.create(
        label=f"sleeper:finished:{message_id}:{outcome}:{type(error).__name__}:"
              f"{handled.__name__ if handled else '-'}",
        value=attempt, pid=os.getpid())


task_finished.connect(_sleeper_finished, dispatch_uid="tests.tasks.sleeper_finished")


@queue_task(max_attempts=1)
def stress_step(token: str, sleep_ms: int) -> None:
    """Records its start and end, so overlapping executions of one message would show."""
    Ledger.objects.create(label=f"{token}:start", pid=os.getpid())
    time.sleep(sleep_ms / 1000)
    Ledger.objects.create(label=f"{token}:end", pid=os.getpid())


# --------------------------------------------------------------------------- hostile tasks
# Used by tests/test_hostile_input.py: tasks that return odd values, raise BaseException
# subclasses, exit, or damage their database connection.

#: A file name as os.fsdecode() returns it for bytes that aren't UTF-8 (a lone surrogate).
UNDECODABLE_NAME = os.fsdecode(b"caf\xe9.txt")


class CustomBaseError(BaseException):
    """A BaseException subclass outside the Exception hierarchy."""


class UnprintableError(Exception):
    """An exception whose str() itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("this exception can't be printed")


@queue_task(max_attempts=2, retry_backoff=0)
def echo(value: object) -> object:
    return value


@queue_task(max_attempts=2, retry_backoff=0)
def describe(value: object) -> dict[str, str]:
    """What the task received, in ASCII (safe to store whatever the value holds)."""
    return {"type": type(value).__name__, "ascii": ascii(value)}


@queue_task(max_attempts=2, retry_backoff=0)
def raises_keyboard_interrupt(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise KeyboardInterrupt(label)


@queue_task(max_attempts=2, retry_backoff=0)
async def async_raises_keyboard_interrupt(label: str) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(Ledger.objects.create)(label=label, pid=os.getpid())
    raise KeyboardInterrupt(label)


@queue_task(max_attempts=2, retry_backoff=0)
def raises_custom_base_exception(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise CustomBaseError(label)


@queue_task(max_attempts=2, retry_backoff=0)
def raises_generator_exit(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise GeneratorExit(label)


@queue_task(max_attempts=2, retry_backoff=0)
def calls_sys_exit(label: str) -> None:
    import sys

    Ledger.objects.create(label=label, pid=os.getpid())
    sys.exit(3)


@queue_task(max_attempts=2, retry_backoff=0)
def raises_system_exit(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise SystemExit(f"bye {label}")


@queue_task(max_attempts=2, retry_backoff=0)
def raises_unprintable(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise UnprintableError(label)


@queue_task(max_attempts=2, retry_backoff=0)
def fails_on_undecodable_name(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise ValueError(f"can't process {UNDECODABLE_NAME}")


@queue_task(max_attempts=2, retry_backoff=0)
def returns_nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@queue_task(max_attempts=2, retry_backoff=0)
def returns_big_string(size: int) -> str:
    return "x" * size


@queue_task()
def closes_raw_connection(label: str) -> None:
    """Close the driver's connection behind Django's back."""
    Ledger.objects.create(label=label, pid=os.getpid())
    connection.ensure_connection()
    connection.connection.close()


@queue_task()
def kills_own_connection(label: str) -> None:
    """KILL this thread's own connection (never another one's) on the server."""
    Ledger.objects.create(label=label, pid=os.getpid())
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        [own_id] = cursor.fetchone()
        try:
            cursor.execute("KILL CONNECTION %s", [own_id])
        except Exception:  # noqa: BLE001 - the server may report the kill as an error
            pass


@queue_task(atomic=True, max_attempts=2, retry_backoff=0)
def atomic_closes_raw_connection(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    connection.connection.close()


@queue_task(max_attempts=2, retry_backoff=0)
def leaves_autocommit_off(label: str) -> None:
    """Turn autocommit off and return without committing."""
    from django.db import transaction

    transaction.set_autocommit(False)
    Ledger.objects.create(label=label, pid=os.getpid())


@queue_task(max_attempts=2, retry_backoff=0)
def leaves_atomic_block_open(label: str) -> None:
    """Enter transaction.atomic() and never leave it."""
    from django.db import transaction

    transaction.atomic().__enter__()
    Ledger.objects.create(label=label, pid=os.getpid())


@queue_task(max_attempts=2, retry_backoff=0, atomic=True)
def atomic_leaves_inner_block_open(label: str) -> None:
    """An atomic task that enters a nested transaction.atomic() and never leaves it."""
    from django.db import transaction

    Ledger.objects.create(label=label, pid=os.getpid())
    transaction.atomic().__enter__()


@queue_task
async def async_records_its_db_thread(label: str) -> str:
    """Which thread runs this async task's sync_to_async database call."""
    import threading

    from asgiref.sync import sync_to_async

    def write() -> str:
        Ledger.objects.create(label=label, pid=os.getpid())
        return threading.current_thread().name

    return await sync_to_async(write)()


# --------------------------------------------------------------------------- raw SQL leaks
# Transactions opened with raw SQL, behind Django's back: Django's connection state says
# autocommit and no atomic block, only the server knows (tests/test_transaction_leaks.py).


def _raw_insert(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO testapp_ledger (label, pid, created_at) "
                       "VALUES (%s, %s, UTC_TIMESTAMP(6))", [label, os.getpid()])


@queue_task(max_attempts=2, retry_backoff=0)
def leaves_raw_transaction_open(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION")
    _raw_insert(label)


@queue_task(max_attempts=2, retry_backoff=0)
def raw_transaction_then_raises(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION")
    _raw_insert(label)
    raise ValueError(f"failed inside a raw transaction: {label}")


@queue_task(max_attempts=2, retry_backoff=0)
def turns_autocommit_off_raw(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET autocommit = 0")
    _raw_insert(label)


@queue_task(max_attempts=2, retry_backoff=0)
def leaks_through_the_driver(label: str, how: str) -> None:
    """Open a transaction (or turn autocommit off) on the ``MySQLdb`` connection itself,
    never through a Django cursor. ``send_query`` writes that way too, and ``autocommit``
    sends no statement at all: each is seen only by its own part of the check."""
    connection.ensure_connection()
    raw = connection.connection
    insert = ("INSERT INTO testapp_ledger (label, pid, created_at) "
              f"VALUES ('{label}', {os.getpid()}, UTC_TIMESTAMP(6))")
    if how == "autocommit":
        raw.autocommit(False)  # the client library's own call: no query() at all
        return
    if how == "send_query":
        for statement in ("START TRANSACTION", insert):
            raw.send_query(statement.encode())
            raw.read_query_result()
        return
    if how == "begin":
        raw.begin()
    else:
        raw.cursor().execute("START TRANSACTION")
    raw.cursor().execute(insert)


# --------------------------------------------------------------------------- crashes


@queue_task(max_attempts=2, retry_backoff=0)
def exits_process(label: str) -> None:
    """Kill the whole worker process at once, as an OOM kill or a segfault would."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    os._exit(1)


@queue_task(max_attempts=1)
def record_once(label: str) -> None:
    """One attempt only: a neighbour charged for someone else's crash would go dead."""
    Ledger.objects.create(label=label, pid=os.getpid())


@queue_task()
def records_isolation(label: str) -> None:
    """Records the isolation level of the task's own session (the user's, not the broker's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@tx_isolation")
        [level] = cursor.fetchone()
    Ledger.objects.create(label=f"{label}:{level}", pid=os.getpid())


@queue_task()
def enqueues_child(label: str) -> None:
    """Enqueues from a task thread: a producer inside the worker (its wake-up, its session)."""
    Ledger.objects.create(label=label, pid=os.getpid())
    record.enqueue(f"{label}:child")


@queue_task()
def returns_factorial(n: int) -> int:
    """An int past a double's range for n >= 171: MySQL's JSON column refuses it (3140)."""
    import math

    return math.factorial(n)


@queue_task(max_attempts=2, retry_backoff=0)
def returns_quotes(count: int, label: str = "") -> str:
    """A result whose JSON and SQL escaping each double it: ``count`` quotes, 4x in SQL."""
    if label:
        Ledger.objects.create(label=label, pid=os.getpid())
    return '"' * count


@queue_task()
def naps(label: str, seconds: float) -> str:
    """Records its start, then sleeps without touching the database (its end needs none)."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    time.sleep(seconds)
    return label


@queue_task()
def naps_until_opened(label: str, gate: str, seconds: float = 60.0) -> str:
    """``naps`` until the file ``gate`` exists (``wait_for_gate``): no database at its end."""
    Ledger.objects.create(label=f"{label}:start", pid=os.getpid())
    wait_for_gate(gate, seconds)
    return label


@queue_task(max_attempts=1)
def fails_verbosely(size: int) -> None:
    """Fails at once with a message of two lines and ``size`` more characters: the log
    line cuts it, the history keeps it (tests/test_worker_logging.py)."""
    raise ValueError("first line\nsecond line " + "x" * size)


# Ordered, limited, unique and rate-limited tasks: workers register them.
from . import gated, rated_tasks, unique_tasks  # noqa: E402, F401

