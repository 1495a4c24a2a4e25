"""Unique jobs: ``unique_for`` (0: unique while queued; N: the key stays taken N seconds
after a success), per task and per call, under concurrent producers, a REPEATABLE READ
caller, tampered rows, retention and a real worker."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from django_mysqlq import InvalidTaskOptions, broker, queue_task
from django_mysqlq.limits import MAX_SECONDS
from django_mysqlq.messages import AttemptResult, Runner
from django_mysqlq.models import Attempt, Message, UniqueKey, unique_key_id
from django_mysqlq.registry import registry
from django_mysqlq.tasks import DERIVED_KEY_PREFIX
from django_mysqlq.worker import retention
from tests.conftest import raw_connection
from tests.testapp import tasks
from tests.testapp.models import GateRun
from tests.testapp.unique_tasks import PERIOD, unique_step, unique_while_queued

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER = Runner("unique-test", "h", 1, "t")


def ok() -> AttemptResult:
    return AttemptResult(started_at=timezone.now())


def run_all(queue: str = "default") -> list[int]:
    """Claim and ack every ready message, as a worker does; return their ids."""
    claimed = broker.claim([queue], 100, "unique-test", lease_seconds=30)
    broker.ack_many([(m, RUNNER, ok()) for m in claimed])
    return [m.id for m in claimed]


def taken() -> list[str]:
    """Keys whose period runs (an enqueue with unique_for leaves an expired row: free)."""
    return list(UniqueKey.objects.filter(expires_at__gt=timezone.now(), message_id__gt=0)
                .values_list("dedup_key", flat=True))


def expire(key: str) -> None:
    """The period of ``key`` ends now (as if its time had passed)."""
    UniqueKey.objects.filter(pk=unique_key_id(key)).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1))


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``target`` on its own thread and connection; its result or error lands in
    the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            out.append(exc)
        finally:
            close_old_connections()
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@contextmanager
def repeatable_read() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


# --- options and their errors -------------------------------------------------------------

@pytest.mark.parametrize("value", [-1, 1.5, 2.0, "10", True, None.__class__, MAX_SECONDS + 1,
                                   dt.timedelta(seconds=1.5), dt.timedelta(seconds=-3),
                                   10**400])
def test_bad_unique_for_values_are_refused_with_the_range(value):
    with pytest.raises(InvalidTaskOptions, match=r"unique_for must be a whole number of "
                                                 r"seconds .* from 0 \(unique while queued\)"):
        tasks.record.using(unique_for=value)


def test_a_bad_unique_for_on_the_decorator_names_the_task():
    def bad() -> None: ...

    with pytest.raises(InvalidTaskOptions, match=r"test_unique_jobs.*bad: unique_for must"):
        queue_task(unique_for=3.5)(bad)
    assert not any(name.endswith(".bad") for name in registry.names())


def test_a_timedelta_and_the_largest_period_are_stored_in_seconds():
    handle = tasks.record.using(dedup_key="td", unique_for=dt.timedelta(hours=1)).enqueue("a")
    assert Message.objects.get(pk=handle.id).unique_for == 3600
    handle = tasks.record.using(dedup_key="max", unique_for=MAX_SECONDS).enqueue("a")
    assert Message.objects.get(pk=handle.id).unique_for == MAX_SECONDS
    run_all()
    row = UniqueKey.objects.get(pk=unique_key_id("max"))
    assert row.expires_at.year >= timezone.now().year + 99  # no overflow, no NULL


# --- unique while queued, and the key made of the arguments -------------------------------

def test_a_unique_task_without_a_dedup_key_is_unique_by_task_and_arguments():
    first = unique_while_queued.enqueue("a", extra=1)
    again = unique_while_queued.enqueue("a", extra=1)
    other = unique_while_queued.enqueue("a", extra=2)
    assert again.id == first.id and other.id != first.id
    key = Message.objects.get(pk=first.id).dedup_key
    assert key is not None and key.startswith(DERIVED_KEY_PREFIX) and len(key) <= 255
    assert Message.objects.count() == 2
    # unique while queued: once it finished the same call is a new message, no period
    run_all()
    assert UniqueKey.objects.count() == 0
    assert unique_while_queued.enqueue("a", extra=1).id not in (first.id, other.id)


def test_keyword_order_makes_no_other_key():
    first = unique_step.enqueue(key="k", seq=1, label="kw")
    second = unique_step.enqueue(label="kw", seq=1, key="k")
    assert first.id == second.id


def test_enqueue_many_of_a_unique_task_keeps_one_message_per_call():
    handles = unique_while_queued.enqueue_many([("a",), ("b",), ("a",)])
    assert handles[0].id == handles[2].id != handles[1].id
    assert Message.objects.count() == 2


def test_a_call_can_turn_the_period_off_or_on():
    handle = unique_step.using(unique_for=0).enqueue("k", 1, "off")
    assert Message.objects.get(pk=handle.id).unique_for == 0
    run_all()
    assert UniqueKey.objects.count() == 0
    handle = tasks.record.using(unique_for=60).enqueue("x")
    assert Message.objects.get(pk=handle.id).unique_for == 60


# --- unique for a period after success -----------------------------------------------------

def test_after_a_success_the_key_stays_taken_for_the_period():
    first = unique_step.using(dedup_key="report:1").enqueue("r", 1, "p")
    assert run_all() == [first.id]
    assert not Message.objects.filter(pk=first.id).exists()
    row = UniqueKey.objects.get(pk=unique_key_id("report:1"))
    assert (row.message_id, row.dedup_key, row.task_name) == (
        first.id, "report:1", unique_step.name)
    left = (row.expires_at - row.succeeded_at).total_seconds()
    assert left == pytest.approx(PERIOD, abs=0.01)

    again = unique_step.using(dedup_key="report:1").enqueue("r", 2, "p")
    assert again.id == first.id                      # the message that succeeded
    assert again.status == "succeeded"               # its handle reads its history
    assert Message.objects.count() == 0              # nothing was written
    expire("report:1")
    third = unique_step.using(dedup_key="report:1").enqueue("r", 3, "p")
    assert third.id != first.id and Message.objects.filter(pk=third.id).exists()


def test_a_duplicate_in_the_period_reads_the_stored_value_as_docs_tasks_md_says():
    """docs/tasks.md: the handle's ``state().result`` (and ``wait().value``, at once) is the
    value the success stored; a handle has no ``result()``."""
    first = unique_step.using(dedup_key="report:2").enqueue("r", 1, "p")
    [message] = broker.claim(["default"], 1, "unique-test", lease_seconds=30)
    broker.ack_many([(message, RUNNER, AttemptResult(started_at=timezone.now(),
                                                     result={"rows": 3}))])
    again = unique_step.using(dedup_key="report:2").enqueue("r", 2, "p")
    assert again.id == first.id
    assert again.state().result == {"rows": 3}
    done = again.wait(timeout=1)
    assert (done.status, done.value) == ("succeeded", {"rows": 3})


def test_a_dead_message_frees_its_key_and_starts_no_period():
    first = unique_step.using(dedup_key="dies").enqueue("d", 1, "dead")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    outcome = broker.fail(claimed, RUNNER, AttemptResult(started_at=timezone.now(),
                                                         error_class="E"))
    assert outcome == "retried"                      # a retry keeps the key
    assert unique_step.using(dedup_key="dies").enqueue("d", 2, "dead").id == first.id
    Message.objects.filter(pk=first.id).update(run_at=timezone.now())
    broker.promote_due()
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    assert broker.fail(claimed, RUNNER, AttemptResult(started_at=timezone.now(),
                                                      error_class="E")) == "failed"
    assert Message.objects.get(pk=first.id).status == "dead"
    assert taken() == []
    second = unique_step.using(dedup_key="dies").enqueue("d", 3, "dead")
    assert second.id != first.id


def test_a_plain_dedup_enqueue_checks_only_pending_messages():
    first = unique_step.using(dedup_key="mixed").enqueue("m", 1, "mixed")
    run_all()
    plain = tasks.record.using(dedup_key="mixed").enqueue("plain")
    assert plain.id != first.id  # documented: the period binds enqueues with unique_for


def test_an_atomic_ack_keeps_the_key_too():
    handle = unique_step.using(dedup_key="atomic").enqueue("a", 1, "atomic")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    with transaction.atomic():
        assert broker.ack_within(claimed, RUNNER, ok())
    assert UniqueKey.objects.get(pk=unique_key_id("atomic")).message_id == handle.id


def test_a_lost_claim_writes_no_period():
    unique_step.using(dedup_key="lost").enqueue("l", 1, "lost")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    Message.objects.filter(pk=claimed.id).update(claim_token="someone-else")
    assert broker.ack_many([(claimed, RUNNER, ok())]) == set()
    assert taken() == []


# --- tampered and odd values -------------------------------------------------------------

def test_a_tampered_period_row_is_read_as_it_stands():
    first = unique_step.using(dedup_key="t").enqueue("t", 1, "t")
    run_all()
    # A row changed by hand to message 0 means no holder: the key is free.
    UniqueKey.objects.filter(pk=unique_key_id("t")).update(message_id=0)
    second = unique_step.using(dedup_key="t").enqueue("t", 2, "t")
    assert second.id != first.id
    # A row deleted by hand before the ack: the ack makes it again.
    UniqueKey.objects.all().delete()
    run_all()
    assert UniqueKey.objects.get(pk=unique_key_id("t")).message_id == second.id


def test_a_tampered_unique_for_on_a_message_row_is_honoured_or_ignored():
    handle = tasks.record.using(dedup_key="hand").enqueue("h")
    Message.objects.filter(pk=handle.id).update(unique_for=4294967295)  # column maximum
    run_all()  # the ack must not fail on the date arithmetic
    row = UniqueKey.objects.get(pk=unique_key_id("hand"))
    assert row.expires_at > timezone.now() + dt.timedelta(days=365 * 100)


# --- concurrent producers, and the ack racing a producer ------------------------------------

@pytest.mark.parametrize("unique_for", [None, 30])
def test_two_transactions_enqueuing_one_key_at_once_make_one_message(unique_for):
    barrier = threading.Barrier(2)

    def produce() -> int:
        with transaction.atomic():
            barrier.wait(timeout=10)
            handle = unique_step.using(dedup_key="race", unique_for=unique_for) \
                .enqueue("r", 1, "race")
            time.sleep(0.3)  # both inserts overlap before either commits
            return handle.id

    threads = [in_thread(produce) for _ in range(2)]
    for thread, _ in threads:
        thread.join(30)
    ids = [out[0] for _, out in threads]
    assert all(isinstance(i, int) for i in ids), ids
    assert ids[0] == ids[1]
    assert list(Message.objects.values_list("pk", flat=True)) == [ids[0]]


def _crowd(produce: Callable[[], Any], count: int) -> list[Any]:
    """``count`` threads running ``produce`` at once; each one's result or error."""
    threads = [in_thread(produce) for _ in range(count)]
    for thread, _ in threads:
        thread.join(30)
    return [out[0] for _, out in threads]


