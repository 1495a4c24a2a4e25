"""The backend's ``OPTIONS`` and the per-task options of ``@task(...)``.

Both take the same keys; a per-task value wins over the backend's, which wins over the
defaults: one attempt (Django's own backends never retry, so a task moved here from one
must not silently run three times), and ``MYSQLQ``'s backoff. Needs no Tasks framework.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from .. import limits
from ..conf import get_settings

#: Attempts of a Django task when neither it nor the backend's OPTIONS say: Django's
#: backends run a task once (``MYSQLQ['MAX_ATTEMPTS']`` is for ``@queue_task`` only).
DEFAULT_MAX_ATTEMPTS = 1


def _timeout_problem(value: object) -> str | None:
    return limits.seconds_problem(value, "timeout", zero=False)


def _retry_backoff_problem(value: object) -> str | None:
    return limits.seconds_problem(value, "retry_backoff")


#: Option name -> its validator (a problem sentence, or None when the value is fine).
VALIDATORS: dict[str, Callable[[object], str | None]] = {
    "max_attempts": limits.max_attempts_problem,
    "retry_backoff": _retry_backoff_problem,
    "timeout": _timeout_problem,
}


def value_problem(name: str, value: object) -> str | None:
    """What is wrong with one option's value (None means 'not set', which is fine)."""
    return None if value is None else VALIDATORS[name](value)


def queue_problem(queue: object) -> str | None:
    """What is wrong with a queue name, for this queue (workers take comma lists)."""
    return limits.queue_problem(queue, "A queue name")


def run_after_problem(run_after: object, now: dt.datetime) -> str | None:
    """What is wrong with a ``run_after`` the framework let through (None: run now)."""
    return None if run_after is None else limits.run_at_problem(run_after, now, "run_after")


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """Validated ``OPTIONS``; None means 'use the default' (see ``resolved``)."""

    max_attempts: int | None = None
    retry_backoff: float | None = None
    timeout: float | None = None
    #: Sentences for invalid values (the backend refuses to enqueue while there are any).
    problems: tuple[str, ...] = ()
    #: Keys that are not options at all.
    unknown: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: object) -> BackendOptions:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            return cls(problems=(f"OPTIONS must be a dict, not {type(raw).__name__}.",))
        values: dict[str, Any] = {}
        problems: list[str] = []
        unknown: list[str] = []
        for key, value in raw.items():
            if key not in VALIDATORS:
                unknown.append(str(key))
                continue
            problem = value_problem(key, value)
            if problem:
                problems.append(problem)
            elif value is not None:
                values[key] = value if key == "max_attempts" else float(value)
        return cls(**values, problems=tuple(problems), unknown=tuple(unknown))

    def resolved(self, task: object) -> tuple[int, float, float | None]:
        """``(max_attempts, retry_backoff, timeout)`` for a task: its own values first."""
        conf = get_settings()

        def pick(name: str, default: Any) -> Any:
            own = getattr(task, name, None)
            if own is not None:
                return own
            mine = getattr(self, name)
            return default if mine is None else mine

        timeout = pick("timeout", None)
        return (int(pick("max_attempts", DEFAULT_MAX_ATTEMPTS)),
                float(pick("retry_backoff", conf.RETRY_BACKOFF)),
                None if timeout is None else float(timeout))
