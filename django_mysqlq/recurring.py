"""The recurring tasks this process's code and settings declare, as schedule rows.

``@queue_task(cron=...)`` declares one under the task's name; ``MYSQLQ['SCHEDULES']``
declares named ones of registered tasks. A worker writes them when it starts
(``broker.sync_schedules``); the system check ``django_mysqlq.E006`` reports a settings
schedule whose task or arguments don't fit, before a worker would refuse to start.
"""

from __future__ import annotations

from typing import Any

from . import calls, cron, gating, payload
from .broker.schedules import DeclaredSchedule
from .conf import get_settings
from .exceptions import QueueError
from .registry import registry
from .tasks import QueueTask

CODE, SETTINGS = "code", "settings"


class ScheduleProblem(QueueError, ValueError):
    """A declared schedule can't be written: the message says which and why."""


def _row(name: str, source: str, task: QueueTask[Any, Any],
         schedule: cron.CronSchedule) -> DeclaredSchedule:
    return DeclaredSchedule(
        name=name, source=source, task_name=task.name, queue=task.queue,
        priority=task.priority, max_attempts=task.max_attempts,
        retry_backoff=task.retry_backoff, timeout=task.timeout,
        payload=payload.encode(task.name, schedule.args, schedule.kwargs,
                               get_settings().MAX_PAYLOAD_BYTES),
        cron=schedule.cron, timezone=schedule.tz, catch_up=schedule.catch_up)


def from_settings(name: str, entry: dict[str, Any]) -> DeclaredSchedule:
    """One ``MYSQLQ['SCHEDULES']`` entry (already checked by ``conf``) against its task."""
    where = f"MYSQLQ['SCHEDULES'][{name!r}]"
    try:
        task = registry.get(entry["task"])
    except QueueError:
        raise ScheduleProblem(
            f"{where} names the task {entry['task']!r}, which is not registered: give the "
            "task's name (its module and function, e.g. 'shop.tasks.report', or its name=) "
            "and make sure its module is an installed app's tasks.py or in "
            "MYSQLQ['TASK_MODULES'].") from None
    if task.rate is not None:
        raise ScheduleProblem(
            f"{where} names {task.name!r}, which has rate_limit={task.rate.spec!r}: a "
            "schedule's occurrences are enqueued ready and would not wait for the limit. "
            "Schedule a task without rate_limit that enqueues this one.")
    alone = gating.unschedulable(task.gate, task.unique_for)
    if alone is not None:
        raise ScheduleProblem(
            f"{where} names {task.name!r}, which has {alone[0]}: {alone[1]}. Schedule a "
            f"task without it whose body calls {task.name}.enqueue(...).")
    schedule = cron.CronSchedule(entry["cron"], entry["tz"], entry["catch_up"],
                                 tuple(entry["args"]), dict(entry["kwargs"]))
    try:
        calls.check_call(task.name, task.func, schedule.args, schedule.kwargs,
                         skip_first=task.takes_context)
    except QueueError as exc:
        raise ScheduleProblem(
            f"{where}: its 'args' and 'kwargs' don't fit the task: "
            f"{str(exc).replace('; nothing was enqueued', '')}") from None
    try:
        return _row(name, SETTINGS, task, schedule)
    except QueueError as exc:  # over MAX_PAYLOAD_BYTES
        raise ScheduleProblem(f"{where}: {exc}") from None


def declared() -> list[DeclaredSchedule]:
    """Every schedule declared here, by name; raise :class:`ScheduleProblem` on a bad one
    or on two with one name."""
    return _declared(strict=True)


def declared_leniently() -> list[DeclaredSchedule]:
    """Every good schedule declared here, by name, the bad ones left out (the system check
    ``django_mysqlq.E006`` names them): for the read-only views, which must not fail."""
    return _declared(strict=False)


def _declared(strict: bool) -> list[DeclaredSchedule]:
    rows: dict[str, DeclaredSchedule] = {}
    for task_name in registry.names():
        task = registry.get(task_name)
        if task.schedule is not None:
            try:
                rows[task.name] = _row(task.name, CODE, task, task.schedule)
            except QueueError:  # over MAX_PAYLOAD_BYTES
                if strict:
                    raise
    for name, entry in get_settings().SCHEDULES.items():
        if name in rows:
            if not strict:
                continue
            raise ScheduleProblem(
                f"MYSQLQ['SCHEDULES'][{name!r}] has the name of the task {name!r}, which "
                "declares cron=... itself: give the settings schedule another name.")
        try:
            rows[name] = from_settings(name, dict(entry))
        except ScheduleProblem:
            if strict:
                raise
    return [rows[name] for name in sorted(rows)]


def problems() -> list[str]:
    """What is wrong with the declared schedules, for the system check."""
    found = []
    for name, entry in get_settings().SCHEDULES.items():
        try:
            from_settings(name, dict(entry))
        except ScheduleProblem as exc:
            found.append(str(exc))
    try:
        declared()
    except QueueError as exc:  # a ScheduleProblem, or a cron task's over MAX_PAYLOAD_BYTES
        if str(exc) not in found:
            found.append(str(exc))
    return found
