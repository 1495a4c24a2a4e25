"""What the demo commands do: fill the queue like a shop would, then read back the result.

``enqueue_demo`` is the producer side (``manage.py enqueuedemo``); ``build_report``
reads the queue's history and hot table plus the shop's tables (``manage.py
demoreport``). The commands only parse arguments and print.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter

from django.db import transaction
from django.db.models import Count

from django_mysqlq.models import Attempt, Message, MessageStatus, Outcome

from .crash import Recovery, recovery_of, recovery_problems
from .models import DemoRun, Invoice, Order, OrderEvent, OrderStatus
from .tasks import charge_card, record_order_event

#: The demo's tasks all live in this module; the report counts only their messages.
TASK_PREFIX = "example_project.shop.tasks."
#: Queues the demo's tasks use, in the order a worker should claim them.
QUEUES = ("payments", "documents", "default")

CUSTOMERS = (
    "ada", "alan", "barbara", "edsger", "grace", "john", "ken", "margaret", "niklaus",
    "radia", "tony", "yukihiro",
)
#: Every Nth order is an express order: its payment is enqueued at a higher priority.
EXPRESS_EVERY = 10
EXPRESS_PRIORITY = 10
#: Every Nth order gets a delayed "review reminder" event.
REMINDER_EVERY = 25
REMINDER_DELAY_SECONDS = 1.0
#: Priority of the bulk "exported" events: below everything else.
EXPORT_PRIORITY = -10


def short_task_name(name: str) -> str:
    return name.removeprefix(TASK_PREFIX)


# --------------------------------------------------------------------------- producing


@dataclasses.dataclass
class EnqueueSummary:
    run: DemoRun
    express_orders: int = 0
    charges: int = 0
    created_events: int = 0
    welcome_events: int = 0
    welcome_deduplicated: int = 0
    reminders: int = 0
    exported_events: int = 0

    @property
    def messages(self) -> int:
        return (self.charges + self.created_events + self.welcome_events + self.reminders
                + self.exported_events)


def enqueue_demo(orders: int) -> EnqueueSummary:
    """Create ``orders`` orders, each in its own transaction with its messages.

    That is what a checkout view does: the order row and the messages it causes
    commit together or not at all. Then one bulk ``enqueue_many`` marks every order
    for export, the way a nightly job would.
    """
    run = DemoRun.objects.create(orders=orders)
    summary = EnqueueSummary(run=run)
    message_ids: list[int] = []
    welcome_ids: set[int] = set()

    for number in range(1, orders + 1):
        customer = CUSTOMERS[(number * 7) % len(CUSTOMERS)]
        express = number % EXPRESS_EVERY == 0
        with transaction.atomic():
            order = Order.objects.create(
                run=run, number=number, customer=customer,
                amount_cents=500 + (number * 1_337) % 20_000, express=express,
            )
            charge = charge_card.using(priority=EXPRESS_PRIORITY) if express else charge_card
            message_ids.append(charge.enqueue(order.pk).id)
            message_ids.append(record_order_event.enqueue(order.pk, "created").id)
            # One welcome per customer and run: later enqueues return the pending message.
            welcome = record_order_event.using(
                dedup_key=f"shop-run-{run.pk}-welcome-{customer}"
            ).enqueue(order.pk, "welcome")
            message_ids.append(welcome.id)
            if welcome.id in welcome_ids:
                summary.welcome_deduplicated += 1
            welcome_ids.add(welcome.id)
            if number % REMINDER_EVERY == 0:
                reminder = record_order_event.using(delay=REMINDER_DELAY_SECONDS)
                message_ids.append(reminder.enqueue(order.pk, "review_reminder").id)
                summary.reminders += 1
        summary.charges += 1
        summary.express_orders += express
        summary.created_events += 1

    with transaction.atomic():
        order_ids = list(run.order_set.order_by("number").values_list("pk", flat=True))
        handles = record_order_event.using(priority=EXPORT_PRIORITY).enqueue_many(
            [[order_id, "exported"] for order_id in order_ids]
        )
        message_ids.extend(handle.id for handle in handles)
        summary.exported_events = len(handles)

    summary.welcome_events = len(welcome_ids)
    run.first_message_id = min(message_ids) if message_ids else None
    run.save(update_fields=["first_message_id"])
    return summary


# --------------------------------------------------------------------------- reporting


@dataclasses.dataclass
class TaskLine:
    task: str
    outcomes: Counter[str]
    avg_ms: float | None


@dataclasses.dataclass
class Report:
    run: DemoRun
    outcomes: Counter[str]
    tasks: list[TaskLine]
    remaining: Counter[str]
    dead_examples: list[tuple[int, str, str]]
    first_started: dt.datetime | None
    last_finished: dt.datetime | None
    orders: Counter[str]
    invoices: int
    events: Counter[str]
    repeated_events: int
    #: The recovery of the worker ``demokill`` killed, when the run killed one.
    recovery: Recovery | None
    problems: list[str]

    @property
    def seconds(self) -> float:
        if self.first_started is None or self.last_finished is None:
            return 0.0
        return max((self.last_finished - self.first_started).total_seconds(), 0.0)

    @property
    def rate(self) -> float:
        """Succeeded attempts per second, from the first start to the last finish."""
        seconds = self.seconds
        return self.outcomes[Outcome.SUCCEEDED] / seconds if seconds else 0.0


def latest_run() -> DemoRun | None:
    return DemoRun.objects.order_by("-id").first()


def _id_range(run: DemoRun, field: str) -> dict[str, int]:
    """Filter kwargs selecting this run's queue ids in ``field``.

    A run owns the ids from its first message up to the next run's first one: messages
    the tasks enqueue while running (invoices, ``paid`` events) get later ids, so the
    range of the newest run stays open.
    """
    bounds = {f"{field}__gte": run.first_message_id or 0}
    following = (
        DemoRun.objects.filter(id__gt=run.id, first_message_id__isnull=False)
        .order_by("id").values_list("first_message_id", flat=True).first()
    )
    if following is not None:
        bounds[f"{field}__lt"] = following
    return bounds


def build_report(run: DemoRun) -> Report:
    """Read one run's outcome from the queue tables and the shop's tables."""
    attempts = Attempt.objects.filter(task_name__startswith=TASK_PREFIX,
                                      **_id_range(run, "message_id"))
    outcomes: Counter[str] = Counter()
    per_task: dict[str, Counter[str]] = {}
    for row in attempts.values("task_name", "outcome").annotate(n=Count("id")):
        outcomes[row["outcome"]] += row["n"]
        per_task.setdefault(row["task_name"], Counter())[row["outcome"]] += row["n"]

    durations: dict[str, list[float]] = {}
    first_started: dt.datetime | None = None
    last_finished: dt.datetime | None = None
    for task_name, started, finished in attempts.values_list(
        "task_name", "started_at", "finished_at"
    ):
        if started is None:
            continue
        durations.setdefault(task_name, []).append((finished - started).total_seconds())
        first_started = started if first_started is None else min(first_started, started)
        last_finished = finished if last_finished is None else max(last_finished, finished)
    tasks = [
        TaskLine(
            task=short_task_name(name),
            outcomes=counts,
            avg_ms=(1000 * sum(durations[name]) / len(durations[name])
                    if durations.get(name) else None),
        )
        for name, counts in sorted(per_task.items())
    ]

    messages = Message.objects.filter(task_name__startswith=TASK_PREFIX, **_id_range(run, "id"))
    remaining: Counter[str] = Counter(
        {row["status"]: row["n"] for row in messages.values("status").annotate(n=Count("id"))}
    )
    dead_examples = [
        (pk, short_task_name(task), error)
        for pk, task, error in messages.dead().order_by("id")
        .values_list("id", "task_name", "last_error")[:5]
    ]

    orders: Counter[str] = Counter(
        {row["status"]: row["n"]
         for row in run.order_set.values("status").annotate(n=Count("id"))}
    )
    events: Counter[str] = Counter(
        {row["kind"]: row["n"]
         for row in OrderEvent.objects.filter(order__run=run)
         .values("kind").annotate(n=Count("id"))}
    )
    report = Report(
        run=run, outcomes=outcomes, tasks=tasks, remaining=remaining,
        dead_examples=dead_examples, first_started=first_started, last_finished=last_finished,
        orders=orders, invoices=Invoice.objects.filter(order__run=run).count(), events=events,
        repeated_events=OrderEvent.objects.filter(order__run=run, times__gt=1).count(),
        recovery=recovery_of(run), problems=[],
    )
    report.problems = _consistency_problems(report) + recovery_problems(report.recovery)
    return report


def _consistency_problems(report: Report) -> list[str]:
    """What doesn't add up between the queue and the shop once the queue is drained."""
    run = report.run
    problems: list[str] = []
    unfinished = sum(n for status, n in report.remaining.items() if status != MessageStatus.DEAD)
    if unfinished:
        problems.append(f"{unfinished} message(s) are not finished yet: run "
                        "`manage.py runqueueworker --burst --queues "
                        f"{','.join(QUEUES)}` first.")
    if report.orders[OrderStatus.NEW]:
        problems.append(f"{report.orders[OrderStatus.NEW]} order(s) were never charged.")
    paid = report.orders[OrderStatus.PAID]
    if report.invoices != paid:
        problems.append(f"{paid} paid order(s) but {report.invoices} invoice(s).")
    dead_charges = Message.objects.dead().filter(
        task_name=charge_card.name, **_id_range(run, "id")
    ).count()
    failed_orders = report.orders[OrderStatus.PAYMENT_FAILED]
    if dead_charges != failed_orders:
        problems.append(f"{dead_charges} dead charge message(s) but {failed_orders} order(s) "
                        "marked payment_failed.")
    expected_events = {
        "created": run.orders,
        "exported": run.orders,
        "welcome": run.order_set.values("customer").distinct().count(),
        "review_reminder": run.orders // REMINDER_EVERY,
        "paid": paid,
        "payment_failed": failed_orders,
    }
    for kind, expected in expected_events.items():
        if report.events[kind] != expected:
            problems.append(f"{report.events[kind]} {kind!r} event(s), expected {expected}.")
    return problems
