"""Signal receivers that raise a BaseException (``sys.exit()``, a custom subclass) in a
real worker: each is logged and breaks nothing; the task runs, is acked, the worker goes on.
"""

from __future__ import annotations

import importlib.util
import signal

import pytest

from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 60.0


def _django_tasks() -> bool:
    return any(importlib.util.find_spec(name) is not None
               for name in ("django.tasks", "django_tasks"))


def test_receivers_raising_base_exceptions_break_nothing(start_worker):
    ids = [tasks.record.enqueue(f"r{i}", value=i).id for i in range(3)]
    if _django_tasks():
        from tests.testapp import djtasks

        ids += [int(djtasks.add.enqueue(i, 1).id) for i in range(2)]
    # One task thread: a receiver that killed it would leave every later message unrun.
    worker = start_worker("--concurrency", "1", "--batch", "1",
                          env={"MYSQLQ_TEST_EXITING_RECEIVERS": "1"})
    try:
        wait_for(lambda: not Message.objects.filter(pk__in=ids).exists(), timeout=PATIENCE)
    except pytest.fail.Exception:
        pytest.fail(f"messages left unrun; worker output:\n{worker.output()}")
    outcomes = sorted(Attempt.objects.filter(message_id__in=ids)
                      .values_list("message_id", "outcome"))
    assert outcomes == [(pk, "succeeded") for pk in sorted(ids)]
    assert sorted(Ledger.objects.filter(label__startswith="r")
                  .values_list("value", flat=True)) == [0, 1, 2]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=PATIENCE) == 0, worker.output()
    output = worker.output()
    assert "_exits" in output and "_bails_out" in output, output
    assert "SystemExit" in output and "ReceiverBailedOut" in output, output
