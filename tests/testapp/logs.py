"""A project's logging handler that fails (tests/settings.py, MYSQLQ_TEST_LOGGING=raising)."""

from __future__ import annotations

import logging


class RaisingOnAttempts(logging.Handler):
    """Raises from ``emit`` on every attempt line (records with an ``outcome``), as a
    handler posting to a webhook that is down would: ``Handler.handle`` lets it out."""

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "outcome"):
            raise ConnectionError("the log webhook is down")
