"""The example shop: orders, what happened to them, and their invoices.

A :class:`DemoRun` groups the orders of one ``enqueuedemo`` run and remembers the first
queue message id it wrote, so ``demoreport`` can read that run's history alone.
"""

from __future__ import annotations

from django.db import models


class DemoRun(models.Model):
    """One ``manage.py enqueuedemo`` run."""

    started_at = models.DateTimeField(auto_now_add=True)
    orders = models.PositiveIntegerField(default=0)
    #: Id of the first queue message this run enqueued; later runs start above it.
    first_message_id = models.BigIntegerField(null=True, blank=True)
    #: The worker ``demokill`` killed with SIGKILL mid-run, when (database clock), and how
    #: many claimed messages it left behind: ``demoreport`` shows their recovery.
    killed_worker = models.CharField(max_length=200, blank=True, default="")
    killed_at = models.DateTimeField(null=True, blank=True)
    killed_holding = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Demo run {self.pk} ({self.orders} orders)"


class OrderStatus(models.TextChoices):
    NEW = "new", "New"
    PAID = "paid", "Paid"
    PAYMENT_FAILED = "payment_failed", "Payment failed"


class Order(models.Model):
    run = models.ForeignKey(DemoRun, on_delete=models.CASCADE)
    #: 1..N within its run: the demo's deterministic "randomness" is keyed on it.
    number = models.PositiveIntegerField()
    customer = models.CharField(max_length=100)
    amount_cents = models.PositiveIntegerField()
    express = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=OrderStatus.choices,
                              default=OrderStatus.NEW)
    #: Calls made to the payment gateway for this order (successful or not).
    charge_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="shop_order_run_number"),
        ]
        indexes = [models.Index(fields=["run", "status"], name="shop_order_run_status")]

    def __str__(self) -> str:
        return f"Order {self.run_id}-{self.number} ({self.status})"


class OrderEvent(models.Model):
    """Something that happened to an order; one row per (order, kind), however often
    the task recording it runs (tasks run at least once)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    recorded_at = models.DateTimeField()
    #: How many times the event was recorded: >1 only if a message ran more than once.
    times = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "kind"], name="shop_event_order_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.order} {self.kind}"


class Invoice(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice")
    number = models.CharField(max_length=40, unique=True)
    body = models.TextField()
    rendered_at = models.DateTimeField()
    render_ms = models.PositiveIntegerField()

    def __str__(self) -> str:
        return self.number