def _produce(key: str) -> Callable[[], int]:
    def produce() -> int:
        with transaction.atomic():
            return unique_step.using(dedup_key=key).enqueue(key, 99, key).id
    return produce


def test_producers_inserting_over_an_acked_message_of_their_key_make_one_message():
    """Hostile (the CI failure, made certain): an acked message's ``dedup_key`` entry stays,
    delete-marked, until purge. Each producer's duplicate check took a shared lock on the
    gap after it, and each one's insert then waited for the other's. A REPEATABLE READ
    reader holds purge back and, with shared locks of its own, holds both inserts up."""
    for round_ in range(2):
        reader = raw_connection()
        try:
            cursor = reader.cursor()
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            unique_step.using(dedup_key="gone").enqueue("gone", round_, "gone")
            run_all()
            expire("gone")
            cursor.execute("SELECT id FROM mysqlq_message FORCE INDEX (dedup_key) "
                           "WHERE dedup_key >= 'gone' LOCK IN SHARE MODE")
            threads = [in_thread(_produce("gone")) for _ in range(2)]
            time.sleep(0.5)  # both inserts wait behind the reader's locks
        finally:
            reader.close()
        for thread, _ in threads:
            thread.join(30)
        ids = [out[0] for _, out in threads]
        assert isinstance(ids[0], int) and ids[0] == ids[1], (round_, ids)
        Message.objects.all().delete()


