"""Helpers for tests/test_topic_ops_*.py: topics, groups and deliveries made the way
publishers, the pump and workers make them (no worker process)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.db import connections, transaction

from django_mysqlq import Topic, broker
from django_mysqlq.messages import AttemptResult, ClaimedMessage
from django_mysqlq.models import TopicMessage, TopicState
from django_mysqlq.topicnames import delivery_task_name, group_queue
from tests.conftest import raw_connection
from tests.operator_support import RUNNER


def spec(topic: str, group: str, start: str = "earliest", on_dead: str = "skip",
         timeout: float | None = None) -> broker.GroupSpec:
    return broker.GroupSpec(topic=topic, group=group, queue=group_queue(group),
                            task_name=delivery_task_name(topic, group), on_dead=on_dead,
                            max_attempts=2, retry_backoff=0.1, timeout=timeout, start=start)


def publish(topic: str, count: int, *, key: str | None = None, start: int = 0) -> None:
    """``count`` messages ``{"n": start + i}``, committed and sequenced."""
    Topic(topic).publish_many([{"n": start + i} for i in range(count)],
                              keys=[key] * count)
    broker.sequence(topic)


def group(topic: str, name: str, **kwargs: object) -> broker.GroupSpec:
    made = spec(topic, name, **kwargs)  # type: ignore[arg-type]
    broker.sequence(topic)
    broker.create_group(made)
    return made


def claim(made: broker.GroupSpec, count: int) -> list[ClaimedMessage]:
    return broker.claim([made.queue], count, RUNNER.worker_id, lease_seconds=30)


def handle(made: broker.GroupSpec, count: int, *, fail: bool = False) -> list[int]:
    """Claim ``count`` deliveries and ack them (or fail them for good)."""
    done = []
    for message in claim(made, count):
        if fail:
            broker.fail(message, RUNNER, AttemptResult(
                started_at=broker.database_now(), error_class="RuntimeError",
                error_message="handler broke", traceback="..."), retry=False)
        else:
            broker.ack(message, RUNNER, AttemptResult(started_at=broker.database_now()))
        done.append(message.id)
    return done


def forget_before(topic: str, offset: int) -> None:
    """What retention leaves: messages before ``offset`` deleted, first_offset moved."""
    TopicMessage.objects.filter(topic=topic, offset__lt=offset).delete()
    TopicState.objects.filter(name=topic).update(first_offset=offset)


@contextlib.contextmanager
def open_publisher(topic: str, payload: object) -> Iterator[None]:
    """Within the block, another thread holds a publish of ``payload`` to ``topic`` in
    its open transaction; it commits as the block ends."""
    opened, release = threading.Event(), threading.Event()

    def publisher() -> None:
        try:
            with transaction.atomic():
                Topic(topic).publish(payload)
                opened.set()
                release.wait(20)
        finally:
            connections.close_all()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        assert opened.wait(10), "the publisher never published"
        yield
    finally:
        release.set()
        thread.join()


class Stranger:
    """Another session holding rows ``FOR UPDATE`` in an open transaction."""

    def __init__(self, sql: str, params: list[object]) -> None:
        self.conn = raw_connection()
        cursor = self.conn.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute(sql, params)
        assert cursor.fetchall()

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def holding_topic_row(name: str) -> Stranger:
    """Another session holding the topic's row (made first if missing), as a member
    stamping its backlog does."""
    broker.ensure_topic(name)
    return Stranger("SELECT * FROM mysqlq_topic WHERE name = %s FOR UPDATE", [name])
