"""How long a topic group reset holds its locks, by how many deliveries wait, against the
real MariaDB.

The measurement runs only when ``MYSQLQ_MEASURE_RESET=1`` (it takes about a minute and the
machine's noise makes its numbers a report, not an assertion)::

    MYSQLQ_MEASURE_RESET=1 pytest -q -s tests/test_topic_reset_size.py -k measure

It prints the median of 3 resets for each size, unkeyed (every delivery ready) and keyed
(100 keys: one ready per key, the rest blocked behind it).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.broker import topic_reset
from django_mysqlq.models import Message
from tests.operator_support import OPERATOR
from tests.topic_ops_support import group

pytestmark = pytest.mark.django_db(transaction=True)

SIZES = (1_000, 10_000, 50_000)
KEYS = 100


def publish_keyed(topic: str, count: int, keys: int | None) -> None:
    for start in range(0, count, 5_000):
        part = range(start, min(count, start + 5_000))
        Topic(topic).publish_many([{"n": n, "pad": "x" * 200} for n in part],
                                  keys=[f"k{n % keys}" if keys else None for n in part])
    broker.sequence(topic)


def waiting(made: broker.GroupSpec, count: int) -> None:
    """Reset the group to the earliest offset, then pump until ``count`` deliveries wait."""
    broker.reset_group(made.topic, made.group, broker.ResetTarget(edge="earliest"), OPERATOR)
    have = 0
    while have < count:
        made_now = broker.pump(made, batch=min(5_000, count - have), window=count)
        assert made_now, f"the pump stopped at {have} of {count}"
        have += made_now
    assert Message.objects.filter(queue=made.queue).count() == count


@pytest.mark.skipif(os.environ.get("MYSQLQ_MEASURE_RESET") != "1",
                    reason="a measurement: MYSQLQ_MEASURE_RESET=1 runs it")
@pytest.mark.parametrize("keys", [None, KEYS])
def test_measure_reset_by_waiting_deliveries(monkeypatch, keys: int | None) -> None:
    """Prints, for each size, the median of 3 of the whole reset and of its first
    transaction (the one holding the group's row and the kept bounds' lock)."""
    made = group("orders", "billing")
    publish_keyed("orders", max(SIZES), keys)
    real: Callable[..., Any] = topic_reset.in_transaction
    spans: list[float] = []

    def timed(alias: str, body: Callable[[Any], Any]) -> Any:
        began = time.perf_counter()
        try:
            return real(alias, body)
        finally:
            spans.append(time.perf_counter() - began)

    monkeypatch.setattr(topic_reset, "in_transaction", timed)
    for size in SIZES:
        whole, first = [], []
        for _ in range(3):
            waiting(made, size)
            spans.clear()
            began = time.perf_counter()
            done = broker.reset_group("orders", "billing", broker.ResetTarget(edge="earliest"),
                                      OPERATOR)
            whole.append(time.perf_counter() - began)
            first.append(spans[0])
            assert done.cancelled == size
        print(f"\nreset, {size:,} waiting ({'keyed' if keys else 'unkeyed'}): whole "
              f"{statistics.median(whole):.2f} s ({', '.join(f'{t:.2f}' for t in whole)}), "
              f"its transaction {statistics.median(first):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in first)})")
