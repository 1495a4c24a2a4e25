"""The worker's share of recurring tasks: write its code's schedules when it starts, and
enqueue due occurrences whenever it promotes due messages (a park that ends because one is
due comes here too). The SQL and the exactly-once rule are in ``broker.schedules``."""

from __future__ import annotations

import datetime as dt
import logging
from zoneinfo import ZoneInfo

from .. import broker, recurring
from ..conf import get_settings
from ..exceptions import WorkerCannotRun
from ..routing import alias_for_queue
from .fatal import EXIT_CANNOT_RUN

logger = logging.getLogger("django_mysqlq")


def _shown(moment: dt.datetime, zone: str) -> str:
    local = moment.astimezone(ZoneInfo(zone))
    utc = moment.astimezone(dt.UTC)
    text = f"{local:%Y-%m-%d %H:%M:%S} {zone}"
    return text if zone == "UTC" else f"{text} ({utc:%H:%M:%S} UTC)"


def start(worker_id: str) -> None:
    """Write the declared schedules (the code's, the settings'); say what changed."""
    try:
        declared = recurring.declared()
    except recurring.ScheduleProblem as exc:
        raise WorkerCannotRun(f"Worker {worker_id} can't start: {exc}", EXIT_CANNOT_RUN) \
            from exc
    # Each schedule lives beside its queue, so its occurrences are enqueued with it.
    here = broker.default_alias()
    declared = [each for each in declared if alias_for_queue(each.queue) == here]
    synced = broker.sync_schedules(declared)
    if declared:
        logger.info("Worker %s: %d schedule(s) declared: %s.", worker_id, len(declared),
                    ", ".join(f"{s.name} ({s.cron} {s.timezone})" for s in declared))
    for name in synced.added:
        logger.info("Schedule %r is new.", name)
    for name in synced.changed:
        logger.info("Schedule %r changed its expression or zone: it starts from its next "
                    "occurrence after now.", name)
    if synced.removed:
        logger.warning("Schedule(s) %s are not declared by this worker's code or settings: "
                       "they no longer fire (manage.py queueschedule prune deletes them).",
                       ", ".join(map(repr, synced.removed)))


def fire() -> int:
    """Enqueue the occurrences that are due; return how many messages were written."""
    written = 0
    for fired in broker.fire_due_schedules(get_settings().SCHEDULE_GRACE_SECONDS):
        plan = fired.plan
        if plan.missed:
            more = "more than " if plan.dropped_capped else ""
            kept = {"skip": "none of them enqueued",
                    "latest": "only the most recent one enqueued",
                    "all": (f"the most recent {plan.missed} enqueued, older ones dropped"
                            if plan.dropped_capped else "all of them enqueued now")
                    }[fired.catch_up]
            logger.warning(
                "Schedule %r missed %s%d occurrence(s) from %s while no worker ran; "
                "catch_up=%r: %s.", fired.name, more, plan.missed,
                _shown(plan.pending_from, fired.timezone) if plan.pending_from else "?",
                fired.catch_up, kept)
        for occurrence, message_id in zip(fired.occurrences, fired.message_ids, strict=True):
            logger.info("Schedule %r: enqueued %s #%s for %s.", fired.name, fired.task_name,
                        message_id, _shown(occurrence, fired.timezone))
        if not fired.message_ids and not plan.missed:
            logger.info("Schedule %r: nothing to enqueue after all (its next run time was "
                        "missing or out of date); its next is %s.", fired.name,
                        _shown(fired.next_run_at, fired.timezone))
        written += len(fired.message_ids)
    return written
