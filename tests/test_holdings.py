"""Holdings bookkeeping that a real-process test can hit only by luck: a second signal
arriving while the first one's release of the unstarted messages is under way."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading

from django_mysqlq.messages import ClaimedMessage
from django_mysqlq.worker.holdings import Holdings


def _message(message_id: int) -> ClaimedMessage:
    return ClaimedMessage(
        id=message_id, queue="default", task_name="t", payload="{}", priority=0, attempt=1,
        max_attempts=3, retry_backoff=1.0, timeout=None,
        enqueued_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), claim_token=f"tok{message_id}",
        connection_id=1)


def _holdings() -> Holdings:
    return Holdings(threading.Event(), threading.Event(), fresh_seconds=10.0,
                    clock=lambda: dt.datetime.now(dt.UTC))


def test_a_release_under_way_is_still_released_by_a_forced_exit():
    holdings = _holdings()
    holdings.add([_message(1), _message(2)])
    taken = holdings.take_unstarted()  # the first signal's drain took them ...
    assert {m.id for m in taken} == {1, 2}
    # ... and a second signal comes before its release is written: nothing may be dropped.
    assert {m.id for m in holdings.unstarted_for_forced_exit(0.1)} == {1, 2}
    holdings.released(taken)
    assert holdings.unstarted_for_forced_exit(0.1) == []


def test_a_forced_exit_reads_the_holdings_even_if_the_interrupted_thread_holds_the_lock():
    holdings = _holdings()
    holdings.add([_message(3)])
    holdings._lock.acquire()  # the main thread, interrupted by the signal inside a method
    try:
        assert [m.id for m in holdings.unstarted_for_forced_exit(0.05)] == [3]
    finally:
        holdings._lock.release()


def test_a_solo_start_the_control_loop_marked_first_counts_as_recorded():
    """Between a solo message's ``begin`` and its own record of its start, the control
    loop's round of marks may record it: the thread's lookup of its unmarked start then
    found none, raised, and the task thread ended with the message in flight."""
    from types import SimpleNamespace

    from django_mysqlq.worker.holdings import Verdict
    from django_mysqlq.worker.threads import _record_start

    holdings = _holdings()
    message = _message(7)
    holdings.add([message])
    assert holdings.next() is message
    verdict, started_at = holdings.begin(message)
    assert verdict is Verdict.START
    holdings.marked([message])  # the control loop's mark came first
    worker = SimpleNamespace(holdings=holdings, give_up=threading.Event())
    assert _record_start(worker, message, started_at) is True  # type: ignore[arg-type]


def test_a_timeout_abort_and_the_tasks_own_end_settle_an_attempt_once():
    """Whichever asks first settles the attempt: the control thread failing it for its
    timeout (``abort``) or its task thread, whose task returned or raised (``may_end``)."""
    holdings = _holdings()
    first, second, third = _message(11), _message(12), _message(13)
    holdings.add([first, second, third])
    for message in (first, second, third):
        assert holdings.next() is message
        holdings.begin(message)
    assert holdings.abort(first)  # the timeout first: the task's late end records nothing
    assert not holdings.may_end(first)
    assert not holdings.may_end(first)
    assert holdings.may_end(second)  # the task first: the timeout leaves it be
    assert not holdings.abort(second)
    assert holdings.may_end(second)
    holdings.finish(third)  # ended and gone: nothing to abort
    assert not holdings.abort(third)
    stale = dataclasses.replace(first, claim_token="another")  # a later claim of it
    assert not holdings.abort(stale)


def test_a_timeout_abort_finds_the_task_its_thread_began_or_stops_its_start():
    """The abort sends the attempt's ``task_finished`` with the task and scope its thread
    told ``began``; an abort before that leaves the attempt unstarted (``began`` False)."""
    task, scope = object(), object()
    holdings = _holdings()
    started, late = _message(21), _message(22)
    holdings.add([started, late])
    for message in (started, late):
        assert holdings.next() is message
        holdings.begin(message)
    assert holdings.began(started, task, scope)  # type: ignore[arg-type]
    assert holdings.abort(started) and holdings.abort(late)
    running = {t.message.id: t for t in holdings.running()}
    assert (running[21].task, running[21].scope) == (task, scope)
    assert not holdings.began(late, task, scope)  # type: ignore[arg-type]
    assert (running[22].task, running[22].scope) == (None, None)
