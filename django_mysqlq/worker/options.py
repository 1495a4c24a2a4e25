"""What one worker process is asked to do, validated once."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .. import limits
from ..conf import MAX_BATCH, get_settings
from .queues import resolve


def _check(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    #: Queues in claim order: the first that has ready messages is served first.
    queues: tuple[str, ...]
    #: Threads running tasks in this process.
    concurrency: int = 1
    #: Messages claimed by one statement (None: ``MYSQLQ['BATCH_SIZE']``).
    batch: int | None = None
    #: Drain the queues, then exit (status ``EXIT_DEAD`` if messages went dead meanwhile).
    burst: bool = False
    #: Stop after claiming this many messages (None: no limit).
    max_tasks: int | None = None
    #: With ``burst``: scheduled messages due within this many seconds are waited for.
    burst_wait: float = 5.0
    #: Stop gracefully (to be replaced) once resident memory passes this many MiB.
    max_memory_mb: int | None = None
    #: Process mode: a task past its timeout fails and this process exits to be replaced.
    kill_on_timeout: bool = False
    #: A supervisor's child: it takes the supervisor's drain and exit signals too
    #: (``stopping.DRAIN_SIGNAL``, ``EXIT_SIGNAL``).
    supervised: bool = False
    #: With ``burst``: exit 0 even if messages went dead during the run.
    exit_zero: bool = False
    #: Warn at start of queues no task uses and of ready work no worker serves (a
    #: supervisor does it once for its children).
    report_queues: bool = True
    #: The database alias whose queues this worker serves (None: ``MYSQLQ['DATABASE']``).
    #: ``databases.Workers`` gives each alias of the asked-for queues a worker of its own.
    database: str | None = None
    #: Whether this worker runs the process's broadcast subscriptions. A process serving
    #: several databases runs them once, in one of its workers (``databases.split``).
    broadcast: bool = True

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("Give at least one queue to work on.")
        for name in self.queues:
            _check(limits.queue_problem(name, "A queue name"))
        if len(set(self.queues)) != len(self.queues):
            raise ValueError(f"A queue is listed twice: {', '.join(self.queues)}.")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}.")
        if self.batch is not None:
            _check(limits.whole_problem(self.batch, "batch", 1, MAX_BATCH))
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks must be at least 1, not {self.max_tasks}.")
        if self.max_memory_mb is not None and self.max_memory_mb < 1:
            raise ValueError(f"max_memory must be at least 1 MiB, not {self.max_memory_mb}.")
        _check(limits.seconds_problem(self.burst_wait, "burst_wait"))

    @classmethod
    def build(cls, queues: Sequence[str] | None = None, **kwargs: object) -> WorkerOptions:
        """Options with ``queues`` (None or ``['*']``: every queue a known task uses)."""
        return cls(queues=resolve(queues), **kwargs)  # type: ignore[arg-type]

    @property
    def claim_batch(self) -> int:
        return self.batch if self.batch is not None else get_settings().BATCH_SIZE