def test_producers_arriving_while_the_ack_commits_all_get_the_message_that_succeeded():
    """Hostile: producers waiting on the ack went on side by side; the first met the
    period and undid its insert, and the others inherited gap locks from its entry."""
    for round_ in range(3):
        first = unique_step.using(dedup_key="crowd").enqueue("crowd", round_, "crowd")
        [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
        acked = threading.Event()

        def ack_slowly(claimed: Any = claimed, acked: threading.Event = acked) -> bool:
            with transaction.atomic():
                owned = broker.ack_within(claimed, RUNNER, ok())
                acked.set()
                time.sleep(0.3)  # the producers arrive while this ack is uncommitted
            return owned

        acker, acked_out = in_thread(ack_slowly)
        assert acked.wait(10)
        ids = _crowd(_produce("crowd"), 4)
        acker.join(30)
        assert acked_out == [True] and ids == [first.id] * 4, (round_, ids)
        expire("crowd")


def test_a_producer_rolling_back_while_two_wait_for_the_key_leaves_them_one_message():
    """Hostile: the two waiting on the rolled-back insert inherited gap locks from it."""
    for round_ in range(3):
        unique_step.using(dedup_key="undo").enqueue("undo", round_, "undo")
        run_all()
        expire("undo")  # the key's row stays, its period over: the next enqueue inserts
        entered = threading.Event()

        def give_up(entered: threading.Event = entered) -> None:
            with transaction.atomic():
                unique_step.using(dedup_key="undo").enqueue("undo", 98, "undo")
                entered.set()
                time.sleep(0.3)  # the others wait for this transaction...
                raise LookupError("...which rolls back")

        first, first_out = in_thread(give_up)
        assert entered.wait(10)
        ids = _crowd(_produce("undo"), 2)
        first.join(30)
        assert isinstance(first_out[0], LookupError)
        assert isinstance(ids[0], int) and ids[0] == ids[1], (round_, ids)
        Message.objects.all().delete()


def test_a_producer_racing_the_ack_gets_the_message_that_succeeded():
    first = unique_step.using(dedup_key="ackrace").enqueue("a", 1, "ackrace")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    acked = threading.Event()

    def ack_slowly() -> bool:
        with transaction.atomic():
            owned = broker.ack_within(claimed, RUNNER, ok())
            acked.set()
            time.sleep(0.5)  # the producer arrives while this ack is uncommitted
        return owned

    thread, out = in_thread(ack_slowly)
    assert acked.wait(10)
    started = time.monotonic()
    again = unique_step.using(dedup_key="ackrace").enqueue("a", 2, "ackrace")
    waited = time.monotonic() - started
    thread.join(10)
    assert out == [True]
    assert again.id == first.id and waited > 0.2  # it waited for the ack, then saw it
    assert Message.objects.count() == 0


def test_a_repeatable_read_caller_whose_snapshot_predates_the_ack_still_sees_the_period():
    first = unique_step.using(dedup_key="rr").enqueue("a", 1, "rr")
    with repeatable_read(), transaction.atomic():
        assert Message.objects.filter(pk=first.id).exists()  # the snapshot starts here
        thread, out = in_thread(run_all)  # another connection acks it and commits
        thread.join(10)
        assert out == [[first.id]]
        assert Message.objects.filter(pk=first.id).exists()  # our snapshot is older
        again = unique_step.using(dedup_key="rr").enqueue("a", 2, "rr")
        assert again.id == first.id
    assert Message.objects.count() == 0


def test_an_open_producer_transaction_does_not_hold_up_the_acks_of_other_keys():
    unique_step.using(dedup_key="other-b").enqueue("b", 1, "gap")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    with repeatable_read(), transaction.atomic():
        unique_step.using(dedup_key="other-a").enqueue("a", 1, "gap")  # open, keyed row
        started = time.monotonic()
        thread, out = in_thread(lambda: broker.ack_many([(claimed, RUNNER, ok())]))
        thread.join(15)
        took = time.monotonic() - started
        assert out == [{claimed.id}]
        assert took < 2, f"the ack of another key waited {took:.1f}s on our transaction"



def test_an_open_producer_transaction_on_the_same_key_defers_only_that_ack():
    """A producer enqueues the key of a message still running and keeps its transaction
    open: the ack batch leaves that message out (the acker tries it again shortly) and
    acks the rest now, instead of waiting on the key's row; once the producer commits,
    the message is acked and its period starts."""
    running = unique_step.using(dedup_key="same-m").enqueue("m", 1, "same")
    other = unique_step.using(dedup_key="same-n").enqueue("n", 1, "same")
    plain = tasks.record.enqueue("plain")
    claimed = {m.id: m for m in broker.claim(["default"], 3, "w", lease_seconds=60)}
    assert set(claimed) == {running.id, other.id, plain.id}
    busy: list[Any] = []
    with transaction.atomic():
        duplicate = unique_step.using(dedup_key="same-m").enqueue("m", 2, "same")
        assert duplicate.id == running.id  # the key's row is ours until we commit
        thread, out = in_thread(lambda: broker.ack_many(
            [(m, RUNNER, ok()) for m in claimed.values()], busy=busy))
        thread.join(15)  # (unfixed: the batch waits on the key's row, minutes at worst)
        finished_while_open = not thread.is_alive()
    thread.join(60)
    assert finished_while_open, "the ack batch waited on the producer's transaction"
    assert out == [{other.id, plain.id}]
    assert [m.id for m, _, _ in busy] == [running.id]
    assert set(Message.objects.values_list("id", flat=True)) == {running.id}
    # The producer has committed: the deferred ack goes through and starts the period.
    assert broker.ack_many(busy, busy=[]) == {running.id}
    assert not Message.objects.exists()
    assert sorted(taken()) == ["same-m", "same-n"]
    assert unique_step.using(dedup_key="same-m").enqueue("m", 3, "same").id == running.id

# --- retention, immediate mode, admin -------------------------------------------------------

def test_retention_deletes_only_expired_keys_and_steps_over_locked_ones(settings):
    for key in ("keep", "gone"):
        unique_step.using(dedup_key=key).enqueue(key, 1, "ret")
    run_all()
    expire("gone")
    retention.prune("w", "h", 1)
    assert set(UniqueKey.objects.values_list("dedup_key", flat=True)) == {"keep"}
    expire("keep")

    def hold() -> None:
        with transaction.atomic():
            list(UniqueKey.objects.select_for_update().all())
            time.sleep(1)

    thread, _ = in_thread(hold)
    time.sleep(0.2)
    started = time.monotonic()
    assert broker.purge_unique_keys_batch(timezone.now(), 10) == 0  # locked: stepped over
    assert time.monotonic() - started < 0.9
    thread.join(10)
    assert broker.purge_unique_keys_batch(timezone.now(), 10) == 1


def test_immediate_mode_keeps_the_period_too(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True}
    first = unique_step.enqueue("i", 1, "imm")
    second = unique_step.enqueue("i", 1, "imm")
    assert second.id == first.id
    assert GateRun.objects.filter(label="imm", edge="start").count() == 1
    assert unique_step.using(unique_for=0).enqueue("i", 1, "imm").id != first.id


def test_the_admin_lists_unique_keys_and_frees_them(root):
    unique_step.using(dedup_key="admin:1").enqueue("a", 1, "admin")
    run_all()
    page = root.get("/admin/django_mysqlq/uniquekey/")
    assert page.status_code == 200 and b"admin:1" in page.content
    response = root.post("/admin/django_mysqlq/uniquekey/", {
        "action": "free_keys", "_selected_action": [unique_key_id("admin:1")]})
    assert response.status_code == 302
    assert UniqueKey.objects.count() == 0
    assert Attempt.objects.filter(outcome="succeeded").count() == 1


# --- a real worker ---------------------------------------------------------------------------

def test_a_worker_runs_a_unique_key_once_per_period(start_worker):
    worker = start_worker("--concurrency", "2")
    first = unique_step.enqueue("w", 1, "worker")
    deadline = time.monotonic() + 30
    while not Attempt.objects.filter(message_id=first.id, outcome="succeeded").exists():
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.05)
    for _ in range(3):
        assert unique_step.enqueue("w", 1, "worker").id == first.id
    time.sleep(0.5)
    assert GateRun.objects.filter(label="worker", edge="start").count() == 1
    row = UniqueKey.objects.get(message_id=first.id)
    time.sleep(max(0.0, (row.expires_at - timezone.now()).total_seconds()) + 0.1)
    second = unique_step.enqueue("w", 1, "worker")
    assert second.id != first.id
    while not Attempt.objects.filter(message_id=second.id, outcome="succeeded").exists():
        assert time.monotonic() < deadline + PERIOD, worker.output()
        time.sleep(0.05)
    assert GateRun.objects.filter(label="worker", edge="start").count() == 2


