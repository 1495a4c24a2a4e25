"""Global rate limits as tasks declare them, and the rate key of one call.

``@queue_task(rate_limit="100/m", rate_limit_key=...)`` is checked once, when the task is
declared; ``.using(rate_limit_key=...)`` per call. The key comes from the arguments as a
concurrency key does (``gating``); without one, the whole task shares one key. A limit of
N per window W is kept as a spacing: starts of one key are at least W/N apart across all
workers (so no window of length W holds more than N), taken at claim time from the key's
row (``broker.rates``). Imports nothing of the package but ``gating`` and ``exceptions``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import gating
from .exceptions import InvalidTaskOptions

#: Seconds of each window unit.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: ``N/unit`` or ``N/<k>unit``: "100/m", "5/10s", "1000/h", "10/d".
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
#: Largest N, and the largest window (a week), of a rate limit.
RATE_MAX = 1_000_000
WINDOW_MAX_SECONDS = 7 * 86400
#: Shortest spacing between two starts of one key: each start is one short transaction.
INTERVAL_MIN_MICROS = 1000


@dataclasses.dataclass(frozen=True)
class TaskRate:
    """A task's rate limit as declared."""

    spec: str
    limit: int
    window: int
    #: Microseconds between two starts of one key (window / limit).
    interval_us: int
    #: Where a call's key comes from (None: ``fixed_key``, or given per call).
    source: gating.KeySource | None = None
    fixed_key: str | None = None
    signature: inspect.Signature | None = None


def parse(spec: object, task: str = "") -> tuple[int, int, int]:
    """``"100/m"`` -> (100, 60 seconds, 600000 microseconds between starts)."""
    where = f"{task}: " if task else ""
    match = _SPEC.match(spec) if isinstance(spec, str) else None
    problem = None
    if match is None:
        problem = "is not N/s, N/m, N/h or N/d (also N/<k>s etc., e.g. '5/10s')"
    else:
        limit, count, unit = int(match[1]), int(match[2] or 1), match[3]
        window = count * UNITS[unit]
        if not 1 <= limit <= RATE_MAX:
            problem = f"allows {limit} per window: give 1 to {RATE_MAX}"
        elif not 1 <= window <= WINDOW_MAX_SECONDS:
            problem = f"has a window of {window}s: give 1 second to 7 days"
        elif window * 1_000_000 // limit < INTERVAL_MIN_MICROS:
            problem = (f"is more than {1_000_000 // INTERVAL_MIN_MICROS} starts per second "
                       "per key")
    if problem is not None:
        raise InvalidTaskOptions(
            f"{where}rate_limit={spec!r} {problem}. A rate limit is a string like '100/m' "
            "(at most 100 starts in any minute, spread evenly: one every 0.6 s).")
    assert match is not None
    return limit, window, window * 1_000_000 // limit


def declare(func: Callable[..., Any], task: str, *, rate_limit: object,
            rate_limit_key: object, takes_context: bool = False) -> TaskRate | None:
    """Check a task's rate options; its rate (None if it declares none)."""
    if rate_limit is None:
        if rate_limit_key is not None:
            raise InvalidTaskOptions(f"{task}: rate_limit_key needs rate_limit='N/m' (or /s, "
                                     "/h, /d): how many starts of one key per window.")
        return None
    limit, window, interval = parse(rate_limit, task)
    if rate_limit_key is None:
        return TaskRate(str(rate_limit), limit, window, interval, fixed_key=task[-255:])
    source, signature = gating.key_source(func, rate_limit_key, "rate_limit_key", task,
                                          takes_context)
    return TaskRate(str(rate_limit), limit, window, interval, source, None, signature)


def for_call(rate: TaskRate | None, func: Callable[..., Any], task: str, args: Sequence[Any],
             kwargs: Mapping[str, Any], key: str | None) -> tuple[str, int] | None:
    """The rate key of one call and its spacing in microseconds (a per-call key wins)."""
    if rate is None:
        return None
    if key is not None:
        return key, rate.interval_us
    if rate.fixed_key is not None:
        return rate.fixed_key, rate.interval_us
    assert rate.source is not None
    return gating.key_of(rate.source, rate.signature, func, task, "rate_limit_key", args,
                         kwargs), rate.interval_us


def check_using(rate: TaskRate | None, task: str, key: object) -> str | None:
    """Check ``.using(rate_limit_key=...)`` against the task's rate."""
    if key is None:
        return None
    if rate is None:
        raise InvalidTaskOptions(f"{task}: .using(rate_limit_key=...) needs a task declared "
                                 "with rate_limit='N/m'.")
    return gating.checked_key(key, "rate_limit_key")


def check_alone(task: str, rate: TaskRate | None, gate: gating.TaskGate,
                cron: object) -> None:
    """A rate-limited task passes no other gate and has no schedule (not supported yet)."""
    if rate is None:
        return
    if gate.source is not None or gate.limit is not None or gate.fixed_key is not None:
        raise InvalidTaskOptions(
            f"{task}: rate_limit can't be combined with ordered_by or concurrency_limit "
            "(a message waits for one thing at a time); declare two tasks, one calling the "
            "other.")
    if cron is not None:
        raise InvalidTaskOptions(f"{task}: rate_limit can't be combined with cron=...: a "
                                 "schedule already says how often it runs.")

