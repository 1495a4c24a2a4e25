"""Messages that were lost with a worker once run alone in their process.

A task that kills its process (``os._exit``, an OOM kill, a segfault in a C extension)
takes every task running beside it down too. So a message whose worker vanished before
(``losses > 0``) waits until nothing else runs in this process and holds new starts
back while it runs: if it is the culprit, it can only take itself down.
"""

from __future__ import annotations

import threading

#: How often a waiting thread looks at the stop request.
WAIT_SLICE_SECONDS = 0.2


class SoloGate:
    """A readers-writer gate: ordinary tasks share the process, a solo message is alone.

    Solo messages go first: once one waits, no ordinary task starts until it has run.
    """

    def __init__(self, cancelled: threading.Event) -> None:
        self._cancelled = cancelled
        #: The condition's own lock, taken directly where nothing waits or is notified:
        #: a plain lock's ``with`` is C code, the condition's two Python calls.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._running = 0
        self._solo_waiting = 0
        self._solo_running = False

    @property
    def solo_pending(self) -> bool:
        """A solo message waits or runs: claiming more would only add to what it risks."""
        with self._lock:
            return self._solo_running or self._solo_waiting > 0

    def _blocked(self, solo: bool) -> bool:
        if self._solo_running:
            return True
        return self._running > 0 if solo else self._solo_waiting > 0

    def enter(self, solo: bool) -> bool:
        """Wait for this task's turn; False (run nothing, don't ``leave``) if a stop came
        first. Every True must be followed by ``leave`` with the same ``solo``."""
        if not solo:
            with self._lock:
                if not self._solo_running and not self._solo_waiting:
                    self._running += 1  # the common case: no solo message anywhere
                    return True
        with self._cond:
            if solo:
                self._solo_waiting += 1
            try:
                while self._blocked(solo):
                    if self._cancelled.is_set():
                        return False
                    self._cond.wait(WAIT_SLICE_SECONDS)
                if solo:
                    self._solo_running = True
                else:
                    self._running += 1
                return True
            finally:
                if solo:
                    self._solo_waiting -= 1
                    self._cond.notify_all()  # one that gave up may unblock the others

    def leave(self, solo: bool) -> None:
        with self._lock:  # (the condition's lock: notify_all below may be called)
            if solo:
                self._solo_running = False
            else:
                self._running -= 1
            if self._solo_waiting or solo:
                self._cond.notify_all()