def test_a_unique_message_killed_with_its_worker_keeps_its_key_and_runs_again(start_worker):
    import signal

    from tests.conftest import wait_for

    first = unique_step.using(dedup_key="killed").enqueue("k", 1, "killed", sleep_ms=30_000)
    worker = start_worker("--concurrency", "2")
    wait_for(lambda: Message.objects.filter(pk=first.id, started_at__isnull=False).exists(),
             timeout=30, message="the unique message to start")
    worker.signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    # While its worker is dead and before recovery, the key is still held.
    assert unique_step.using(dedup_key="killed").enqueue("k", 2, "killed").id == first.id
    Message.objects.filter(pk=first.id).update(
        payload='{"args":["k",1,"killed"],"kwargs":{}}')  # no 30 s sleep again
    peer = start_worker("--concurrency", "2")
    wait_for(lambda: Attempt.objects.filter(message_id=first.id, outcome="succeeded")
             .exists(), timeout=60, message="the recovered message to succeed")
    assert Attempt.objects.filter(message_id=first.id, outcome="lost").count() == 1
    # Succeeded: its period runs, the key stays taken, nothing runs twice more.
    assert unique_step.using(dedup_key="killed").enqueue("k", 3, "killed").id == first.id
    assert taken() == ["killed"]
    assert GateRun.objects.filter(label="killed", edge="start").count() == 2
    peer.signal(signal.SIGTERM)
    peer.wait(timeout=30)


def test_a_default_without_a_stable_repr_makes_the_same_key_in_every_process():
    """The key was made with ``repr`` of defaults JSON can't encode: an ``object()``
    sentinel or a function names its memory address, a set follows the hash seed, so
    every process made its own key for the same call and duplicates got through. Two
    sentinels stand here for the one sentinel as two processes see it."""
    from django_mysqlq.uniqueness import derived_dedup_key

    def one(user_id, _missing=object(), on_done=print,  # noqa: B008 - the point
            tags=frozenset({"a", "b", "c"})):
        pass

    def other(user_id, _missing=object(), on_done=print,  # noqa: B008 - the point
              tags=frozenset({"c", "b", "a"})):
        pass

    keys = {derived_dedup_key("app.tasks.f", func, [7], {}, "") for func in (one, other)}
    assert len(keys) == 1, keys
    assert derived_dedup_key("app.tasks.f", one, [8], {}, "") not in keys
