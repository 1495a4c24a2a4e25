"""Where a worker's log goes, following Django's conventions: ``LOGGING`` decides.

If anything already gives the ``django_mysqlq`` logger a handler (on the logger itself or
on an ancestor it propagates to, the root logger included), the worker adds nothing: the
project's ``LOGGING`` shows its records, formatted its way. Otherwise it adds one stderr
handler to the ``django_mysqlq`` logger only, never to the root logger (a root handler
would print every ``django.*`` record a second time where Django's own console handler
prints it too), at the level ``--verbosity`` asks for.
"""

from __future__ import annotations

import logging

from ..log import TEXT_FORMAT, JSONFormatter

LOGGER_NAME = "django_mysqlq"
#: ``--verbosity`` → level of the handler the worker installs.
LEVELS = {0: logging.WARNING, 1: logging.INFO}


def _handlers_above(logger: logging.Logger) -> list[logging.Handler]:
    """Every handler a record of ``logger`` reaches (``Logger.hasHandlers``'s walk)."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    return found


def configure(verbosity: int, log_format: str) -> str | None:
    """Give ``django_mysqlq`` a handler unless something shows its records already.

    Returns a note for the caller to log when ``json`` was asked for but the project's
    own handlers format the records (their formatters are kept), else None.
    """
    logger = logging.getLogger(LOGGER_NAME)
    existing = _handlers_above(logger)
    if existing:
        if log_format == "json" and not all(isinstance(handler.formatter, JSONFormatter)
                                            for handler in existing):
            return ("JSON logs were asked for (--log-format json or MYSQLQ['LOG_FORMAT']), "
                    "but LOGGING already gives the django_mysqlq logger handlers, and their "
                    "formatters are kept: set {'()': 'django_mysqlq.log.JSONFormatter'} as "
                    "their formatter instead (see docs/worker.md#logging).")
        return None
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    level = LEVELS.get(verbosity, logging.DEBUG)
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.setLevel(level)
    return None
