"""What values the queue accepts: the ranges its columns and its clock arithmetic can hold.

One check per kind of value, shared by ``@queue_task``, ``.using()``, ``MYSQLQ``, the
Tasks backend and the operator commands, so they can't drift apart. Each returns a
sentence naming the option, the value and the valid range, or None when the value is
fine; callers raise their own error type with it (``InvalidTaskOptions``, ``E001``,
``InvalidTask``, ``CommandError``). Imports nothing of the package.
"""

from __future__ import annotations

import datetime as dt

MIN_PRIORITY, MAX_PRIORITY = -100, 100
#: The largest row id (BIGINT).
BIGINT_MAX = 2**63 - 1
QUEUE_NAME_MAX = 64
DEDUP_KEY_MAX = 255
#: Longest ordered subject or concurrency key (the gate key columns).
GATE_KEY_MAX = 255
#: Largest ``concurrency_limit``: messages of one key that may run at once.
CONCURRENCY_LIMIT_MAX = 1_000_000
#: Largest ``max_attempts``: far beyond any sane retry policy, and well inside the
#: column (PositiveIntegerField, up to 4,294,967,295).
MAX_ATTEMPTS_MAX = 1_000_000
#: Longest delay, retry backoff, timeout or interval: 100 years of 365.25 days. The
#: database gives up much later (``UTC_TIMESTAMP(6) + INTERVAL n MICROSECOND`` is NULL
#: past 9999-12-31, about 2.5e11 s from now), and so does ``threading`` (about 292
#: years), but nothing a queue does needs more.
MAX_SECONDS = 3_155_760_000
MAX_SECONDS_TEXT = f"{MAX_SECONDS} (100 years)"


def is_utf8(text: str) -> bool:
    """False for lone surrogates (e.g. from os.fsdecode), which utf8mb4 can't store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """``text`` as the utf8mb4 columns accept it: lone surrogates written as ``\\udcff``
    (the driver can't encode them, and the statement would fail on them)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def row_id(text: str) -> int | None:
    """``text`` as a row id, or None: ASCII digits that a BIGINT holds. (``int()`` of 4,301
    digits or more raises ValueError, and other scripts' digits pass ``isdigit()``; past
    BIGINT no row has the id anyway.) The admin's search boxes and page addresses, and
    the Tasks backend's result ids, read ids with it."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= BIGINT_MAX else None


def queue_problem(queue: object, option: str = "queue") -> str | None:
    """A queue name workers can serve: ``--queues`` splits on commas and strips names."""
    if (isinstance(queue, str) and queue and len(queue) <= QUEUE_NAME_MAX and "," not in queue
            and queue == queue.strip() and is_utf8(queue)):
        return None
    return (f"{option} must be a non-empty string of at most {QUEUE_NAME_MAX} characters, "
            "without commas or surrounding whitespace (runqueueworker --queues takes a "
            f"comma-separated list and strips each name), in valid UTF-8, not {queue!r}.")


def priority_problem(priority: object, option: str = "priority") -> str | None:
    if (isinstance(priority, bool) or not isinstance(priority, int)
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        return (f"{option} must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} "
                f"(higher runs first), not {priority!r}.")
    return None


def whole_problem(value: object, option: str, low: int, high: int) -> str | None:
    """An integer from ``low`` to ``high`` (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{option} must be an integer from {low} to {high}, not {value!r}."
    return None


def max_attempts_problem(value: object, option: str = "max_attempts") -> str | None:
    """Total runs, the first included: 1 to :data:`MAX_ATTEMPTS_MAX`."""
    if whole_problem(value, option, 1, MAX_ATTEMPTS_MAX) is None:
        return None
    return (f"{option} must be an integer from 1 to {MAX_ATTEMPTS_MAX} (total runs, the "
            f"first included), not {value!r}.")


def seconds_problem(value: object, option: str, *, zero: bool = True) -> str | None:
    """A finite number of seconds from 0 (or above 0) to :data:`MAX_SECONDS`.

    Compared without converting to float first: ``10**400`` is refused, not an
    ``OverflowError``; NaN fails every comparison, so it is refused too.
    """
    if (not isinstance(value, bool) and isinstance(value, int | float)
            and (0 <= value if zero else 0 < value) and value <= MAX_SECONDS):
        return None
    span = (f"from 0 to {MAX_SECONDS_TEXT}" if zero
            else f"greater than 0 and at most {MAX_SECONDS_TEXT}")
    return f"{option} must be a finite number of seconds {span}, not {value!r}."


def delay_problem(delay: object, option: str = "delay") -> str | None:
    """Seconds (a number or a timedelta) from 0 to :data:`MAX_SECONDS`."""
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else delay
    if seconds_problem(seconds, option) is None:
        return None
    return (f"{option} must be a number of seconds or a timedelta from 0 to "
            f"{MAX_SECONDS_TEXT}, not {delay!r}.")


def run_at_problem(run_at: object, now: dt.datetime, option: str = "run_at") -> str | None:
    """A timezone-aware datetime that exists in UTC, at most :data:`MAX_SECONDS` from now.

    Any past time is fine (the message is ready at once); year 1 is the earliest the
    UTC conversion allows.
    """
    if not isinstance(run_at, dt.datetime) or run_at.utcoffset() is None:
        return (f"{option} must be a timezone-aware datetime (use django.utils.timezone.now() "
                f"+ ...), not {run_at!r}.")
    latest = now.astimezone(dt.UTC) + dt.timedelta(seconds=MAX_SECONDS)
    try:
        in_utc = run_at.astimezone(dt.UTC)
    except OverflowError:  # before year 1 or after 9999 once in UTC
        in_utc = None
    if in_utc is None or in_utc > latest:
        return (f"{option} must lie between year 1 (in UTC) and 100 years from now "
                f"({latest:%Y-%m-%d}), not {run_at!r}.")
    return None


def optional_seconds_problem(value: object, option: str) -> str | None:
    """None (turned off) or a number of seconds greater than 0 (retention settings)."""
    return None if value is None else seconds_problem(value, option, zero=False)


def unique_for_problem(value: object, option: str = "unique_for") -> str | None:
    """Whole seconds from 0 to :data:`MAX_SECONDS` (a timedelta of whole seconds too).

    0 is 'unique while queued'; a float is refused rather than rounded, so that a
    period is exactly what the code says.
    """
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, float) and seconds.is_integer() and isinstance(value, dt.timedelta):
        seconds = int(seconds)
    if whole_problem(seconds, option, 0, MAX_SECONDS) is None:
        return None
    return (f"{option} must be a whole number of seconds (an int, or a timedelta of whole "
            f"seconds) from 0 (unique while queued) to {MAX_SECONDS_TEXT}, not {value!r}.")


def unique_for_seconds(value: dt.timedelta | int) -> int:
    """A ``unique_for`` that passed :func:`unique_for_problem`, in seconds."""
    return int(value.total_seconds()) if isinstance(value, dt.timedelta) else int(value)
