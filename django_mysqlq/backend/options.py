"""The backend's ``OPTIONS`` and the per-task options of ``@task(...)``.

Both take the same keys; a per-task value wins over the backend's, which wins over
``MYSQLQ``'s defaults. Needs no Tasks framework.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..conf import get_settings
from ..tasks import QUEUE_NAME_MAX


def _max_attempts_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"max_attempts must be an integer >= 1 (total runs, the first included), " \
               f"not {value!r}."
    return None


def _retry_backoff_problem(value: object) -> str | None:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        return f"retry_backoff must be a number of seconds >= 0, not {value!r}."
    return None


def _timeout_problem(value: object) -> str | None:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        return f"timeout must be a number of seconds > 0, not {value!r}."
    return None


#: Option name -> its validator (a problem sentence, or None when the value is fine).
VALIDATORS: dict[str, Callable[[object], str | None]] = {
    "max_attempts": _max_attempts_problem,
    "retry_backoff": _retry_backoff_problem,
    "timeout": _timeout_problem,
}


def value_problem(name: str, value: object) -> str | None:
    """What is wrong with one option's value (None means 'not set', which is fine)."""
    return None if value is None else VALIDATORS[name](value)


def queue_problem(queue: object) -> str | None:
    """What is wrong with a queue name, for this queue (workers take comma lists)."""
    if not isinstance(queue, str) or not queue or len(queue) > QUEUE_NAME_MAX or "," in queue:
        return (f"Queue names must be non-empty strings of at most {QUEUE_NAME_MAX} "
                f"characters without commas, not {queue!r}.")
    return None


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """Validated ``OPTIONS``; None means 'use the MYSQLQ default'."""

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
        return (int(pick("max_attempts", conf.MAX_ATTEMPTS)),
                float(pick("retry_backoff", conf.RETRY_BACKOFF)),
                None if timeout is None else float(timeout))
