"""Automatic retention, run by the recovery leader: old dead messages and worker rows go,
and so do unique keys whose ``unique_for`` period ended and idle rate-limit keys.

``MYSQLQ['DEAD_RETENTION_SECONDS']`` and ``MYSQLQ['WORKER_RETENTION_SECONDS']`` say how
old; None keeps them. Each call deletes at most a few short batches, so a backlog (say,
from the day retention was turned on) is worked off over several upkeeps instead of
holding up the control loop that claims and recovers.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from .. import broker
from ..broker.park import RATE_TABLE
from ..broker.unique import UNIQUE_TABLE
from ..conf import get_settings

logger = logging.getLogger("django_mysqlq")

#: Rows per DELETE (dead messages: per transaction of history rows + delete).
BATCH = 200
#: Batches of each kind per call: at most 1,000 rows of each per upkeep.
BATCHES_PER_CALL = 5


def _batches(delete_batch: Callable[[], int]) -> int:
    """Up to BATCHES_PER_CALL batches, stopping at the first short one."""
    deleted = 0
    for _ in range(BATCHES_PER_CALL):
        count = delete_batch()
        deleted += count
        if count < BATCH:
            break
    return deleted


#: Runs one kind of retention, ``step(name, table, run)``: the worker's upkeep passes one
#: that skips the kind for this round when ``table`` is locked by another session
#: (``worker.upkeep``); it returns None then.
Step = Callable[[str, str, Callable[[], int]], int | None]


def _direct(name: str, table: str, run: Callable[[], int]) -> int:
    return run()


def prune(worker_id: str, host: str, pid: int, step: Step = _direct) -> tuple[int, int]:
    """Delete what retention allows; return (dead messages, worker rows) deleted.

    History records the worker as ``worker:<id>`` on each purged dead message. Each kind
    runs as one ``step``, so a table another session holds locked delays only its own.
    """
    conf = get_settings()
    dead_age, worker_age = conf.DEAD_RETENTION_SECONDS, conf.WORKER_RETENTION_SECONDS
    now = broker.database_now()
    # Unique keys whose period ended hold nothing: always deleted.
    step("unique key retention", UNIQUE_TABLE,
         lambda: _batches(lambda: broker.purge_unique_keys_batch(now, BATCH)))
    # ... and so do rate keys without messages whose next start has passed.
    idle_before = now - dt.timedelta(seconds=broker.IDLE_KEY_SECONDS)
    step("rate key retention", RATE_TABLE,
         lambda: _batches(lambda: broker.purge_idle_rate_keys(idle_before, BATCH)))
    if dead_age is None and worker_age is None:
        return 0, 0
    dead = workers = 0
    if dead_age is not None:
        operator = broker.Operator(name=f"worker:{worker_id}", host=host, pid=pid)
        dead_before = now - dt.timedelta(seconds=dead_age)
        dead = step("dead message retention", f"{broker.MESSAGE_TABLE} or "
                    f"{broker.ATTEMPT_TABLE}", lambda: _batches(
                        lambda: broker.purge_dead_batch(dead_before, BATCH, operator))) or 0
        if dead:
            logger.info("Retention: deleted %d dead message(s) that died before %s UTC "
                        "(history keeps each as 'cancelled').", dead,
                        f"{dead_before:%Y-%m-%d %H:%M}")
    if worker_age is not None:
        workers_before = now - dt.timedelta(seconds=worker_age)
        workers = step("worker row retention", broker.WORKER_TABLE, lambda: _batches(
            lambda: broker.purge_workers_batch(workers_before, BATCH))) or 0
        if workers:
            logger.info("Retention: deleted %d row(s) of workers stopped and silent since "
                        "before %s UTC.", workers, f"{workers_before:%Y-%m-%d %H:%M}")
    return dead, workers
