"""Global rate limits, at the broker: options and their errors, the 'throttled' status
(never 'ready', whatever makes a message runnable again), the spacing taken at claim
time per key, no head-of-line blocking, the park that ends at a key's next start,
concurrent REPEATABLE READ producers, and rows changed by hand."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from django_mysqlq import InvalidTaskOptions, broker, queue_task
from django_mysqlq.broker import Operator
from django_mysqlq.messages import AttemptResult, Runner
from django_mysqlq.models import Message, RateLimit, rate_id
from django_mysqlq.rating import parse
from django_mysqlq.worker import retention
from tests.testapp.rated_tasks import per_account, per_minute, unlimited

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER = Runner("rate-test", "h", 1, "t")
KEY = per_minute.name  # a task-wide limit's key


def claim_plain(limit: int = 100) -> list[int]:
    return [m.id for m in broker.claim(["default"], limit, "w", lease_seconds=30)]


def claim_rated(limit: int = 100) -> list[int]:
    return [m.id for m in broker.claim_throttled(["default"], limit, "w", lease_seconds=30)]


def statuses() -> dict[int, str]:
    return dict(Message.objects.values_list("pk", "status"))


def open_key(key: str = KEY, queue: str = "default") -> None:
    """The key's next start is now (as if its interval had passed)."""
    RateLimit.objects.filter(pk=rate_id(queue, key)).update(
        next_at=timezone.now() - timezone.timedelta(seconds=1))


