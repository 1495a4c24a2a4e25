"""The shop's tasks: a @queue_task, and a Django @task where a Tasks framework exists."""

from django_mysqlq import Topic, TopicEvent, queue_task

from .models import Order

#: What the topic handlers got, for the suite (the test mode calls them in-process).
HEARD: list[tuple[str | None, int, object]] = []
orders = Topic("orders")


@orders.subscribe(group="billing")
def bill(event: TopicEvent) -> None:
    HEARD.append((event.group, event.offset, event.payload))
    Order.objects.filter(pk=event.payload["id"]).update(paid=True)


@orders.subscribe(broadcast=True)
def forget(event: TopicEvent) -> None:
    HEARD.append((event.group, event.offset, event.payload))


@queue_task(max_attempts=5)
def mark_paid(order_id: int) -> int:
    Order.objects.filter(pk=order_id).update(paid=True)
    return order_id


@queue_task
def refuse(order_id: int) -> None:
    raise ValueError(f"order {order_id} refused")


try:
    from django.tasks import task
except ImportError:
    try:
        from django_tasks import task
    except ImportError:
        task = None

if task is not None:
    @task
    def total_of(order_id):
        return Order.objects.get(pk=order_id).total


def place_order(total: int) -> Order:
    """What a view would do: the order and its task in one transaction."""
    from django.db import transaction

    with transaction.atomic():
        order = Order.objects.create(total=total)
        mark_paid.enqueue(order.pk)
    return order
