"""What the harness did to the system, and when (host epoch seconds)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

#: Event kinds the harness inflicts, and the ones it only observes.
KILL = "kill9"
SIGTERM = "sigterm"
CONNECTION_KILL = "connection_kill"
RESTART = "restart"
NODE_KILL = "node_kill9"  # kill -9 of one Galera node (--galera), started again after a while
CRASHING_TASK = "crashing_task"  # a message of a task that kills its worker, enqueued
LOCKED_ROW = "locked_row"  # a ready row held FOR UPDATE by the harness for a while
CRASH = "crash"  # a worker that exited without being told to
STOP_OVERRUN = "stop_overrun"  # a SIGTERMed worker that had to be killed
STOP_STATUS = "stop_status"  # a SIGTERMed worker that exited with a non-zero status
#: A worker SIGTERMed before it had started (no handlers yet: the default action ended
#: it, before it registered, claimed or held anything): not an unclean stop.
STOPPED_STARTING = "stopped_starting"
#: Database outages: every claim held meanwhile may be taken back, any run may repeat.
OUTAGES = (RESTART, NODE_KILL)


@dataclasses.dataclass(frozen=True)
class Event:
    kind: str
    at: float
    pid: int | None = None
    #: End of the event for ones that last (a restart: when the server answered again).
    until: float | None = None
    detail: str = ""
    #: The database port a node kill took down (--galera).
    port: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EventLog:
    """Thread-safe, append-only."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, kind: str, pid: int | None = None, *, at: float | None = None,
            until: float | None = None, detail: str = "", port: int | None = None) -> Event:
        event = Event(kind, time.time() if at is None else at, pid, until, detail, port)
        with self._lock:
            self._events.append(event)
        return event

    def finish(self, event: Event, until: float, detail: str) -> None:
        """Record the end of a lasting event added when it began."""
        with self._lock:
            index = self._events.index(event)
            self._events[index] = dataclasses.replace(event, until=until, detail=detail)

    def all(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda event: event.at)

    def of(self, kind: str) -> list[Event]:
        return [event for event in self.all() if event.kind == kind]


def node_down_while_stopping(stop: Event, events: list[Event]) -> bool:
    """Whether the node a SIGTERMed worker used was killed (--galera) between its SIGTERM
    and the end of its stop: it could not ack nor deregister, so it could not stop
    cleanly, and its claims are recovered like a kill's (counted apart, not a failure)."""
    if stop.port is None:
        return False
    signalled = max((e.at for e in events if e.kind == SIGTERM and e.pid == stop.pid
                     and e.at <= stop.at), default=None)
    if signalled is None:
        return False
    return any(e.kind == NODE_KILL and e.port == stop.port
               and e.at <= stop.at and (e.until is None or e.until >= signalled)
               for e in events)


def node_down_during(downs: list[Event], start: float, end: float) -> bool:
    """Whether a Galera node was down (killed, not Synced again yet) at some time in
    [start, end]: a kill -9's orphans waiting for the sweep then, the sweeper may have
    been on that node, and a new one takes over only once its lease ran out."""
    return any(down.at <= end and (down.until is None or down.until >= start)
               for down in downs)
