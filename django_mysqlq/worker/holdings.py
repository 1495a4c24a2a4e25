"""What a worker process holds: claimed messages waiting for a task thread, and running ones.

The control thread adds claims, checks them against the database through lease renewals
and records which started; task threads take messages one at a time and ask, just before
starting one, whether it is still theirs to run. A claim a peer recovered (this worker's
connection was killed, its lease ran out) must not start here too: the peer runs it.
Bookkeeping only, no SQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..messages import ClaimedMessage
from ..tasks import AttemptScope, QueueTask

Pair = tuple[int, str]


@dataclasses.dataclass
class RunningTask:
    message: ClaimedMessage
    started: float  # monotonic
    started_at: dt.datetime  # database clock, for history
    reported: bool = False
    #: Its start is recorded in the database (recovery then counts its attempt).
    marked: bool = False
    #: Its task returned or raised, and its thread settles the attempt: a timeout's abort
    #: leaves it be (``Holdings.abort``).
    ending: bool = False
    #: Failed for its timeout by the control thread: its thread records nothing of it.
    aborted: bool = False
    #: Its task and its attempt's scope, once its thread is about to start it
    #: (``Holdings.began``): for a timeout's abort to send its ``task_finished``.
    task: QueueTask[Any, Any] | None = None
    scope: AttemptScope | None = None


class Verdict(enum.Enum):
    START = "start"
    #: A peer recovered the claim: the message is not ours to run any more.
    LOST = "lost"
    #: The worker is stopping: give the message back unstarted.
    STOPPING = "stopping"


def pair(message: ClaimedMessage) -> Pair:
    return (message.id, message.claim_token)


class Holdings:
    """Claimed messages from their claim to their end, as this process knows them."""

    def __init__(self, stopping: threading.Event, wakeup: threading.Event,
                 fresh_seconds: float, clock: Callable[[], dt.datetime]) -> None:
        self._stopping = stopping
        #: Now on the database's clock: when a message starts.
        self._clock = clock
        #: Set to have the control loop check the claims now.
        self._wakeup = wakeup
        #: Claims checked longer ago than this (the process was paused, the control loop
        #: stuck) are checked again before anything more starts: their leases may have run
        #: out and a peer taken them.
        self._fresh_seconds = fresh_seconds
        self._inbox: queue.Queue[ClaimedMessage | None] = queue.Queue()
        self._lock = threading.Lock()
        #: Taken by a task thread, not started yet (waiting for its turn).
        self._waiting: dict[int, ClaimedMessage] = {}
        self._running: dict[int, RunningTask] = {}
        self._given_back: list[ClaimedMessage] = []
        #: Taken for release whose release is not known to have been written yet: a second
        #: signal arriving meanwhile releases them again (a release is idempotent).
        self._releasing: dict[Pair, ClaimedMessage] = {}
        self._in_flight = 0
        self._lost: set[Pair] = set()
        #: Cleared when the control connection failed: until the claims are checked again
        #: on a new connection, nothing new starts (a peer may be recovering them).
        self._verified = threading.Event()
        self._verified.set()
        self._verified_at = time.monotonic()

    # ------------------------------------------------------------------ control thread

    @property
    def in_flight(self) -> int:
        """Messages claimed and not finished: queued, waiting or running.

        Read without the lock: one attribute read is atomic, and it is read after every
        message (its writers hold the lock)."""
        return self._in_flight

    def add(self, messages: list[ClaimedMessage]) -> None:
        with self._lock:
            self._in_flight += len(messages)
        for message in messages:
            self._inbox.put(message)

    def held_pairs(self) -> list[Pair]:
        """(id, token) of every claim held here and not finished."""
        with self._inbox.mutex:
            queued = [pair(m) for m in self._inbox.queue if m is not None]
        with self._lock:
            return [*queued, *(pair(m) for m in self._waiting.values()),
                    *(pair(t.message) for t in self._running.values())]

    def held_queues(self) -> Counter[str]:
        """Claims held here and not finished, counted by queue (the claim order of a
        worker's groups: ``TopicDuty.claim_order``)."""
        with self._inbox.mutex:
            queued = [m.queue for m in self._inbox.queue if m is not None]
        with self._lock:
            return Counter([*queued, *(m.queue for m in self._waiting.values()),
                            *(t.message.queue for t in self._running.values())])

    def has_unstarted(self) -> bool:
        with self._lock:
            return self._in_flight > len(self._running)

    def claims_lost(self, pairs: set[Pair]) -> int:
        """Remember claims a peer took, so none of them starts here; return how many had
        not started. What was remembered before and is held no more is forgotten (a
        message between the inbox and a thread is held by neither for a moment: it stays
        remembered until the next call)."""
        with self._inbox.mutex:
            queued = {pair(m) for m in self._inbox.queue if m is not None}
        with self._lock:
            unstarted = queued | {pair(m) for m in self._waiting.values()}
            held = unstarted | {pair(t.message) for t in self._running.values()}
            self._lost = (self._lost & held) | pairs
        return len(pairs & unstarted)

    def unverified(self) -> None:
        self._verified.clear()

    def verified(self) -> None:
        self._verified_at = time.monotonic()
        self._verified.set()

    def awaiting_check(self) -> bool:
        """Nothing starts until the control loop has checked the claims (see ``begin``)."""
        return not self._verified.is_set()

    def unmarked_starts(self) -> list[tuple[ClaimedMessage, dt.datetime]]:
        """Running messages whose start is not recorded in the database yet."""
        with self._lock:
            return [(t.message, t.started_at) for t in self._running.values() if not t.marked]

    def marked(self, messages: list[ClaimedMessage]) -> None:
        with self._lock:
            for message in messages:
                task = self._running.get(message.id)
                if task is not None and task.message.claim_token == message.claim_token:
                    task.marked = True

    def abort(self, message: ClaimedMessage) -> bool:
        """The control thread means to fail ``message`` for its timeout: True if it may (its
        task thread records nothing of this attempt from now on: see :meth:`may_end`),
        False if the task ended first (its thread settles the attempt as it ended)."""
        with self._lock:
            task = self._running.get(message.id)
            if task is None or task.message.claim_token != message.claim_token \
                    or task.ending:
                return False
            task.aborted = True
            return True

    def running(self) -> list[RunningTask]:
        with self._lock:
            return list(self._running.values())

    def take_unstarted(self) -> list[ClaimedMessage]:
        """Empty the inbox (and what threads gave back) for release; frees their slots.

        They are remembered as being released until :meth:`released` says the release
        was written, so that a forced exit in between still gives them back.
        """
        unstarted: list[ClaimedMessage] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                unstarted.append(item)
        with self._lock:
            unstarted.extend(self._given_back)
            self._given_back.clear()
            self._in_flight -= len(unstarted)
            self._releasing.update((pair(m), m) for m in unstarted)
        return unstarted

    def released(self, messages: list[ClaimedMessage]) -> None:
        """Their release was written (or given up on): nothing more to do for them."""
        with self._lock:
            for message in messages:
                self._releasing.pop(pair(message), None)

    def unstarted_for_forced_exit(self, patience: float) -> list[ClaimedMessage]:
        """Everything not started, for a second signal's release: the inbox, what threads
        gave back, and a release under way (it may never finish: the process exits).

        Runs on the exit helper's thread while the main thread sits in the signal handler,
        possibly interrupted while holding a lock here: after ``patience`` seconds it reads
        without the lock rather than wait for ever (the main thread won't run again).
        """
        locked = self._lock.acquire(timeout=patience)
        inbox_locked = self._inbox.mutex.acquire(timeout=patience)
        try:
            found = [m for m in list(self._inbox.queue) if m is not None]
            found += list(self._given_back) + list(self._releasing.values())
        finally:
            if inbox_locked:
                self._inbox.mutex.release()
            if locked:
                self._lock.release()
        return list({pair(m): m for m in found}.values())

    def close(self, threads: int) -> None:
        """Tell every task thread to end once the inbox is empty."""
        for _ in range(threads):
            self._inbox.put(None)

    # ------------------------------------------------------------------ task threads

    def next(self) -> ClaimedMessage | None:
        """The next claimed message for a task thread, or None: the thread ends."""
        message = self._inbox.get()
        if message is not None:
            with self._lock:
                self._waiting[message.id] = message
        return message

    def begin(self, message: ClaimedMessage,
              marked: bool = False) -> tuple[Verdict, dt.datetime]:
        """Just before running: is this claim still ours? Waits while it can't be known.
        Also says when the message started (after any wait)."""
        verified = self._verified
        now = time.monotonic()
        if now - self._verified_at > self._fresh_seconds:
            verified.clear()  # stale: have the control loop check the claims first
            self._wakeup.set()
        if not verified.is_set():  # (checking first skips the Event's lock)
            while not verified.wait(0.2):
                if self._stopping.is_set():
                    break
            now = time.monotonic()
        started_at = self._clock()
        with self._lock:
            if self._lost:  # (empty but after a lost claim: the common case skips it)
                held = (message.id, message.claim_token)
                if held in self._lost:
                    self._lost.discard(held)
                    self._waiting.pop(message.id, None)
                    return Verdict.LOST, started_at  # its slot is freed by finish()
            if self._stopping.is_set() or not verified.is_set():
                return Verdict.STOPPING, started_at
            self._waiting.pop(message.id, None)
            self._running[message.id] = RunningTask(message, now, started_at, marked=marked)
        return Verdict.START, started_at

    def began(self, message: ClaimedMessage, task: QueueTask[Any, Any],
              scope: AttemptScope | None) -> bool:
        """A task thread about to start ``message`` (its ``task_started``): remember its task
        and scope, for the abort of its timeout to end it with. False if that abort came
        first: the attempt is failed, nothing of it starts."""
        with self._lock:
            running = self._running.get(message.id)
            if running is None or running.message.claim_token != message.claim_token:
                return True
            if running.aborted:
                return False
            running.task, running.scope = task, scope
            return True

    def may_end(self, message: ClaimedMessage) -> bool:
        """A task thread whose task returned or raised: may it settle the attempt (ack,
        fail, log, count)? Not once the control thread failed it for its timeout
        (:meth:`abort`): that attempt has its line and its count already. One or the
        other, whichever asks first."""
        with self._lock:
            task = self._running.get(message.id)
            if task is None or task.message.claim_token != message.claim_token:
                return True
            if task.aborted:
                return False
            task.ending = True
            return True

    def give_back(self, message: ClaimedMessage) -> None:
        """Not started after all (stopping): released with the inbox's leftovers."""
        with self._lock:
            self._waiting.pop(message.id, None)
            self._given_back.append(message)

    def finish(self, message: ClaimedMessage) -> None:
        """Done with this message (run, skipped or given back): its slot is free."""
        with self._lock:
            self._running.pop(message.id, None)
            self._in_flight -= 1
