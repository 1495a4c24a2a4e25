"""SIGTERM/SIGINT handling: the first asks for a graceful stop, the second exits at once."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("django_mysqlq")

#: Exit status after a second signal: claims are left for peers to recover.
FORCED_EXIT_STATUS = 1
#: Seconds past ``GRACE_SECONDS`` a graceful stop may take to write what finished (its
#: last acks, releases, deregistration): each statement is bounded so the stop ends
#: by then even when the database hangs on a lock or is gone.
STOP_STATEMENT_SECONDS = 5.0


class StopRequest:
    """Set by the first signal; the worker loop polls ``is_set`` and wakes on ``wakeup``."""

    def __init__(self, wakeup: threading.Event,
                 on_force: Callable[[], None] | None = None) -> None:
        #: Set once a stop is asked for: what waiting task threads watch.
        self.event = threading.Event()
        self._wakeup = wakeup
        self._on_force = on_force
        self.signal_name = ""

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self, reason: str) -> None:
        self.signal_name = reason
        self.event.set()
        self._wakeup.set()

    def install(self) -> None:
        """Install handlers (main thread only: Python delivers signals there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.event.is_set():
            logger.warning("Second %s: exiting now; claimed messages that had not started go "
                           "back to the queue, peers will recover the running ones.", name)
            if self._on_force is not None:
                self._on_force()  # releases what had not started, deregisters, exits
            logging.shutdown()
            os._exit(FORCED_EXIT_STATUS)
        logger.info("%s received: no new claims; finishing in-flight tasks "
                    "(send it again to exit at once).", name)
        self.set(name)
