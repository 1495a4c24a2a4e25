"""Batched acks: task threads hand over successes, one thread acks them together.

A crash loses the acks not yet committed, so those tasks run again: at most
``MYSQLQ['ACK_BATCH_SIZE']`` of them, since task threads wait while that many successes
are unacked (being written or waiting to be). The acker reports each success once its
ack is written (``succeeded``) or given up on (``unacked``: it will run again), and logs
each one's attempt line then, once: a success is not one before its ack commits.

A success of an ordered subject or a concurrency key is acked without the batching delay
while the worker has nothing else claimed to run (its ack makes the next message of its
gate ready, which may be all there is to do), and the worker's control loop is nudged
after it to claim that one; a worker with claimed messages waiting batches them as usual.
One whose gate, or unique key's row, another transaction holds (a producer's long
transaction) is left out of its batch and tried again shortly, so the rest flow.

A message lost with its worker before runs alone (``gate.SoloGate``); ``flush`` has what
is pending written at once, and waits for it, before such a message starts and after its
success: if it kills its process again, no finished, unacked task goes down with it (one
did, and recovery charged it an attempt at every crash until it went dead).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, connections

from .. import broker
from ..broker.base import SHORTEST_BOUND
from ..log import one_line
from ..messages import AttemptResult, ClaimedMessage, Runner
from .attempt_log import AttemptLine
from .executor import NOT_RECORDED, RECOVERED_MEANWHILE, settle

logger = logging.getLogger("django_mysqlq")

Finished = tuple[ClaimedMessage, Runner, AttemptResult]
#: Seconds ``stop()`` waits past the stop's end for a statement started just before it.
JOIN_MARGIN = SHORTEST_BOUND
#: Seconds before a success whose gate was held by another transaction is tried again.
BUSY_RETRY_SECONDS = 0.25
#: How often ``flush`` looks at its stop event while it waits.
FLUSH_SLICE_SECONDS = 0.2


def _no_report(**counts: int) -> None:
    """Where counts go when nobody asked for them."""


class Handover:
    """One task's way to the acker; remembers whether its success was handed over.

    The worker counts a success handed over only once the acker reports it acked.
    """

    def __init__(self, acker: Acker) -> None:
        self._acker = acker
        self.used = False

    def add(self, message: ClaimedMessage, runner: Runner, result: AttemptResult,
            line: AttemptLine | None = None) -> None:
        self.used = True
        self._acker.add(message, runner, result, line)


class Acker:
    """Collects successful attempts and acks them in batches on its own connection."""

    def __init__(self, batch_size: int, delay: float, give_up: threading.Event,
                 report: Callable[..., None] = _no_report,
                 nudge: Callable[[], None] = lambda: None,
                 idle: Callable[[], bool] = lambda: True, alias: str | None = None) -> None:
        self.batch_size = batch_size
        #: The worker's database: the acker thread's statements go there.
        self.alias = alias
        self.delay = delay
        self._give_up = give_up
        #: Called as ``report(succeeded=n, unacked=m)`` after each batch.
        self._report = report
        self._pending: list[Finished] = []
        #: The batch being written: its claims are still ours until it commits.
        self._writing: list[Finished] = []
        #: Successes whose gate another transaction held, and when to try them again.
        self._busy: list[tuple[Finished, float]] = []
        #: Called after an ack that may have made a gate's next message ready.
        self._nudge = nudge
        #: Whether the worker has no claimed message waiting for a thread: then a gated
        #: success is acked at once, since its gate's next message may be the only work.
        self._idle = idle
        #: Tokens of successes whose ack was given up: a stop must not release those
        #: claims as unstarted (they ran; a peer recovers them and counts the attempt).
        self._unacked_tokens: set[str] = set()
        #: Attempt lines of the successes not logged yet, by (id, claim token): a batch
        #: claimed by one statement shares its token.
        self._lines: dict[tuple[int, str], AttemptLine] = {}
        #: Set when a stop begins: every ack statement from then on ends by this time.
        self._end: float | None = None
        self._abandoned = False
        self._oldest = 0.0
        #: A success with a gate waits in ``_pending``: every add wakes the acker then.
        self._gated_pending = False
        #: Threads waiting in ``flush``: what is pending is written without the delay.
        self._flushing = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mysqlq-acker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> int:
        """Successes not acked yet (their claims must keep being renewed)."""
        return len(self._pending) + len(self._busy)

    @property
    def unacked(self) -> int:
        """Successes not acked yet: waiting, being written, or waiting for a busy gate."""
        return len(self._pending) + len(self._writing) + len(self._busy)

    @property
    def gated_unacked(self) -> bool:
        """Whether a success not acked yet has a gate: its ack may make that gate's next
        message ready, so the worker should stay awake for the nudge."""
        with self._cond:
            return any(m.gate_key is not None for m, _, _ in
                       [*self._writing, *self._pending, *(f for f, _ in self._busy)])

    def held_pairs(self) -> list[tuple[int, str]]:
        """(id, token) of successes not acked yet (being written or waiting)."""
        with self._cond:
            return [(m.id, m.claim_token) for m, _, _ in
                    [*self._writing, *self._pending, *(f for f, _ in self._busy)]]

    def handover(self) -> Handover:
        return Handover(self)

    def unacked_tokens(self) -> list[str]:
        """Claim tokens of successes whose ack was given up (they will run again)."""
        with self._cond:
            return sorted(self._unacked_tokens)

    def add(self, message: ClaimedMessage, runner: Runner, result: AttemptResult,
            line: AttemptLine | None = None) -> None:
        """Queue one success; blocks while a batch's worth is unacked, which bounds the loss."""
        with self._cond:
            while (len(self._pending) + len(self._writing) + len(self._busy) >= self.batch_size
                   and not self._stopping):
                self._cond.wait(0.1)
            first = not self._pending
            if first:
                self._oldest = time.monotonic()
            self._pending.append((message, runner, result))
            if line is not None:
                self._lines[message.id, message.claim_token] = line
            if message.gate_key is not None:
                self._gated_pending = True
            # Wake the acker only when it has something new to decide: a first success
            # starts its delay, a full batch may go now, and so may one with a gated
            # success (see ``_take``: it then asks whether the worker is idle at each
            # add). Otherwise it sleeps until the delay's end: waking it for every success
            # cost a thread switch per task. (Nothing else waits on the condition for this.)
            if first or self._gated_pending or len(self._pending) >= self.batch_size:
                self._cond.notify_all()

    def flush(self, cancelled: threading.Event) -> bool:
        """Write every success handed over so far now, without the batching delay, and wait
        until none is unacked (acked, or given up on: it runs again); False if
        ``cancelled`` is set or the acker stops first (the stop writes them)."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._pending or self._writing or self._busy:
                    if cancelled.is_set() or self._stopping:
                        return False
                    self._cond.wait(FLUSH_SLICE_SECONDS)
                return True
            finally:
                self._flushing -= 1

    def finish_by(self, end: float) -> None:
        """A stop began: every ack from now on must end by ``end`` (``time.monotonic()``)."""
        self._end = end

    def stop(self) -> None:
        """Ack what is pending and end the thread, by the ``finish_by`` time if one was set.

        Past it (plus a margin) the thread is left behind, a daemon that dies with the
        process; the successes it still holds are counted as unacked.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        end = self._end
        self._thread.join(None if end is None
                          else max(0.0, end + JOIN_MARGIN - time.monotonic()))
        if not self._thread.is_alive():
            return
        with self._cond:
            self._abandoned = True
            stuck = [*self._writing, *self._pending, *(f for f, _ in self._busy)]
            self._unacked_tokens.update(m.claim_token for m, _, _ in stuck)
            ends = self._ends(stuck, None, "its ack was not written by the end of the stop; "
                              "a peer recovers it and it runs again")
        self._write(ends)
        if stuck:
            self._report(unacked=len(stuck))
            logger.error("Gave up waiting for the ack of %d finished task(s) at the end of the "
                         "stop; they stay claimed and will run again.", len(stuck))

    def _take(self) -> list[Finished] | None:
        with self._cond:
            while True:
                now = time.monotonic()
                due = [f for f, at in self._busy if self._stopping or at <= now]
                if due:
                    self._busy = [(f, at) for f, at in self._busy if f not in due]
                    if not self._pending:
                        self._oldest = now
                    self._pending[:0] = due
                if self._pending and (
                    self._stopping or self._flushing
                    or len(self._pending) >= self.batch_size
                    or now - self._oldest >= self.delay
                    or (any(m.gate_key is not None for m, _, _ in self._pending)
                        and self._idle())
                ):
                    batch, self._pending = self._pending, []
                    self._gated_pending = False
                    self._writing = batch
                    self._cond.notify_all()
                    return batch
                if self._stopping:
                    return None
                waits = [at - now for _, at in self._busy]
                if self._pending:
                    waits.append(self.delay - (now - self._oldest))
                self._cond.wait(max(0.0, min(waits)) if waits else None)

    def _ack(self, batch: list[Finished]) -> set[int] | None:
        """Ack a batch; return the ids whose ack was written, None if the database could not
        be reached (``settle`` gave up) or the ack failed unexpectedly. Those whose gate
        was busy go to ``_busy`` to be tried again; the rest will run again.

        If the server refuses the batch, ack one by one so one bad row stays alone.
        """
        busy: list[Finished] = []

        def attempt() -> set[int]:
            busy.clear()
            if self._end is not None:
                broker.finish_by(self._end)
            # Stopping, a busy gate is waited for (within the stop's end), not left behind.
            return broker.ack_many(batch, busy=None if self._stopping else busy)

        try:
            owned: set[int] | None = settle(attempt, f"a batch of {len(batch)} acks",
                                            self._give_up, lambda: self._end)
            if owned is not None and busy:
                retry_at = time.monotonic() + BUSY_RETRY_SECONDS
                with self._cond:
                    self._busy.extend((finished, retry_at) for finished in busy)
        except DatabaseError as exc:
            if len(batch) == 1:
                message = batch[0][0]
                logger.error("Could not ack %s #%s (%s); it stays claimed and will be "
                             "recovered and run again.", message.task_name, message.id,
                             one_line(str(exc)))
                return set()
            logger.warning("A batch of %d acks was refused (%s); acking them one by one.",
                           len(batch), one_line(str(exc)))
            return {id_ for finished in batch for id_ in self._ack([finished]) or ()}
        except Exception:  # one batch's bug must not end the acker thread
            # Left uncaught it killed the thread: the batch stayed "being written" for
            # good, task threads blocked in add() and its claims were renewed forever.
            logger.exception("Acking a batch of %d finished task(s) failed unexpectedly "
                             "(a bug: please report it); their claims are given up, so a "
                             "peer recovers them and they run again. The acker goes on "
                             "with the next batch.", len(batch))
            return None
        if owned and any(m.gate_key is not None for m, _, _ in batch):
            self._nudge_if_idle()
        return owned

    def _nudge_if_idle(self) -> None:
        """A gate's next message may be ready: have an idle worker claim it now."""
        try:
            if self._idle():
                self._nudge()
        except Exception:  # the acks are written; the worker claims it at its next poll
            logger.exception("Waking the worker after an ack failed; it claims the next "
                             "message at its next poll. The acker goes on.")

    def _ends(self, batch: list[Finished], acked: set[int] | None, lost: str
              ) -> list[tuple[AttemptLine, str, str]]:
        """Take each attempt line of a batch, once (under the lock), with its outcome:
        succeeded if its ack was written, else lost with ``lost`` (or, when the ack found
        its claim gone, that)."""
        ends: list[tuple[AttemptLine, str, str]] = []
        if not self._lines:
            return ends
        for message, _, _ in batch:
            line = self._lines.pop((message.id, message.claim_token), None)
            if line is None:
                continue
            if acked is not None and message.id in acked:
                ends.append((line, "succeeded", ""))
            else:
                ends.append((line, "lost", lost if acked is None else RECOVERED_MEANWHILE))
        return ends

    @staticmethod
    def _write(ends: list[tuple[AttemptLine, str, str]]) -> None:
        """Log the lines ``_ends`` took (outside the lock: a handler may be slow)."""
        for line, outcome, detail in ends:
            line.write(outcome, detail=detail)

    def _run(self) -> None:
        broker.bind_alias(self.alias)
        broker.own_connection(self.alias)  # acks run at READ COMMITTED whatever the site's level
        try:
            while (batch := self._take()) is not None:
                tokens = self._ack(batch)
                acked = len(tokens) if tokens is not None else 0
                with self._cond:
                    self._writing = []
                    self._cond.notify_all()
                    if self._abandoned:
                        continue  # stop() has counted and logged this batch already
                    later = {(f[0].id, f[0].claim_token) for f, _ in self._busy}
                    settled = [f for f in batch if (f[0].id, f[0].claim_token) not in later
                               ] if later else batch
                    unacked = len(settled) - acked
                    if unacked > 0:
                        self._unacked_tokens.update(m.claim_token for m, _, _ in settled)
                    # Those waiting for a busy gate keep their line for their next try.
                    ends = self._ends(settled, tokens, NOT_RECORDED)
                self._write(ends)
                self._report(succeeded=acked, unacked=max(0, unacked))
        finally:
            connections.close_all()
