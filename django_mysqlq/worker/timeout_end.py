"""The end of an attempt failed for its timeout (``draining.abort_for_timeout``), told as
any failed attempt's end is: ``task_finished`` with its outcome and its ``TaskTimeout``,
and the end of its scope (a Django task's ``task_finished``, its result ``FAILED`` or
``READY`` for a retry), inside a handler of that error so receivers see it as
``sys.exc_info()``.

Sent by the control thread that failed the attempt, once: the task's own thread records
nothing of it from then on (``Holdings.may_end``). An attempt whose thread had not told its
task yet (``Holdings.began``) never started: it sent no ``task_started``, and gets no
``task_finished`` either. Whatever a receiver does, the process goes on to exit.
"""

from __future__ import annotations

import logging

from ..exceptions import TaskTimeout
from ..log import quietly
from .executor import send_finished
from .holdings import RunningTask

logger = logging.getLogger("django_mysqlq")


def tell_finished(task: RunningTask, outcome: str, error: TaskTimeout) -> None:
    """Send the end of ``task``'s attempt, ``outcome`` as recorded (``lost`` when it could
    not be)."""
    if task.task is None:
        return
    try:
        try:
            raise error
        except TaskTimeout:
            send_finished(task.task, task.scope, task.message, outcome, error, None)
    except BaseException:  # noqa: BLE001 - the process exits next, whatever a receiver raised
        quietly(logger.exception, "Could not report the end of %s #%s to task_finished",
                task.message.task_name, task.message.id)
