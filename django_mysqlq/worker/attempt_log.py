"""One log line per finished attempt, on the ``django_mysqlq.attempts`` logger.

``task=… id=… queue=… attempt=2/5 outcome=retried duration_ms=… error=ValueError: …``:
fields in this order, the failure's text cut to one line of ``log.ERROR_TEXT_MAX``
characters (history keeps the full text). The level follows the outcome: a success is
INFO, a retry, deferral or lost attempt WARNING, a death ERROR with the traceback. The
same fields travel as ``extra=``, for ``log.JSONFormatter`` and log shippers.
"""

from __future__ import annotations

import logging
import time

from ..log import cut_traceback, one_line, quietly
from ..messages import AttemptResult, ClaimedMessage
from ..models import Outcome

logger = logging.getLogger("django_mysqlq.attempts")

LEVELS = {
    Outcome.SUCCEEDED: logging.INFO,
    Outcome.RETRIED: logging.WARNING,
    Outcome.DEFERRED: logging.WARNING,
    Outcome.LOST: logging.WARNING,
    Outcome.FAILED: logging.ERROR,
}


def error_name(error_class: str) -> str:
    """``builtins.ValueError`` → ``ValueError``; other classes keep their module."""
    return error_class.removeprefix("builtins.")


class AttemptLine:
    """The log line of one attempt: started when the attempt starts, written once it ends."""

    def __init__(self, message: ClaimedMessage, began: float | None = None) -> None:
        """``began``: when the attempt started (``time.monotonic()``; default: now)."""
        self.message = message
        self._began = time.monotonic() if began is None else began
        self._ended: float | None = None

    def stop_clock(self) -> None:
        """The task's run ended: the duration stops here, whenever the line is written."""
        if self._ended is None:
            self._ended = time.monotonic()

    def write(self, outcome: str, result: AttemptResult | None = None, detail: str = "",
              error: BaseException | None = None) -> None:
        """Log the attempt's end. With ``error`` on a death, its traceback follows the line
        (cut; ``result.traceback`` is used when given)."""
        self.stop_clock()
        level = LEVELS.get(outcome, logging.WARNING)  # type: ignore[call-overload]
        if not logger.isEnabledFor(level):
            return
        ended = self._ended if self._ended is not None else time.monotonic()  # (for mypy)
        duration_ms = round((ended - self._began) * 1000, 1)
        message = self.message
        fields: dict[str, object] = {
            "task": message.task_name, "message_id": message.id, "queue": message.queue,
            "attempt": message.attempt, "max_attempts": message.max_attempts,
            "outcome": outcome, "duration_ms": duration_ms,
        }
        text = (f"task={message.task_name} id={message.id} queue={message.queue} "
                f"attempt={message.attempt}/{message.max_attempts} outcome={outcome} "
                f"duration_ms={duration_ms}")
        if result is not None and result.error_class:
            fields["error_class"] = result.error_class
            fields["error"] = one_line(result.error_message)
            text += f" error={error_name(result.error_class)}: {fields['error']}"
        if detail:
            fields["detail"] = detail
            text += f" detail={detail}"
        record = logger.makeRecord(logger.name, level, __file__, 0, "%s", (text,), None,
                                   extra=fields)
        if error is not None and outcome == Outcome.FAILED:
            # The real exception for handlers that read it (Sentry); the text, cut, for
            # every formatter: logging prints exc_text when it is already set.
            record.exc_info = (type(error), error, error.__traceback__)
            trace = result.traceback if result is not None and result.traceback else ""
            record.exc_text = cut_traceback(trace) if trace else None
        quietly(logger.handle, record)
