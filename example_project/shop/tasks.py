"""The shop's queue tasks. Arguments are JSON values: order ids and short strings.

Tasks run at least once, so each one is written to be safe to run again:
``record_order_event`` upserts, ``charge_card`` skips an order already paid, and
``render_invoice`` overwrites the order's one invoice.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_mysqlq import queue_task

from .models import Invoice, Order, OrderEvent, OrderStatus

#: Share of gateway calls that time out, decided per (order number, call number).
GATEWAY_FAILURE_RATE = 0.25
#: Every order whose number is a multiple of this has a card that is always declined.
DECLINED_EVERY = 40


class PaymentGatewayError(Exception):
    """The (pretend) payment gateway refused or dropped a charge."""


def gateway_failure(order_number: int, call: int) -> str | None:
    """Why the gateway fails this call, or None if it succeeds.

    Deterministic, so every demo run gives the same outcomes: a hash of the order's
    number and the gateway call number stands in for the network.
    """
    if order_number % DECLINED_EVERY == 0:
        return "card declined by issuer"
    digest = hashlib.sha256(f"{order_number}:{call}".encode()).digest()
    if digest[0] < GATEWAY_FAILURE_RATE * 256:
        return "gateway timeout after 30s"
    return None


def invoice_render_ms(order_number: int) -> int:
    """How long rendering an invoice takes: 50-200 ms, fixed per order."""
    return 50 + (order_number * 37) % 151


@queue_task(queue="default")
def record_order_event(order_id: int, kind: str) -> dict[str, Any]:
    """Record that ``kind`` happened to an order: one row per (order, kind)."""
    now = timezone.now()
    event, created = OrderEvent.objects.get_or_create(
        order_id=order_id, kind=kind, defaults={"recorded_at": now}
    )
    if not created:  # a re-run (at-least-once) or a duplicate enqueue: count it, keep one row
        OrderEvent.objects.filter(pk=event.pk).update(times=F("times") + 1, recorded_at=now)
    return {"order_id": order_id, "kind": kind, "first": created}


@queue_task(queue="payments", max_attempts=3, retry_backoff=0.2, timeout=30)
def charge_card(order_id: int) -> dict[str, Any]:
    """Charge an order through the payment gateway, which fails now and then.

    On success the order is marked paid and its invoice and ``paid`` event are
    enqueued in the same transaction: they exist exactly when the payment is recorded.
    After the last failed attempt the order is marked ``payment_failed`` before the
    error is raised, so the message goes dead and the order says why.
    """
    Order.objects.filter(pk=order_id).update(charge_attempts=F("charge_attempts") + 1)
    order = Order.objects.get(pk=order_id)
    if order.status == OrderStatus.PAID:
        return {"order_id": order_id, "already_paid": True}
    call = order.charge_attempts
    failure = gateway_failure(order.number, call)
    if failure is None:
        with transaction.atomic():
            Order.objects.filter(pk=order_id).update(status=OrderStatus.PAID,
                                                     paid_at=timezone.now())
            render_invoice.enqueue(order_id)
            record_order_event.enqueue(order_id, "paid")
        return {"order_id": order_id, "charged_cents": order.amount_cents, "call": call}
    if call >= charge_card.max_attempts:
        with transaction.atomic():
            Order.objects.filter(pk=order_id).update(status=OrderStatus.PAYMENT_FAILED)
            record_order_event.enqueue(order_id, "payment_failed")
    raise PaymentGatewayError(
        f"order {order.run_id}-{order.number}: {failure} (gateway call {call})"
    )


@queue_task(queue="documents", timeout=10)
def render_invoice(order_id: int) -> dict[str, Any]:
    """Render an order's invoice: the slow task (50-200 ms of pretend PDF work)."""
    order = Order.objects.get(pk=order_id)
    render_ms = invoice_render_ms(order.number)
    time.sleep(render_ms / 1000)
    body = (
        f"Invoice for order {order.run_id}-{order.number}\n"
        f"Customer: {order.customer}\n"
        f"Amount: {order.amount_cents / 100:.2f} EUR\n"
    )
    invoice, _ = Invoice.objects.update_or_create(
        order=order,
        defaults={
            "number": f"INV-{order.run_id:04d}-{order.number:05d}",
            "body": body,
            "rendered_at": timezone.now(),
            "render_ms": render_ms,
        },
    )
    return {"order_id": order_id, "invoice": invoice.number, "render_ms": render_ms}
