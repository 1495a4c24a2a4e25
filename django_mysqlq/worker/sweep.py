"""The worker's recovery sweep: vanished workers' claims back to the queue, counted.

A message lost during its last attempt (a task that kills its process at every run) goes
dead in the sweep that recovers it, not in a task thread: the worker whose sweep buried
it counts it in its ``dead`` (so ``--burst`` exits ``EXIT_DEAD``) and says so. A peer's
sweep is the peer's.
"""

from __future__ import annotations

import logging

from .. import broker
from .stats import WorkerStats

logger = logging.getLogger("django_mysqlq")


def recover_lost(stats: WorkerStats, worker_id: str) -> None:
    """Sweep (if this worker leads recovery) and count what it recovered and buried."""
    recovered = broker.recover(keep_lock=True)
    stats.add(recovered=len(recovered), dead=len(recovered.dead))
    if recovered.dead:
        logger.warning("Worker %s: %d recovered message(s) went dead: lost with their worker "
                       "during their last attempt (WorkerLost): %s", worker_id,
                       len(recovered.dead), ", ".join(f"#{m}" for m in recovered.dead))
