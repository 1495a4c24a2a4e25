"""``manage.py enqueuedemo``: create demo orders and enqueue their tasks."""

from __future__ import annotations

from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand

from example_project.shop import demo


def _order_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 100_000:
        raise ArgumentTypeError(f"must be from 1 to 100000, got {value}")
    return value


class Command(BaseCommand):
    help = ("Create demo orders, each in its own transaction with the messages it causes, "
            "then enqueue one bulk export with enqueue_many.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--orders", type=_order_count, default=200,
                            help="How many orders to create (default 200).")

    def handle(self, *args: Any, **options: Any) -> None:
        s = demo.enqueue_demo(options["orders"])
        run = s.run
        self.stdout.write(
            f"Demo run {run.pk}: created {run.orders} orders in {run.orders} transactions "
            f"({s.express_orders} express), first message id {run.first_message_id}"
        )
        rows = [
            ("charge_card", s.charges,
             f"queue payments, {s.express_orders} at priority {demo.EXPRESS_PRIORITY}, "
             "max_attempts 3"),
            ("record_order_event", s.created_events, "'created', one per order"),
            ("record_order_event", s.welcome_events,
             f"'welcome' with a dedup_key per customer ({s.welcome_deduplicated} enqueues "
             "deduplicated)"),
            ("record_order_event", s.reminders,
             f"'review_reminder' delayed {demo.REMINDER_DELAY_SECONDS:g}s (scheduled)"),
            ("record_order_event", s.exported_events,
             f"'exported' in one enqueue_many, priority {demo.EXPORT_PRIORITY}"),
        ]
        for task, count, note in rows:
            self.stdout.write(f"  {task:<20} {count:>6}  {note}")
        self.stdout.write(
            f"Enqueued {s.messages} messages. Paid orders enqueue render_invoice (queue "
            "documents) and a 'paid' event when their charge succeeds.\n"
            f"Run: manage.py runqueueworker --burst --queues {','.join(demo.QUEUES)}"
        )
