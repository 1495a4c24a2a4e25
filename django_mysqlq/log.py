"""Log formatting for workers and log shippers: a JSON formatter, and cutting error text.

``JSONFormatter`` is importable for a project's own ``LOGGING``::

    "formatters": {"json": {"()": "django_mysqlq.log.JSONFormatter"}}

It writes one JSON object per record, on one line: ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, ``pid``, then every field the record was given through
``extra=`` (a worker's attempt lines carry ``task``, ``message_id``, ``queue``,
``attempt``, ``max_attempts``, ``outcome``, ``duration_ms``, and on failure
``error_class`` and ``error``), then ``traceback`` when the record has one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
#: A kind of error: its class name and the server's error code (None without one).
ErrorKind = tuple[str, int | None]

#: The text format of the handler ``runqueueworker`` installs when nothing else shows its logs.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Longest error text in one log line; the history row keeps up to 10,000 characters.
ERROR_TEXT_MAX = 500
#: Longest traceback in the log (its last part is kept); history keeps up to 60,000.
TRACEBACK_MAX = 10_000
#: Longest error text kept for a failing thing's episode (a worker's row shows it).
EPISODE_ERROR_MAX = 300

#: Attributes every LogRecord has: anything else on a record came through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime"}


def quietly(log: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """``log(*args, **kwargs)`` (a logger's method), where a handler or filter that
    raises (a webhook handler's network error: ``Handler.handle`` does not catch what a
    custom ``emit`` raises) is said on stderr instead of raised into the caller. The
    acker and the task threads log from loops that must not end over a log line: a
    dead acker held its successes' claims for good, a dead task thread its message."""
    try:
        log(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever a user's handler raises
        try:
            sys.stderr.write(f"django_mysqlq: a logging handler raised {type(exc).__name__}: "
                             f"{one_line(str(exc))} (that log line is lost; the worker goes "
                             "on)\n")
        except Exception:  # noqa: BLE001 - stderr closed: nothing left to tell
            pass


def one_line(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text`` on one line (line breaks written as ``\\n``), cut after ``limit`` characters."""
    flat = text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]}… (cut from {len(flat):,} characters)"


def cut_traceback(text: str, limit: int = TRACEBACK_MAX, line_limit: int = ERROR_TEXT_MAX
                  ) -> str:
    """A traceback fit for a log: each line cut to ``line_limit``, the last ``limit`` kept."""
    lines = [line if len(line) <= line_limit
             else f"{line[:line_limit]}… (cut from {len(line):,} characters)"
             for line in text.rstrip("\n").split("\n")]
    joined = "\n".join(lines)
    if len(joined) <= limit:
        return joined
    return f"… (the first {len(joined) - limit:,} characters cut)\n{joined[-limit:]}"


def error_kind(exc: BaseException) -> ErrorKind:
    """The kind of ``exc`` a lasting failure is logged once for: its class and code."""
    code = exc.args[0] if exc.args else None
    return type(exc).__name__, code if isinstance(code, int) else None


@dataclasses.dataclass(frozen=True)
class Episode(Generic[K]):
    """One thing failing now: since when (UTC) and its latest error, on one line."""

    key: K
    since: dt.datetime
    error: str


class Failures(Generic[K]):
    """What keeps failing (a topic's read, an upkeep step, a group's pump), and how.

    A loop that tries again every round would log a lasting cause at every round: with
    this, each thing's failure is said once per kind of error, and its end once. Its
    episodes (since when, the latest error) are read by another thread for the worker's
    row, hence the lock.
    """

    def __init__(self) -> None:
        self._kinds: dict[K, set[ErrorKind]] = {}
        self._since: dict[K, dt.datetime] = {}
        self._latest: dict[K, str] = {}
        self._lock = threading.Lock()

    def failed(self, key: K, exc: BaseException) -> bool:
        """Note that ``key`` failed with ``exc``; whether this kind is new for it (log it)."""
        with self._lock:
            kinds = self._kinds.setdefault(key, set())
            self._since.setdefault(key, dt.datetime.now(dt.UTC))
            self._latest[key] = one_line(str(exc) or type(exc).__name__, EPISODE_ERROR_MAX)
            kind = error_kind(exc)
            if kind in kinds:
                return False
            kinds.add(kind)
            return True

    def recovered(self, key: K) -> bool:
        """Note that ``key`` works; whether it was failing (log that it works again)."""
        with self._lock:
            self._since.pop(key, None)
            self._latest.pop(key, None)
            return self._kinds.pop(key, None) is not None

    def kinds(self, key: K) -> frozenset[ErrorKind]:
        """The kinds of error ``key`` has failed with since it last worked."""
        with self._lock:
            return frozenset(self._kinds.get(key, ()))

    def __contains__(self, key: object) -> bool:
        return key in self._kinds

    def keys(self) -> list[K]:
        """What is failing now."""
        with self._lock:
            return list(self._kinds)

    def episodes(self) -> list[Episode[K]]:
        """What is failing now, each since when and with its latest error, oldest first."""
        with self._lock:
            found = [Episode(key, self._since[key], self._latest[key]) for key in self._kinds]
        return sorted(found, key=lambda episode: episode.since)


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, pid, the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        trace = self._traceback(record)
        if trace:
            entry["traceback"] = trace
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)

    def _traceback(self, record: logging.LogRecord) -> str:
        # A record may carry its traceback already formatted (and cut): the worker's do.
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        return record.exc_text or ""
