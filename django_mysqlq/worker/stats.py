"""Counters of one worker process and the one-line summary it logs."""

from __future__ import annotations

import logging
import threading
import time

from .. import broker

logger = logging.getLogger("django_mysqlq")


#: ``WorkerStats.as_dict()``: the figures of a summary.
Figures = dict[str, float | int]


def summary_line(d: Figures, server: str = "") -> str:
    """Figures (``WorkerStats.as_dict()``, or a supervisor's sums of them) on one line."""
    return (
        f"processed={d['processed']} succeeded={d['succeeded']} unacked={d['unacked']} "
        f"failed={d['failed']} retried={d['retried']} dead={d['dead']} "
        f"recovered={d['recovered']} released={d['released']} deferred={d['deferred']} "
        f"lost={d['lost']} skipped={d['skipped']} "
        f"deadlocks={d['deadlocks_retried']} lock_waits={d['lock_waits_retried']} "
        f"db_errors={d['db_errors']} {server}rate={d['rate']}/s in {d['seconds']}s"
    )


def add_up(figures: list[Figures], seconds: float) -> Figures:
    """Several workers' figures as one: counts summed, over ``seconds`` (a supervisor's run,
    during which its children came and went)."""
    total: Figures = {key: sum(each.get(key, 0) for each in figures)
                      for key in WorkerStats().as_dict() if key not in ("seconds", "rate")}
    total["seconds"] = round(seconds, 3)
    total["rate"] = round(total["processed"] / max(seconds, 1e-9), 1)
    return total


def summary_lines(found: list[tuple[str, Figures]]) -> list[str]:
    """The final summary's lines: one, or one per database alias when there are several."""
    if len(found) == 1:
        return [summary_line(found[0][1])]
    return [f"[{alias}] {summary_line(figures)}" for alias, figures in found]


class WorkerStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.claimed = 0
        #: Tasks run to their end here, whatever became of their ack (counted at once).
        self.ran = 0
        #: Successes whose ack was written (batched ones count once the acker wrote them).
        self.succeeded = 0
        #: Successes whose ack was never written: still claimed, they will run again.
        self.unacked = 0
        self.retried = 0
        self.dead = 0
        self.recovered = 0
        #: Claimed messages given back unrun (unstarted at a stop, or lost track of).
        self.released = 0
        self.db_errors = 0
        #: Given back because this worker didn't know the task (a rolling deploy).
        self.deferred = 0
        #: Finished, but the claim had been recovered by a peer meanwhile (it runs again).
        self.lost = 0
        #: Recovered by a peer before they started here: not run here.
        self.skipped = 0

    def ran_one(self) -> None:
        """A task ran to its end (its outcome is counted elsewhere): ``add(ran=1)``, cheaper."""
        with self._lock:
            self.ran += 1

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    @property
    def failed(self) -> int:
        """Failed attempts: retried ones plus the last one of each dead message."""
        return self.retried + self.dead

    @property
    def processed(self) -> int:
        """Attempts finished by this worker, whatever their outcome (or their ack's)."""
        return self.succeeded + self.unacked + self.failed

    def rate(self) -> float:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return self.processed / elapsed

    def as_dict(self) -> Figures:
        return {
            "processed": self.processed,
            "succeeded": self.succeeded,
            "unacked": self.unacked,
            "failed": self.failed,
            "retried": self.retried,
            "dead": self.dead,
            "recovered": self.recovered,
            "deferred": self.deferred,
            "lost": self.lost,
            "skipped": self.skipped,
            "released": self.released,
            "deadlocks_retried": broker.stats.deadlocks,
            "lock_waits_retried": broker.stats.lock_waits,
            "db_errors": self.db_errors,
            "seconds": round(time.monotonic() - self.started, 3),
            "rate": round(self.rate(), 1),
        }

    def summary(self, lag: broker.PurgeLag | None = None) -> str:
        """The counters on one line; with ``lag``, the server's purge lag before the rate."""
        return summary_line(self.as_dict(), f"{lag.fields()} " if lag is not None else "")

    def log_summary(self, worker_id: str) -> None:
        """Log the periodic summary, reading the purge lag now (only as often as this runs),
        and a WARNING while it is past ``PURGE_LAG_WARNING`` / ``…_SECONDS``."""
        lag = broker.purge_lag()
        logger.info("Worker %s: %s", worker_id, self.summary(lag))
        warning = lag.warning()
        if warning is not None:
            logger.warning("Worker %s: %s", worker_id, warning)
