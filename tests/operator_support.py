"""Helpers for the operator tests: messages in each state, made the way workers make them."""

from __future__ import annotations

import threading

from django.contrib.auth.models import Permission, User
from django.db import connections
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.broker import Operator
from django_mysqlq.messages import AttemptResult, ClaimedMessage, Runner
from django_mysqlq.tasks import QueueTask
from tests.testapp import tasks

RUNNER = Runner(worker_id="test-host:1:abc", host="test-host", pid=1, thread="t0")
OPERATOR = Operator(name="test:alice", host="test-host", pid=1)


def claim_only(handle_id: int, queue: str = "default") -> ClaimedMessage:
    """Claim the single ready message of ``queue`` (which must be ``handle_id``)."""
    [message] = broker.claim([queue], 1, RUNNER.worker_id, lease_seconds=30)
    assert message.id == handle_id, "claim_only expects one ready message in the queue"
    return message


def make_dead(task: QueueTask = tasks.always_fails, label: str = "x") -> int:
    """A message that failed its last attempt, as a worker leaves it."""
    handle = task.enqueue(label)
    message = claim_only(handle.id, task.queue)
    broker.fail(message, RUNNER, AttemptResult(
        started_at=broker.database_now(), error_class="ValueError",
        error_message=f"boom {label}", traceback="Traceback (most recent call last):\n..."),
        retry=False)
    return handle.id


def claim_in_peer(handle_id: int, lease_seconds: float = 30) -> ClaimedMessage:
    """Claim and start on another connection, which then closes: a worker that died
    mid-task (its start recorded, as a worker records it within about a second)."""
    box: dict[str, ClaimedMessage] = {}

    def run() -> None:
        try:
            [box["message"]] = broker.claim(["default"], 1, "dead-peer:2:xyz", lease_seconds)
            broker.mark_started([(box["message"], timezone.now())])
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert box["message"].id == handle_id
    return box["message"]


def user(name: str, *codenames: str, superuser: bool = False) -> User:
    """A staff user with view access to the queue and the given django_mysqlq permissions."""
    account = User.objects.create_user(name, password="pw", is_staff=True,
                                       is_superuser=superuser)
    perms = Permission.objects.filter(content_type__app_label="django_mysqlq",
                                      codename__in=["view_message", "view_attempt",
                                                    "view_worker", *codenames])
    account.user_permissions.add(*perms)
    return account
