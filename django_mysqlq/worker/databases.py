"""One worker process serving queues on several databases: a worker per database.

The asked-for queues are grouped by their database alias (``routing``); each alias gets a
:class:`~.loop.Worker` of its own (control loop, task threads, acker), whose threads send
every statement to that alias. With one alias this is the plain worker on the main thread.
With several, each worker's control loop runs on a thread of its own and the main thread
only waits and takes the signals (``stopping``): a first stop drains every worker, a
second exits at once. Each worker registers, heartbeats, parks, recovers and sweeps on its own
database, so recovery, wake-ups, pauses and the recovery leader are per database.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from ..conf import get_settings
from ..exceptions import WorkerCannotRun
from ..routing import group_by_alias
from ..topicnames import GROUP_QUEUE_PREFIX
from . import draining
from .budget import TaskBudget
from .fatal import EXIT_CANNOT_RUN
from .loop import Worker
from .options import WorkerOptions
from .stats import Figures
from .stopping import RECYCLE_REASON, StopRequest

logger = logging.getLogger("django_mysqlq")

#: Seconds between two looks of the main thread at the workers' threads.
JOIN_SECONDS = 0.2


def split(options: WorkerOptions) -> list[WorkerOptions]:
    """One worker's options per database alias of ``options.queues`` (claim order kept).

    Broadcast subscriptions run once a process, whatever databases it serves: in the
    worker of ``MYSQLQ['DATABASE']`` (where topics live), else in the first. A reader in
    each worker would run every broadcast message once per database."""
    grouped = group_by_alias(options.queues)
    main = get_settings().DATABASE
    for alias, queues in grouped.items():
        strays = [queue for queue in queues if queue.startswith(GROUP_QUEUE_PREFIX)]
        if alias != main and strays:
            # (E012 catches MYSQLQ['QUEUES']; a router's answer is known only here.)
            raise WorkerCannotRun(
                f"The consumer group queue(s) {', '.join(strays)} are placed on {alias!r} "
                f"(by a router's db_for_queue): topics and their groups' queues live on "
                f"MYSQLQ['DATABASE'] ({main!r}) only, and there nothing would pump them. "
                f"Make db_for_queue return None for queues starting with "
                f"{GROUP_QUEUE_PREFIX!r} (see docs/scaling.md).", EXIT_CANNOT_RUN)
    reader = main if main in grouped else next(iter(grouped), None)
    return [dataclasses.replace(options, queues=tuple(queues), database=alias,
                                broadcast=options.broadcast and alias == reader)
            for alias, queues in grouped.items()]


class Workers:
    """The workers of one process, one per database alias of its queues."""

    def __init__(self, options: WorkerOptions) -> None:
        budget = TaskBudget(options.max_tasks)  # --max-tasks is the process's
        self.workers = [Worker(each, budget) for each in split(options)]
        self._statuses: dict[int, int] = {}
        self._cannot_run: list[WorkerCannotRun] = []
        self._supervised = options.supervised
        #: The process's signals, heard on the main thread: each stop goes to every worker.
        self.signals = StopRequest(threading.Event(),
                                   on_force=lambda: draining.exit_now(*self.workers),
                                   on_stop=self.stop)

    def run(self) -> int:
        """Work until stopped; the exit status (the first non-zero of the workers')."""
        if len(self.workers) == 1:
            return self.workers[0].run()
        self.signals.install(self._supervised)
        logger.info("Worker process serves %d databases: %s.", len(self.workers),
                    "; ".join(f"{w.options.database}: {','.join(w.options.queues)}"
                              for w in self.workers))
        threads = [threading.Thread(target=self._run_one, args=(index, worker),
                                    name=f"mysqlq-db-{worker.options.database}")
                   for index, worker in enumerate(self.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # short joins: the main thread must take signals
                thread.join(JOIN_SECONDS)
        if self._cannot_run:
            raise self._cannot_run[0]
        return next((status for status in self._statuses.values() if status), 0)

    def _run_one(self, index: int, worker: Worker) -> None:
        try:
            self._statuses[index] = worker.run()
            if worker.stop_request.signal_name == RECYCLE_REASON:
                # Memory is the process's: one worker past --max-memory recycles it all
                # (the others, serving databases with nothing to run, never would).
                self.stop(RECYCLE_REASON)
        except WorkerCannotRun as exc:
            # One database can't be served: the others stop too (as a worker would).
            self._cannot_run.append(exc)
            self.stop("cannot-run")
        except BaseException:
            logger.exception("Worker %s (database %s) crashed; stopping the others.",
                             worker.id, worker.options.database)
            self._statuses[index] = 1
            self.stop("crash")

    def stop(self, reason: str) -> None:
        for worker in self.workers:
            worker.stop_request.set(reason)

    @property
    def figures(self) -> list[tuple[str, Figures]]:
        """Each worker's database alias and summary figures, in claim order."""
        return [(worker.options.database or "", worker.stats.as_dict())
                for worker in self.workers]
