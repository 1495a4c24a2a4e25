"""Recurring and retry-controlled tasks for tests/test_schedule_*.py and
tests/test_retry_control.py. Not autodiscovered (not a ``tasks`` module): only workers
started with it in ``MYSQLQ['TASK_MODULES']`` declare these schedules, so no other test's
worker writes or fires them."""

import os

from django_mysqlq import Retry, TaskContext, queue_task

from .models import Ledger

#: The queue of the schedules that fire every second: workers run with ``--queues
#: default`` leave their messages ready, so a test counts each occurrence's message.
CRON_QUEUE = "cron"


@queue_task(queue=CRON_QUEUE, cron="* * * * * *", name="tests.every_second")
def every_second() -> None:
    Ledger.objects.create(label="every-second", pid=os.getpid())


@queue_task(queue=CRON_QUEUE, cron="* * * * * */2", cron_tz="America/New_York",
            catch_up="all", cron_args=["two"], cron_kwargs={"value": 2},
            name="tests.every_two_seconds")
def every_two_seconds(label: str, value: int = 0) -> None:
    Ledger.objects.create(label=label, value=value, pid=os.getpid())


@queue_task(queue=CRON_QUEUE)
def tick(label: str = "tick") -> None:
    """Named by MYSQLQ['SCHEDULES'] entries (MYSQLQ_TEST_SCHEDULES)."""
    Ledger.objects.create(label=label, pid=os.getpid())


# ------------------------------------------------------------------------ retry control

class Transient(Exception):
    pass


class Permanent(Exception):
    pass


class NarrowPermanent(Transient):
    """A Transient that is never worth retrying: dont_retry wins over retry_on."""


@queue_task(max_attempts=4, retry_backoff=0, retry_on=(Transient,),
            dont_retry=(NarrowPermanent,))
def raises_named(label: str, kind: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise {"transient": Transient, "permanent": Permanent,
           "narrow": NarrowPermanent}[kind](label)


@queue_task(max_attempts=4, retry_backoff=0, dont_retry=KeyError)
def dont_retry_key_error(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise KeyError(label)


@queue_task(max_attempts=3, retry_backoff=0, takes_context=True)
def asks_for_retry(context: TaskContext, label: str, seconds: float) -> str:
    """Asks to run again after ``seconds`` until its last attempt, which succeeds."""
    Ledger.objects.create(label=label, value=context.attempt, pid=os.getpid())
    if not context.is_last_attempt:
        raise Retry(in_seconds=seconds, reason=f"attempt {context.attempt} wants more")
    return f"done on {context.attempt}"


@queue_task(max_attempts=2, retry_backoff=0)
def always_asks_for_retry(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise Retry(in_seconds=0)


@queue_task(max_attempts=4, retry_backoff=[0.2, 1.5, 0.4])
def stepped(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
    raise Transient(label)


@queue_task(takes_context=True)
def shows_context(context: TaskContext, label: str) -> dict[str, object]:
    Ledger.objects.create(label=label, value=context.message_id, pid=os.getpid())
    return {"message_id": context.message_id, "attempt": context.attempt,
            "max_attempts": context.max_attempts, "queue": context.queue,
            "task_name": context.task_name, "subject": context.subject,
            "enqueued_at": context.enqueued_at.isoformat()}


@queue_task(takes_context=True, atomic=True)
def atomic_with_context(context: TaskContext, label: str) -> int:
    Ledger.objects.create(label=label, value=context.attempt, pid=os.getpid())
    return context.message_id
