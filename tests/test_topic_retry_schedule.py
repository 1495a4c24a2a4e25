"""A consumer group's stepped retry schedule: ``subscribe(retry_backoff=[...])`` spaces a
failing delivery's retries step by step (the n-th retry waits the n-th delay, the last
repeating), and a subscription without one gets the documented defaults,
``TOPIC_MAX_ATTEMPTS`` (17) and ``TOPIC_RETRY_BACKOFF`` (10 s, 30 s, 1-10 min by minutes,
20 min, 30 min, 1 h, 2 h). Run in this process by ``testing.drain()``, which executes
deliveries as a worker does."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from django_mysqlq import Topic, TopicEvent
from django_mysqlq.models import Attempt, Message
from django_mysqlq.registry import registry
from django_mysqlq.testing import drain
from django_mysqlq.topicnames import delivery_task_name
from django_mysqlq.topics import Subscription, subscriptions

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "stepped"
#: Steps exponential backoff can't match (it only grows): short, long, short.
STEPS = [0.1, 0.6, 0.1]
#: The defaults as docs/settings.md and docs/streams.md give them.
DOCUMENTED_ATTEMPTS = 17  # "the first try and 16 retries"
DOCUMENTED_BACKOFF = (10, 30, *(60 * minutes for minutes in range(1, 11)),
                      20 * 60, 30 * 60, 3600, 2 * 3600)


@pytest.fixture
def groups() -> Iterator[dict[str, Subscription]]:
    """Subscribes group ``steps`` (retry_backoff=STEPS, 4 attempts) and group ``plain``
    (the defaults) to topic ``stepped``, each failing every time; forgets them after."""
    topic = Topic(TOPIC)
    before = set(subscriptions.groups())

    @topic.subscribe(group="steps", retry_backoff=STEPS, max_attempts=4)
    def steps(event: TopicEvent) -> None:
        raise RuntimeError(f"steps refused #{event.offset}")

    @topic.subscribe(group="plain")
    def plain(event: TopicEvent) -> None:
        raise RuntimeError(f"plain refused #{event.offset}")

    made = {subscription.group or "": subscription
            for subscription in set(subscriptions.groups()) - before}
    yield made
    for subscription in made.values():
        subscriptions.remove(subscription)
        if subscription.task is not None:
            registry._tasks.pop(subscription.task.name, None)


def test_a_groups_backoff_schedule_spaces_the_retries_step_by_step(groups) -> None:
    Topic(TOPIC).publish({"n": 1})
    result = drain(["group:steps"], wait_seconds=10, raise_errors=False)
    assert [item.outcome for item in result.outcomes] == [
        "retried", "retried", "retried", "failed"]
    delivery = Message.objects.get(task_name=delivery_task_name(TOPIC, "steps"))
    assert (delivery.status, delivery.attempts) == ("dead", 4)
    attempts = list(Attempt.objects.for_message(delivery.id))
    assert [a.outcome for a in attempts] == ["retried", "retried", "retried", "failed"]
    starts = [a.started_at for a in attempts]
    assert None not in starts
    gaps = [(later - earlier.finished_at).total_seconds()
            for earlier, later in zip(attempts, starts[1:], strict=False) if later]
    # The n-th retry waits the n-th step (no jitter): 0.1, 0.6, 0.1 seconds. Exponential
    # backoff from 0.1 (0.1, 0.2, 0.4) fails the second and the last comparison.
    assert gaps[0] >= STEPS[0] and gaps[1] >= STEPS[1] and gaps[2] >= STEPS[2], gaps
    assert gaps[1] > gaps[0] + 0.3 and gaps[1] > gaps[2] + 0.3, gaps


def test_a_subscription_without_a_schedule_gets_the_documented_defaults(groups) -> None:
    task = groups["plain"].task
    assert task is not None
    assert task.max_attempts == DOCUMENTED_ATTEMPTS
    assert task.retry_schedule == DOCUMENTED_BACKOFF
    assert len(DOCUMENTED_BACKOFF) == DOCUMENTED_ATTEMPTS - 1  # a step per retry
    # And the delivery's first failure is retried 10 s later, as the schedule says.
    Topic(TOPIC).publish({"n": 1})
    result = drain(["group:plain"], raise_errors=False)
    assert [item.outcome for item in result.outcomes] == ["retried"]
    delivery = Message.objects.get(task_name=delivery_task_name(TOPIC, "plain"))
    assert (delivery.status, delivery.attempts, delivery.max_attempts) == (
        "scheduled", 1, DOCUMENTED_ATTEMPTS)
    [attempt] = Attempt.objects.for_message(delivery.id)
    wait = delivery.run_at - attempt.finished_at
    assert dt.timedelta(seconds=9) <= wait <= dt.timedelta(seconds=11), wait
