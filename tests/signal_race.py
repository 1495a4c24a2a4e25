"""Test rig: a worker's SIGTERM delivered while its control loop holds its wake-up's lock.

Loaded by tests/settings.py in a worker subprocess when ``MYSQLQ_TEST_SIGNAL_RACE`` is
set. Python runs a signal handler on the main thread between two of its bytecodes,
wherever that thread is: also inside ``threading.Event.clear()``, which the control loop
calls at the top of every round and which holds the event's (non-reentrant) lock for a
few bytecodes. On a busy worker that window is rare but real (CI hit it once); this rig
makes it certain. After the worker gets ``SIGUSR1`` the next round's ``wakeup.clear()``
sends the process SIGTERM from inside that lock and gives the handler its chance to run
there before letting go. Test code only: the library is not patched.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType

_armed = False
_fired = False
_plain_clear = threading.Event.clear


def _arm(signum: int, frame: FrameType | None) -> None:
    global _armed
    _armed = True


def _clear(event: threading.Event) -> None:
    global _fired
    caller = sys._getframe(1).f_code.co_name
    if not _armed or _fired or caller != "_loop" \
            or threading.current_thread() is not threading.main_thread():
        _plain_clear(event)
        return
    _fired = True
    with event._cond:  # type: ignore[attr-defined]  # what Event.clear() holds
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes: the handler runs at one of them
            pass
        time.sleep(0.05)
        event._flag = False  # type: ignore[attr-defined]


def install() -> None:
    signal.signal(signal.SIGUSR1, _arm)
    threading.Event.clear = _clear  # type: ignore[method-assign, assignment]
