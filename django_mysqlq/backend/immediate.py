"""``MySQLQueueBackend`` in test mode (``MYSQLQ['IMMEDIATE']``).

The task runs in this process after the enqueuing transaction commits (see
``django_mysqlq.immediate``), with Django's signals and ``TaskContext`` as on a worker, and
the ``TaskResult`` that ``enqueue()`` returned follows it: ``READY`` until the commit,
then ``SUCCESSFUL`` or ``FAILED`` with its error. ``get_result()`` answers from this
process, which keeps the latest ``KEEP_RESULTS`` results; no table is read.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from django.utils import timezone

from .. import immediate
from ..messages import NewMessage
from ..tasks import AttemptScope, QueueTask
from .attempts import DjangoAttempt, DjangoTaskHooks
from .compat import Task, TaskResult, TaskResultDoesNotExist, TaskResultStatus, task_enqueued

#: Results kept for ``get_result()``, the oldest forgotten first.
KEEP_RESULTS = 10_000

_results: collections.OrderedDict[
    tuple[str, str], tuple[TaskResult[..., Any], immediate.ImmediateRecord | None]] = \
    collections.OrderedDict()
_lock = threading.Lock()
#: What a finished attempt's result carries over to the one ``enqueue()`` returned.
_FOLLOWED = ("status", "enqueued_at", "started_at", "finished_at", "last_attempted_at",
             "worker_ids", "errors", "_return_value")


def enqueue(backend_alias: str, backend_class: type, task: Task[..., Any], args: list[Any],
            kwargs: dict[str, Any], message: NewMessage) -> TaskResult[..., Any]:
    """Return the task's result now; run it once the caller's transaction commits."""
    message_id = immediate.new_id()
    result = TaskResult(
        task=task, id=str(message_id), status=TaskResultStatus.READY,
        enqueued_at=timezone.now(), started_at=None, finished_at=None,
        last_attempted_at=None, args=args, kwargs=kwargs, backend=backend_alias, errors=[],
        worker_ids=[])
    runnable = QueueTask(
        func=task.func, name=message.task_name, queue=message.queue,
        priority=message.priority, max_attempts=message.max_attempts,
        retry_backoff=message.retry_backoff, timeout=message.timeout,
        hooks=DjangoTaskHooks(task))
    with _lock:  # before the run: a task may read its own result
        _results[(backend_alias, result.id)] = (result, None)
        while len(_results) > KEEP_RESULTS:
            _results.popitem(last=False)
    [handle] = immediate.enqueue(runnable, [message], ids=[message_id],
                                 listener=_Follow(backend_class, result))
    with _lock:
        if (backend_alias, result.id) in _results:
            _results[(backend_alias, result.id)] = (result, handle.record)
    return result


def read_result(backend_alias: str, result_id: str) -> TaskResult[..., Any]:
    with _lock:
        result, record = _results.get((backend_alias, result_id), (None, None))
    if result is not None and record is not None and record.rolled_back():
        raise TaskResultDoesNotExist(
            f"No task result {result_id!r}: the transaction that enqueued it rolled back.")
    if result is None:
        raise TaskResultDoesNotExist(
            f"No task result {result_id!r} in this process: in test mode "
            "(MYSQLQ['IMMEDIATE']) results live in the process that enqueued them, the "
            f"latest {KEEP_RESULTS} of them, and none is read from the database.")
    return result


class _Follow:
    """Sends ``task_enqueued`` at the commit and copies the outcome onto the result."""

    def __init__(self, backend_class: type, result: TaskResult[..., Any]) -> None:
        self.backend_class = backend_class
        self.result = result

    def enqueued(self) -> None:
        from ..broker import send_robust

        send_robust(task_enqueued, self.backend_class, task_result=self.result)

    def started(self) -> None:
        """The returned result says RUNNING while the task runs, as a worker's row would:
        the task may read its own result (``get_result()``)."""
        now = timezone.now()
        object.__setattr__(self.result, "status", TaskResultStatus.RUNNING)
        if self.result.started_at is None:
            object.__setattr__(self.result, "started_at", now)
        object.__setattr__(self.result, "last_attempted_at", now)

    def finished(self, record: immediate.ImmediateRecord, scope: AttemptScope | None) -> None:
        ran = scope.result if isinstance(scope, DjangoAttempt) else None
        if ran is None:
            return
        for name in _FOLLOWED:
            value = getattr(ran, name)
            object.__setattr__(self.result, name, list(value) if isinstance(value, list)
                               else value)
