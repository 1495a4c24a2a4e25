"""Sustained contention: 2 worker processes x 8 threads against 4 producers on one queue.

Lock waits and deadlocks must be absorbed inside the broker (retried and counted), never
reach a task or a producer, and no message may run in two places at once. Longer runs:
``MYSQLQ_STRESS_MESSAGES=20000 pytest tests/test_stress.py``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
from collections import defaultdict

import pytest
from django.db import connections, transaction

from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PRODUCERS = 4
MESSAGES_PER_PRODUCER = int(os.environ.get("MYSQLQ_STRESS_MESSAGES", "6000")) // PRODUCERS


def produce(index: int, errors: list[BaseException], ids: list[int]) -> None:
    rng = random.Random(index)
    sent = 0
    try:
        while sent < MESSAGES_PER_PRODUCER:
            batch = min(rng.randint(1, 4), MESSAGES_PER_PRODUCER - sent)
            with transaction.atomic():  # like a view: a few messages per business write
                for _ in range(batch):
                    token = f"p{index}-{sent}"
                    ids.append(tasks.stress_step.enqueue(token, rng.randint(0, 4)).id)
                    sent += 1
    except BaseException as exc:  # noqa: BLE001 - any error reaching a producer fails the test
        errors.append(exc)
    finally:
        connections.close_all()


def test_contention_surfaces_no_error_and_no_double_execution(start_worker):
    supervisor = start_worker("--processes", "2", "--concurrency", "8", "--batch", "8")
    errors: list[BaseException] = []
    ids: list[int] = []
    producers = [threading.Thread(target=produce, args=(i, errors, ids))
                 for i in range(PRODUCERS)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    assert errors == []
    total = PRODUCERS * MESSAGES_PER_PRODUCER
    assert len(ids) == total

    wait_for(lambda: not Message.objects.exists(), timeout=120, interval=0.5,
             message="the workers to drain the queue")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0, supervisor.output()

    outcomes = defaultdict(int)
    for outcome in Attempt.objects.values_list("outcome", flat=True):
        outcomes[outcome] += 1
    assert dict(outcomes) == {"succeeded": total}  # no error reached a task, none ran twice

    # No message executed twice, nor in two places at once.
    starts = Ledger.objects.filter(label__endswith=":start").values_list("label", flat=True)
    assert len(starts) == total == len(set(starts))
    assert Ledger.objects.filter(label__endswith=":end").count() == total

    # Lock conflicts, if any, were retried inside the broker and counted per worker.
    output = supervisor.output()
    summaries = re.findall(r"stopped: .*deadlocks=(\d+) lock_waits=(\d+)", output)
    assert len(summaries) == 2, output
    print(f"{total} messages; deadlocks/lock waits retried per child: {summaries}")
