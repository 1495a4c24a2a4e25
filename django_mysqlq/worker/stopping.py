"""SIGTERM/SIGINT handling: the first asks for a graceful stop, the second exits at once.

Only signals heard count: a stop the worker began on its own (``--max-memory``) leaves
the first SIGTERM a first one, which drains too.

Python runs a signal handler on the main thread between two of its bytecodes, wherever
that thread is: also in the middle of ``wakeup.clear()`` or ``wakeup.wait()``, which hold
the event's lock (not reentrant) for a few bytecodes, or in a queue's ``put``, or a
logging handler's ``emit``. A handler that takes such a lock waits for ever for its own
thread. So the first signal's handler takes none: it notes the signal and writes a byte
to a pipe; a thread of its own (``mysqlq-signals``) reads it, logs, and sets the stop
and the wake-up from outside the main thread, which lets go of its lock a few bytecodes
later. (A CI worker SIGTERMed just after a server restart hung that way, its log ending
at "SIGTERM received", its claims left to run out their leases.)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from ..log import quietly

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
        #: The first signal's name, written by the handler: a plain attribute, no lock.
        self._heard = ""
        #: The pipe's end the handler writes to (``install``).
        self._notify_fd: int | None = None

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
        if self._notify_fd is None:
            read_fd, self._notify_fd = os.pipe()
            os.set_blocking(self._notify_fd, False)
            threading.Thread(target=self._relay, args=(read_fd,), name="mysqlq-signals",
                             daemon=True).start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """On the main thread, wherever it was: takes no lock (see the module's doc)."""
        name = signal.Signals(signum).name
        if self._heard:
            logger.warning("Second %s: exiting now; claimed messages that had not started go "
                           "back to the queue, peers will recover the running ones.", name)
            if self._on_force is not None:
                self._on_force()  # releases what had not started, deregisters, exits
            logging.shutdown()
            os._exit(FORCED_EXIT_STATUS)
        self._heard = name
        if self._notify_fd is None:  # (not installed by install(): called directly)
            self._stop(name)
            return
        try:
            os.write(self._notify_fd, b"\0")
        except OSError:  # the pipe full: a byte waits already
            pass

    def _relay(self, read_fd: int) -> None:
        """The first signal's work, on a thread of its own: log, then stop and wake."""
        try:
            heard = os.read(read_fd, 1)  # (the write end stays open for the process)
        finally:
            os.close(read_fd)
        if heard:
            self._stop(self._heard)

    def _stop(self, name: str) -> None:
        before = self.signal_name if self.event.is_set() else ""
        if before:
            quietly(logger.info, "%s received while stopping already (%s): finishing "
                    "in-flight tasks (send it again to exit at once).", name, before)
            return
        self.set(name)  # (first: a logging handler that raises must not lose the stop)
        quietly(logger.info, "%s received: no new claims; finishing in-flight tasks "
                "(send it again to exit at once).", name)
