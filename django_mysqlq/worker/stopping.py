"""Stop signals: the first heard asks for a graceful stop, the second exits at once.

SIGTERM, SIGINT and SIGHUP are heard from an operator, a terminal or a process manager.
A supervisor's children also take the supervisor's own requests, on signals of their
own (``DRAIN_SIGNAL``, ``EXIT_SIGNAL``): a stop sent to the whole process group (Ctrl-C,
``kill -TERM -<pgid>``, systemd's control group, supervisord's ``stopasgroup``) reaches
a child itself and then as the supervisor's forward, and that forward must not count as
a second signal. Only signals heard count: a stop the worker began on its own
(``--max-memory``) or at the supervisor's request leaves the first SIGTERM a first one.

Python runs a signal handler on the main thread between two of its bytecodes, wherever
that thread is: also in the middle of ``wakeup.clear()`` or ``wakeup.wait()``, which hold
the event's lock (not reentrant) for a few bytecodes, or in a queue's ``put``, or a
logging handler's ``emit``. A handler that takes such a lock waits for ever for its own
thread. So the handler takes none: it notes the signal and writes a byte to a pipe; a
thread of its own (``mysqlq-signals``) reads it, logs, and sets the stop and the wake-up
from outside the main thread, which lets go of its lock a few bytecodes later. (A CI
worker SIGTERMed just after a server restart hung that way, its log ending at "SIGTERM
received", its claims left to run out their leases.)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..log import quietly

logger = logging.getLogger("django_mysqlq")

#: Exit status after a second signal: claims are left for peers to recover.
FORCED_EXIT_STATUS = 1
#: Seconds past ``GRACE_SECONDS`` a graceful stop may take to write what finished (its
#: last acks, releases, deregistration): each statement is bounded so the stop ends
#: by then even when the database hangs on a lock or is gone.
STOP_STATEMENT_SECONDS = 5.0
#: Heard from outside: the first drains, the second exits at once. (SIGHUP: the terminal
#: or session went away; one ignored from the start, as under ``nohup``, stays ignored.)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The supervisor asks its children to drain (never counted as a second signal); Linux
#: sends it too when the supervisor dies.
DRAIN_SIGNAL = signal.SIGUSR1
#: The supervisor heard a second signal: its children exit at once.
EXIT_SIGNAL = signal.SIGUSR2
#: What a supervisor blocks while it forks, so a child takes none before its handlers.
CHILD_SIGNALS = (*STOP_SIGNALS, DRAIN_SIGNAL, EXIT_SIGNAL)
#: ``StopRequest.signal_name`` of a stop the supervisor asked for.
SUPERVISOR_STOP = "supervisor"


def install_handlers(handler: Callable[[int, FrameType | None], Any],
                     supervised: bool = False) -> None:
    """``handler`` for the stop signals (and, in a supervisor's child, for its requests).

    A child was forked with them blocked (``CHILD_SIGNALS``): they are let through once
    its handlers are in place, so one sent during its start drains it instead of
    killing it (the default action of each)."""
    for signum in STOP_SIGNALS:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup: meant to outlive its terminal
        signal.signal(signum, handler)
    if supervised:
        signal.signal(DRAIN_SIGNAL, handler)
        signal.signal(EXIT_SIGNAL, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)


#: The reason a worker gives itself for stopping past ``--max-memory``: its process is to
#: be replaced (a supervisor starts a new child).
RECYCLE_REASON = "max-memory"


class StopRequest:
    """Set by the first signal; the worker loop polls ``is_set`` and wakes on ``wakeup``."""

    def __init__(self, wakeup: threading.Event,
                 on_force: Callable[[], None] | None = None,
                 on_stop: Callable[[str], None] | None = None) -> None:
        #: Set once a stop is asked for: what waiting task threads watch.
        self.event = threading.Event()
        self._wakeup = wakeup
        self._on_force = on_force
        #: Called with the reason once a signal asked for a stop (off the main thread).
        self._on_stop = on_stop
        self.signal_name = ""
        #: The first stop signal heard, written by the handler: a plain attribute, no lock.
        self._heard = ""
        #: The supervisor asked for a drain (``DRAIN_SIGNAL``).
        self._drain_asked = False
        #: The pipe's end the handler writes to (``install``).
        self._notify_fd: int | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self, reason: str) -> None:
        self.signal_name = reason
        self.event.set()
        self._wakeup.set()

    def install(self, supervised: bool = False) -> None:
        """Install handlers (main thread only: Python delivers signals there);
        ``supervised``: a supervisor's child, which takes its requests too."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self._notify_fd is None:
            read_fd, self._notify_fd = os.pipe()
            os.set_blocking(self._notify_fd, False)
            threading.Thread(target=self._relay, args=(read_fd,), name="mysqlq-signals",
                             daemon=True).start()
        install_handlers(self._handle, supervised)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """On the main thread, wherever it was: takes no lock (see the module's doc)."""
        if signum == EXIT_SIGNAL:
            self._force("The supervisor's second signal")
        if signum == DRAIN_SIGNAL:
            if self._drain_asked or self._heard or self.event.is_set():  # (no lock)
                return  # stopping already: the same stop heard twice, not a second one
            self._drain_asked = True
            self._notify(b"d", "")
            return
        name = signal.Signals(signum).name
        if self._heard:
            self._force(f"Second {name}")
        self._heard = name
        self._notify(b"h", name)

    def _force(self, what: str) -> None:
        logger.warning("%s: exiting now; claimed messages that had not started go back to "
                       "the queue, peers will recover the running ones.", what)
        if self._on_force is not None:
            self._on_force()  # releases what had not started, deregisters, exits
        logging.shutdown()
        os._exit(FORCED_EXIT_STATUS)

    def _notify(self, kind: bytes, name: str) -> None:
        if self._notify_fd is None:  # (not installed by install(): called directly)
            self._stop(name)
            return
        try:
            os.write(self._notify_fd, kind)
        except OSError:  # the pipe full: the relay has plenty to read already
            pass

    def _relay(self, read_fd: int) -> None:
        """Each signal's work, on a thread of its own: log, then stop and wake."""
        while True:
            kind = os.read(read_fd, 1)  # (the write end stays open for the process)
            if not kind:
                return
            self._stop(self._heard if kind == b"h" else "")

    def _stop(self, name: str) -> None:
        """``name``: the signal heard; empty when the supervisor asked."""
        before = self.signal_name if self.event.is_set() else ""
        if not before:
            self.set(name or SUPERVISOR_STOP)  # (first: a logger that raises must not lose it)
            if self._on_stop is not None:
                self._on_stop(name or SUPERVISOR_STOP)
        if not name:
            quietly(logger.info, "The supervisor asked for a stop: no new claims; finishing "
                    "in-flight tasks.")
        elif before:
            quietly(logger.info, "%s received while stopping already (%s): finishing "
                    "in-flight tasks (send it again to exit at once).", name, before)
        else:
            quietly(logger.info, "%s received: no new claims; finishing in-flight tasks "
                    "(send it again to exit at once).", name)