# --- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "expected"), [
    ("100/m", (100, 60, 600_000)), ("5/10s", (5, 10, 2_000_000)), ("1000/h", (1000, 3600,
                                                                             3_600_000)),
    (" 10 / d ", (10, 86400, 8_640_000_000)), ("1000/s", (1000, 1, 1000)),
])
def test_rate_specs_parse(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize(("spec", "why"), [
    ("100", "is not N/s"), ("100/x", "is not N/s"), ("-1/m", "is not N/s"), (100, "is not"),
    ("1.5/m", "is not"), ("0/m", "allows 0 per window"), ("10/0s", "window of 0s"),
    ("1/8d", "window of 691200s"), ("2000000/d", "allows 2000000"),
    ("1001/s", "more than 1000 starts per second"), (None.__class__, "is not"),
])
def test_bad_rate_specs_are_refused_with_an_example(spec, why):
    with pytest.raises(InvalidTaskOptions, match=r"rate_limit=.*" + why + r".*'100/m'"):
        parse(spec)


def _f(account: str) -> None: ...


def test_bad_combinations_are_refused_at_declaration():
    with pytest.raises(InvalidTaskOptions, match="rate_limit_key needs rate_limit"):
        queue_task(rate_limit_key="account", name="t.a")(_f)
    with pytest.raises(InvalidTaskOptions, match="names no argument"):
        queue_task(rate_limit="1/s", rate_limit_key="nope", name="t.b")(_f)
    with pytest.raises(InvalidTaskOptions, match="can't be combined with ordered_by"):
        queue_task(rate_limit="1/s", concurrency_limit=2, name="t.c")(_f)
    with pytest.raises(InvalidTaskOptions, match="can't be combined with ordered_by"):
        queue_task(rate_limit="1/s", ordered_by="account", name="t.d")(_f)
    with pytest.raises(InvalidTaskOptions, match="can't be combined with cron"):
        queue_task(rate_limit="1/s", cron="* * * * *", cron_args=["a"], name="t.e")(_f)
    with pytest.raises(InvalidTaskOptions, match=r"t.f: rate_limit='fast'"):
        queue_task(rate_limit="fast", name="t.f")(_f)


def test_per_call_keys_are_checked():
    with pytest.raises(InvalidTaskOptions, match="needs a task declared with rate_limit"):
        unlimited.using(rate_limit_key="k")
    with pytest.raises(InvalidTaskOptions, match="rate_limit_key must be a non-empty string"):
        per_account.using(rate_limit_key="")
    with pytest.raises(InvalidTaskOptions, match="rate_limit_key must be"):
        per_account.using(rate_limit_key="x" * 256)
    with pytest.raises(InvalidTaskOptions, match=r"'account'.*None or missing"):
        per_account.enqueue(None, 1, "x")  # type: ignore[arg-type]
    handle = per_account.using(rate_limit_key=42).enqueue("a", 1, "x")  # type: ignore[arg-type]
    assert Message.objects.get(pk=handle.id).rate_key == "42"
    # A per-call ordered subject, as at declaration: the message took the gate's path and
    # its rate key got no row (nothing claimed it until the leader's repair).
    for task in (per_account, per_minute):
        with pytest.raises(InvalidTaskOptions, match=r"\.using\(subject=\.\.\.\) on a task "
                                                     "with a rate_limit"):
            task.using(subject="acct:7")


# --- throttled, never ready --------------------------------------------------------------------

def test_a_rate_limited_message_waits_throttled_and_plain_claims_step_over_it():
    rated = [per_minute.enqueue(i, "hol").id for i in range(50)]
    plain = [unlimited.enqueue(i, "hol").id for i in range(20)]
    assert {statuses()[i] for i in rated} == {"throttled"}
    # No head-of-line blocking: the 20 behind 50 throttled ones come in one claim.
    assert sorted(claim_plain(100)) == plain
    row = RateLimit.objects.get(pk=rate_id("default", KEY))
    assert (row.queue, row.rate_key, row.rate_limit) == ("default", KEY, "100/m")


def test_a_key_starts_one_message_per_interval_in_enqueue_order():
    ids = [per_minute.enqueue(i, "space").id for i in range(3)]
    assert claim_rated() == [ids[0]]
    assert claim_rated() == []                      # 0.6 s have not passed
    row = RateLimit.objects.get(pk=rate_id("default", KEY))
    assert (row.next_at - timezone.now()).total_seconds() == pytest.approx(0.6, abs=0.1)
    time.sleep(0.65)
    assert claim_rated() == [ids[1]]
    open_key()
    assert claim_rated() == [ids[2]]


def test_keys_are_limited_apart():
    a = [per_account.enqueue("a", i, "keys").id for i in range(3)]
    b = [per_account.enqueue("b", i, "keys").id for i in range(3)]
    assert sorted(claim_rated(10)) == [a[0], b[0]]
    assert claim_rated(10) == []


def test_a_delayed_rate_limited_message_is_promoted_to_throttled():
    handle = per_minute.using(delay=0.2).enqueue(1, "delayed")
    assert statuses()[handle.id] == "scheduled"
    time.sleep(0.3)
    broker.promote_due()
    assert statuses()[handle.id] == "throttled"
    assert claim_plain() == [] and claim_rated() == [handle.id]


@pytest.mark.parametrize("way", ["retry", "release", "recover", "requeue"])
def test_every_way_back_to_the_queue_is_throttled(way):
    handle = per_minute.enqueue(1, way)
    [claimed] = broker.claim_throttled(["default"], 1, "w", lease_seconds=30)
    if way == "retry":
        broker.fail(claimed, RUNNER, AttemptResult(started_at=timezone.now(),
                                                   error_class="E"), retry_in=0.0)
    elif way == "release":
        assert broker.release([claimed]) == 1
    elif way == "recover":
        Message.objects.filter(pk=handle.id).update(
            lease_expires_at=timezone.now() - timezone.timedelta(seconds=5),
            owner_connection=None)
        assert broker.recover() == [handle.id]
    else:
        Message.objects.filter(pk=handle.id).update(status="dead", claim_token=None)
        broker.requeue([handle.id], Operator(name="test"))
    assert statuses()[handle.id] == "throttled"
    assert claim_plain() == []
    open_key()
    assert claim_rated() == [handle.id]


# --- the park ends at the key's next start ------------------------------------------------------

def test_a_park_ends_when_the_key_may_start_again_not_before():
    per_minute.enqueue(1, "park")
    per_minute.enqueue(2, "park")
    claim_rated()
    RateLimit.objects.filter(pk=rate_id("default", KEY)).update(
        next_at=timezone.now() + timezone.timedelta(seconds=1.5))
    started = time.monotonic()
    state, _ = broker.idle_wait(["default"], 30.0, rates=True)
    waited = time.monotonic() - started
    assert state == "due" and 1.0 < waited < 3.0  # (slept until the key's next start)
    assert broker.idle_wait(["default"], 30.0, rates=True)[0] == "due"
    # A worker without rate-limited tasks doesn't wake for them (it couldn't claim them).
    started = time.monotonic()
    assert broker.idle_wait(["default"], 0.5)[0] == "slept"
    assert time.monotonic() - started >= 0.45


# --- producers, retention, rows changed by hand --------------------------------------------------

def test_repeatable_read_producers_of_the_same_keys_at_once_neither_deadlock_nor_lose():
    for account in "abc":  # keys that exist: producers only read their rows
        per_account.enqueue(account, 0, "rr")
    barrier = threading.Barrier(2)
    errors: list[Any] = []

    def produce(order: list[str]) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with transaction.atomic():
                barrier.wait(timeout=10)
                for account in order:
                    per_account.enqueue(account, 1, "rr")
                    time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001  (handed to the test)
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=produce, args=(order,))
               for order in (["a", "b", "c"], ["c", "b", "a"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert Message.objects.filter(status="throttled").count() == 9
    assert RateLimit.objects.count() == 3


def test_retention_deletes_idle_keys_only():
    per_account.enqueue("busy", 1, "ret")
    per_account.enqueue("idle", 1, "ret")
    [claimed] = [m for m in broker.claim_throttled(["default"], 10, "w", 30)
                 if m.payload.startswith('{"args": ["idle"') or "idle" in m.payload][:1]
    broker.ack_many([(claimed, RUNNER, AttemptResult(started_at=timezone.now()))])
    RateLimit.objects.update(next_at=timezone.now() - timezone.timedelta(seconds=30))
    retention.prune("w", "h", 1)
    assert RateLimit.objects.count() == 2            # idle for less than an hour: kept
    RateLimit.objects.update(next_at=timezone.now() - timezone.timedelta(hours=2))
    retention.prune("w", "h", 1)
    assert set(RateLimit.objects.values_list("rate_key", flat=True)) == {"busy"}


def test_a_key_row_deleted_by_hand_is_made_again_by_the_repair():
    handle = per_account.enqueue("lost-row", 1, "repair")
    RateLimit.objects.all().delete()
    assert claim_rated() == []                       # nothing can claim it now
    assert broker.repair_rate_keys() == 1
    assert RateLimit.objects.get().pk == rate_id("default", "lost-row")  # same digest
    assert claim_rated() == [handle.id]
    assert broker.repair_rate_keys() == 0


def test_a_tampered_interval_or_status_is_survived():
    first = per_minute.enqueue(1, "tamper").id
    second = per_minute.enqueue(2, "tamper").id
    Message.objects.filter(pk=first).update(rate_interval=None)  # a NULL spacing: none
    assert claim_rated() == [first]
    assert claim_rated() == [second]                 # the key was not held back
    huge = per_minute.enqueue(9, "tamper").id
    Message.objects.filter(pk=huge).update(rate_interval=2**63 - 1)  # no overflow error
    open_key()
    assert claim_rated() == [huge]
    row = RateLimit.objects.get(pk=rate_id("default", KEY))
    assert (row.next_at - timezone.now()).total_seconds() == pytest.approx(7 * 86400, abs=5)
    third = per_minute.enqueue(3, "tamper").id
    Message.objects.filter(pk=third).update(status="ready")   # by hand: a plain claim
    assert claim_plain() == [third]                  # takes it (documented)


def test_a_message_lost_before_is_left_to_an_idle_worker():
    lost = per_minute.enqueue(1, "solo").id
    fresh = per_minute.enqueue(2, "solo").id
    Message.objects.filter(pk=lost).update(losses=1)
    # A busy worker would hold it until its other tasks end (it runs alone): it takes the
    # next one instead, whose start follows its claim.
    assert [m.id for m in broker.claim_throttled(["default"], 5, "w", 30, idle=False)] \
        == [fresh]
    open_key()
    assert [m.id for m in broker.claim_throttled(["default"], 5, "w", 30, idle=True)] \
        == [lost]


def test_the_admin_lists_rate_keys_with_their_throttled_messages(root):
    for seq in range(3):
        per_account.enqueue("acct-9", seq, "admin")
    page = root.get("/admin/django_mysqlq/ratelimit/")
    assert page.status_code == 200
    assert b"acct-9" in page.content and b"10/s" in page.content
    [link] = throttled_links(page.content.decode(), "acct-9")
    assert link.endswith(">3")
    found = root.get(link.split('"')[0])
    assert found.status_code == 200
    assert len(found.context["cl"].result_list) == 3


def throttled_links(html: str, key: str) -> list[str]:
    """The "throttled messages" links of ``key``'s rows (href and count)."""
    import html as entities
    import re

    return [entities.unescape(found) for found in re.findall(
        r'href="(/admin/django_mysqlq/message/\?[^"]*rate_key=' + re.escape(key)
        + r'[^"]*">[\d,+]+)<', html)]


def test_a_task_wide_key_links_to_its_throttled_messages_on_its_queue_only(root):
    """The link filters on key, queue and status: a search for the key would read it as
    the task's name and list every message of the task, on every queue."""
    ids = [per_minute.enqueue(seq, "linked").id for seq in range(3)]
    open_key()
    [running] = claim_rated(1)  # the task's, but claimed: not throttled
    elsewhere = per_minute.using(queue="other").enqueue(9, "elsewhere").id
    page = root.get("/admin/django_mysqlq/ratelimit/").content.decode()
    links = throttled_links(page, KEY)
    assert len(links) == 2  # the key on each queue
    [on_default] = [link for link in links if "queue=default" in link]
    response = root.get(on_default.split('"')[0])
    assert response.status_code == 200
    listed = {m.pk for m in response.context["cl"].result_list}
    assert listed == set(ids) - {running} and elsewhere not in listed
    assert on_default.endswith(">2")


def test_the_test_drain_runs_rate_limited_messages_at_their_pace():
    from django_mysqlq.testing import drain

    for seq in range(3):
        per_account.enqueue("drained", seq, "drain")
    started = time.monotonic()
    assert drain(wait_seconds=2).succeeded == 3
    assert time.monotonic() - started >= 0.19  # 10/s: three starts span 0.2 s


def test_enqueue_many_makes_every_key_and_throttles_every_message():
    handles = per_account.enqueue_many([("m1", 1, "many"), ("m2", 1, "many"),
                                        ("m1", 2, "many")])
    assert {statuses()[h.id] for h in handles} == {"throttled"}
    assert set(RateLimit.objects.values_list("rate_key", flat=True)) == {"m1", "m2"}
    assert sorted(claim_rated(10)) == sorted([handles[0].id, handles[1].id])


def test_a_unique_rate_limited_call_is_one_throttled_message():
    first = per_minute.using(unique_for=0).enqueue(1, "both")
    again = per_minute.using(unique_for=0).enqueue(1, "both")
    assert again.id == first.id
    assert statuses() == {first.id: "throttled"}
    assert claim_rated() == [first.id]


def test_a_settings_schedule_of_a_rate_limited_task_is_E006(settings):
    from django_mysqlq.checks import check_schedules

    settings.MYSQLQ = {"SCHEDULES": {"geo": {"task": per_minute.name, "cron": "0 3 * * *",
                                             "args": [1, "x"]}}}
    [error] = check_schedules()
    assert error.id == "django_mysqlq.E006"
    assert "has rate_limit='100/m'" in error.msg and "would not wait" in error.msg


def test_a_replayed_copy_waits_for_the_limit_too():
    from django_mysqlq import ops
    from django_mysqlq.models import Attempt

    per_account.enqueue("replayed", 1, "replay")
    [claimed] = broker.claim_throttled(["default"], 1, "w", lease_seconds=30)
    broker.ack_many([(claimed, RUNNER, AttemptResult(started_at=timezone.now()))])
    attempt = Attempt.objects.get(message_id=claimed.id, outcome="succeeded")
    copy = ops.replay(attempt.pk, Operator(name="test"))
    row = Message.objects.get(pk=copy)
    assert (row.status, row.rate_key, row.rate_interval) == ("throttled", "replayed", 100_000)
    assert claim_plain() == []


def test_an_operator_can_cancel_throttled_messages_but_not_requeue_them():
    """``queuecancel --status throttled`` (and the broker's cancel) deletes waiting
    rate-limited messages, keeping their arguments in history; a requeue is refused."""
    import io

    from django.core.management import CommandError, call_command

    from django_mysqlq.models import Attempt

    rated = [per_minute.enqueue(i, "cancel-throttled").id for i in range(6)]
    plain = unlimited.enqueue(0, "cancel-throttled").id
    out = io.StringIO()
    call_command("queuecancel", "--status", "throttled", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "6 message(s) would be cancelled."
    call_command("queuecancel", "--status", "throttled", stdout=out, stderr=io.StringIO())
    assert statuses() == {plain: "ready"}
    cancelled = Attempt.objects.filter(message_id__in=rated, outcome="cancelled")
    assert cancelled.count() == 6 and all('"cancel-throttled"' in row.payload
                                          for row in cancelled)
    with pytest.raises(CommandError, match="rate limit's next start"):
        call_command("queuerequeue", "--status", "throttled")
    # The key's row holds nothing: the next message of the key starts at once.
    again = per_minute.enqueue(99, "cancel-throttled").id
    assert [m.id for m in broker.claim_throttled(["default"], 1, "w", lease_seconds=30)] == [
        again]
    assert broker.cancel([again], Operator("t")) == []  # claimed (running): never touched


def test_keys_claimed_before_a_later_key_fails_are_given_back(monkeypatch, caplog):
    """A throttled claim that fails part-way (a later key's transaction: a lost connection,
    a lock wait) raises without its earlier keys' messages: they go back, unspent, rather
    than wait claimed by nobody for their lease to run out."""
    from django.db import OperationalError

    from django_mysqlq.broker import rates

    a = per_account.enqueue("a", 0, "part-way").id
    b = per_account.enqueue("b", 0, "part-way").id
    real, calls = rates.in_transaction, []

    def failing_second(alias, body):
        calls.append(alias)
        if len(calls) == 2:
            raise OperationalError(1205, "Lock wait timeout exceeded")
        return real(alias, body)

    monkeypatch.setattr(rates, "in_transaction", failing_second)
    with pytest.raises(OperationalError):
        claim_rated(10)
    assert len(calls) == 2
    rows = {m.pk: (m.status, m.attempts, m.claim_token)
            for m in Message.objects.filter(pk__in=[a, b])}
    assert rows == {a: ("throttled", 0, None), b: ("throttled", 0, None)}
    assert "1 message(s) already claimed from earlier rate keys were given back" in caplog.text
    monkeypatch.undo()
    # (The first key's start was spent: its next one is an interval away.)
    RateLimit.objects.update(next_at=timezone.now() - timezone.timedelta(seconds=1))
    assert sorted(claim_rated(10)) == [a, b]
