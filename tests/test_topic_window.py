"""The pump's window bounds what a group keeps in the queue table, not running: its ready
and scheduled deliveries (a failing group's retries) up to ``TOPIC_WINDOW``, its blocked
ones (a hot key, or one held by a dead delivery) up to ``BLOCKED_WINDOWS`` windows. A
group far behind keeps its backlog in the topic (the review's cases: a failing handler's
group, and a held key, pumped their whole backlog into ``mysqlq_message``)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_mysqlq import Topic, broker
from django_mysqlq.broker import group_window
from django_mysqlq.broker.deliveries import BLOCKED_WINDOWS
from django_mysqlq.broker.group_window import SCHEDULED_WINDOWS
from django_mysqlq.messages import AttemptResult, ClaimedMessage
from django_mysqlq.models import Attempt, Message
from django_mysqlq.topicnames import delivery_task_name, group_queue
from tests.burst import run_burst
from tests.operator_support import RUNNER
from tests.testapp.models import GateRun
from tests.topic_ops_support import claim

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 6
BATCH = 4


def made_group(topic: str, name: str, on_dead: str = "skip") -> broker.GroupSpec:
    made = broker.GroupSpec(topic=topic, group=name, queue=group_queue(name),
                            task_name=delivery_task_name(topic, name), on_dead=on_dead,
                            max_attempts=50, retry_backoff=0.1, timeout=None,
                            start="earliest")
    broker.ensure_topic(topic)
    broker.create_group(made)
    return made


def claim_for(count: int) -> broker.PumpClaim:
    return broker.PumpClaim(count, RUNNER.worker_id, lease_seconds=30)


def fail(messages: list[ClaimedMessage], *, retry: bool = True) -> None:
    """The handler fails: a retry in an hour (or dead at once)."""
    for message in messages:
        broker.fail(message, RUNNER, AttemptResult(
            started_at=broker.database_now(), error_class="RuntimeError",
            error_message="handler broke", traceback="..."), retry=retry, retry_in=3600)


def ack(messages: list[ClaimedMessage]) -> None:
    for message in messages:
        assert broker.ack(message, RUNNER, AttemptResult(started_at=broker.database_now()))


def statuses(made: broker.GroupSpec) -> dict[str, int]:
    found: dict[str, int] = {}
    for status in Message.objects.filter(queue=made.queue).values_list("status", flat=True):
        found[status] = found.get(status, 0) + 1
    return found


def test_a_failing_groups_retries_fill_its_window_and_the_backlog_stays_in_the_topic() -> None:
    """Each round the member pumps (claiming for itself while none is ready, or by the
    window) and every delivery fails fast into a retry: the retries are not running
    either, so the pump stops once the window holds them."""
    feed = Topic("failwin")
    made = made_group("failwin", "billing")
    feed.publish_many([{"n": n} for n in range(200)])
    broker.sequence("failwin")
    for _ in range(30):
        _, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(3))
        fail(claimed)
        broker.pump_group(made, BATCH, WINDOW)
        fail(claim(made, 100))
        # A member woken by a publish goes straight into the pump: the full window
        # stops it too.
        _, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(3), sequence=True,
                                          woken=True)
        fail(claimed)
    assert statuses(made) == {"scheduled": WINDOW}
    assert broker.position("failwin", "billing") == WINDOW
    # A retry that ends (acked): the handler works again, so the other retries no
    # longer hold the pump (group_window): it pumps by the window's room for ready ones.
    retry = Message.objects.filter(queue=made.queue).order_by("id").first()
    assert retry is not None
    Message.objects.filter(pk=retry.pk).update(status="ready")
    ack(claim(made, 1))
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH
    assert broker.position("failwin", "billing") == WINDOW + BATCH


def hold_key(feed: Topic, made: broker.GroupSpec, key: str) -> None:
    """The key's first message fails for good: with ``on_dead="hold"`` its later ones wait."""
    feed.publish({"n": -1}, key=key)
    broker.sequence(feed.name)
    assert broker.pump_group(made, BATCH, WINDOW).made == 1
    fail(claim(made, 1), retry=False)
    assert statuses(made) == {"dead": 1}


def test_a_held_key_stops_the_pump_at_its_bound_and_other_keys_go_on_until_then() -> None:
    feed = Topic("heldwin")
    made = made_group("heldwin", "billing", on_dead="hold")
    hold_key(feed, made, "hot")
    # Every other message is the held key's; the others each have their own key.
    count = 4 * BLOCKED_WINDOWS * WINDOW
    feed.publish_many([{"n": n} for n in range(count)],
                      keys=["hot" if n % 2 == 0 else f"k{n}" for n in range(count)])
    broker.sequence("heldwin")
    handled = 0
    for _ in range(count):
        made_now = broker.pump_group(made, BATCH, WINDOW).made
        taken = claim(made, 100)
        ack(taken)
        handled += len(taken)
        if not made_now and not taken:
            break
    bound = BLOCKED_WINDOWS * WINDOW
    blocked = statuses(made).get("blocked", 0)
    # The pump stopped at the bound (passed by at most one batch) with most of the
    # backlog still in the topic...
    assert bound <= blocked <= bound + BATCH
    assert broker.position("heldwin", "billing") <= 1 + 2 * (bound + BATCH) < count
    # ...and until then the other keys were handled (one for each blocked delivery).
    assert handled >= bound - BATCH
    assert broker.pump_group(made, BATCH, WINDOW).made == 0
    # A member with room claims nothing more of it either (none is ready).
    pumped, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(3))
    assert (pumped.made, claimed) == (0, [])


def test_blocked_deliveries_do_not_fill_the_window_of_ready_ones() -> None:
    """Under the blocked bound, a held key doesn't stop the group's other keys: the
    window counts ready and scheduled deliveries only."""
    feed = Topic("heldroom")
    made = made_group("heldroom", "billing", on_dead="hold")
    hold_key(feed, made, "hot")
    feed.publish_many([{"n": n} for n in range(2 * WINDOW)], keys=["hot"] * (2 * WINDOW))
    feed.publish_many([{"n": n} for n in range(WINDOW)], keys=[f"k{n}" for n in range(WINDOW)])
    broker.sequence("heldroom")
    while broker.pump_group(made, BATCH, WINDOW).made:
        pass
    assert statuses(made) == {"dead": 1, "blocked": 2 * WINDOW, "ready": WINDOW}


def test_retries_scheduled_for_later_do_not_hold_the_pump_to_half_a_batch() -> None:
    """The half-batch rule (``least``) waits for room only while a delivery is ready (a
    member claims those meanwhile); with none ready, retries scheduled for later filling
    most of the window left its room unpumped until one of them ended."""
    feed = Topic("retryroom")
    made = made_group("retryroom", "billing")
    feed.publish_many([{"n": n} for n in range(20)])
    broker.sequence("retryroom")
    least = BATCH
    assert broker.pump_group(made, BATCH, WINDOW, least=least).made == BATCH
    fail(claim(made, BATCH - 1))
    # A delivery is ready and the room (2) is under half a batch: the pump waits.
    assert broker.pump_group(made, BATCH, WINDOW, least=least).made == 0
    fail(claim(made, 1))
    assert statuses(made) == {"scheduled": BATCH}
    # None is ready: the pump fills the room the retries leave.
    assert broker.pump_group(made, BATCH, WINDOW, least=least).made == WINDOW - BATCH
    assert statuses(made) == {"scheduled": BATCH, "ready": WINDOW - BATCH}
    assert broker.position("retryroom", "billing") == WINDOW


def test_a_pump_stopped_at_a_bound_is_not_behind_for_a_burst_member() -> None:
    """``group_behind(window=…)``, what a ``--burst`` member asks once nothing of its queues
    is ready, running or due soon: a group whose pump waits at its window or blocked bound
    has caught up (its pump gets nothing until deliveries end)."""
    feed = Topic("boundbehind")
    made = made_group("boundbehind", "billing")
    feed.publish_many([{"n": n} for n in range(20)])
    broker.sequence("boundbehind")
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH
    fail(claim(made, 100))
    # Room under the window: still behind, its pump has room.
    assert broker.group_behind(made, window=WINDOW)
    assert broker.pump_group(made, BATCH, WINDOW).made == WINDOW - BATCH
    fail(claim(made, 100))
    assert statuses(made) == {"scheduled": WINDOW}
    assert broker.group_behind(made)  # messages are left after its position...
    assert not broker.group_behind(made, window=WINDOW)  # ...that its pump can't take
    hot = Topic("boundheld")
    held = made_group("boundheld", "audit", on_dead="hold")
    hold_key(hot, held, "hot")
    count = BLOCKED_WINDOWS * WINDOW
    hot.publish_many([{"n": n} for n in range(count + 5)], keys=["hot"] * (count + 5))
    broker.sequence("boundheld")
    while broker.group_behind(held, window=WINDOW):
        assert broker.pump_group(held, BATCH, WINDOW).made
    assert statuses(held) == {"dead": 1, "blocked": count}
    assert broker.group_behind(held)
    assert broker.pump_group(held, BATCH, WINDOW).made == 0


#: A --burst member of tests/testapp/window_handlers.py's groups with a small window.
SMALL = 5
WORKER_ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.window_handlers",
              "MYSQLQ_TEST_TOPIC_WINDOW": str(SMALL)}


def subscribed(group: str, on_dead: str = "skip") -> broker.GroupSpec:
    """The group of window_handlers.py, created at the latest offset (before the test's
    messages are published)."""
    made = broker.GroupSpec(topic="windowfeed", group=group, queue=group_queue(group),
                            task_name=delivery_task_name("windowfeed", group),
                            on_dead=on_dead, max_attempts=1, retry_backoff=3600.0,
                            timeout=None)
    broker.ensure_topic("windowfeed")
    broker.create_group(made)
    return made


@pytest.mark.worker
def test_a_burst_member_ends_when_a_held_key_stops_its_pump_at_the_blocked_bound(
        start_worker) -> None:
    """More than ``BLOCKED_WINDOWS`` windows of messages behind a key held by a dead
    delivery: the member handles the other keys, pumps the held key's up to the bound and
    ends (it used to wait for good: its group stayed behind its topic)."""
    made = subscribed("heldwin", on_dead="hold")
    feed = Topic("windowfeed")
    feed.publish_many([{"label": "heldwin", "seq": n} for n in range(SMALL)],
                      keys=[f"k{n}" for n in range(SMALL)])
    feed.publish({"label": "heldwin", "seq": SMALL, "fail": True}, key="hot")
    count = 2 * BLOCKED_WINDOWS * SMALL
    feed.publish_many([{"label": "heldwin", "seq": n} for n in range(SMALL + 1,
                                                                      SMALL + 1 + count)],
                      keys=["hot"] * count)
    summary, output = run_burst(start_worker, "--groups", "heldwin", env=WORKER_ENV,
                                patience=45)
    assert (summary["succeeded"], summary["dead"]) == (SMALL, 1), output[-3000:]
    blocked = statuses(made).get("blocked", 0)
    assert BLOCKED_WINDOWS * SMALL <= blocked <= (BLOCKED_WINDOWS + 1) * SMALL, statuses(made)
    position = broker.position("windowfeed", "heldwin")
    assert position is not None and position == SMALL + 1 + blocked < SMALL + 1 + count
    assert GateRun.objects.filter(key="heldwin:", outcome="ok").count() == SMALL


@pytest.mark.worker
def test_a_burst_member_ends_when_retries_due_after_burst_wait_fill_its_window(
        start_worker) -> None:
    """A handler failing into retries an hour away, with more messages than the window:
    the member ends after ``--burst-wait`` (it used to wait through the whole schedule)."""
    made = subscribed("laterwin")
    total = 8 * SMALL
    Topic("windowfeed").publish_many([{"label": "laterwin", "seq": n} for n in range(total)])
    summary, output = run_burst(start_worker, "--groups", "laterwin", "--concurrency", "2",
                                "--batch", "2", env=WORKER_ENV, patience=45)
    assert summary["succeeded"] == 0 and summary["dead"] == 0, output[-3000:]
    waiting = statuses(made)
    assert set(waiting) == {"scheduled"} and waiting["scheduled"] >= SMALL, waiting
    assert broker.position("windowfeed", "laterwin") == waiting["scheduled"] < total


@pytest.mark.worker
def test_a_burst_member_of_a_working_group_handles_all_past_more_retries_than_its_window(
        start_worker) -> None:
    """Some messages fail into retries an hour away, more of them than the window holds,
    while the others succeed: the retries don't hold the pump of a group whose handler
    works, so every other message is handled (its pump stopped for good at the window's
    worth of retries, and the member ended with the rest unhandled in the topic)."""
    made = subscribed("somewin")
    total = 8 * SMALL
    failing = {n for n in range(total) if n % 4 == 1}  # 10, twice the window
    Topic("windowfeed").publish_many([{"label": "somewin", "seq": n, "fail": n in failing}
                                      for n in range(total)])
    summary, output = run_burst(start_worker, "--groups", "somewin", "--concurrency", "2",
                                "--batch", "2", env=WORKER_ENV, patience=45)
    assert summary["succeeded"] == total - len(failing), output[-3000:]
    assert statuses(made) == {"scheduled": len(failing)}
    assert broker.position("windowfeed", "somewin") == total
    assert set(GateRun.objects.filter(key="somewin:", outcome="ok")
               .values_list("seq", flat=True)) == set(range(total)) - failing


def test_a_working_groups_retries_do_not_hold_its_pump() -> None:
    """A few messages failing for hours filled the window with retries and stopped the
    group's pump: the rest waited behind them although the handler works. Retries count
    in the window only while none of the group's newest attempts succeeded."""
    feed = Topic("somefail")
    made = made_group("somefail", "billing")
    total = 40
    feed.publish_many([{"n": n} for n in range(total)])
    broker.sequence("somefail")
    failed = 0
    for _ in range(total):
        made_now = broker.pump_group(made, BATCH, WINDOW).made
        taken = claim(made, 100)
        ack(taken[:1])  # one works each round, the rest fail into retries (until 8 did)
        failing = taken[1:][:max(0, 8 - failed)]
        fail(failing)
        failed += len(failing)
        ack(taken[1 + len(failing):])
        if not made_now and not taken:
            break
    assert failed == 8 > WINDOW
    assert statuses(made) == {"scheduled": 8}
    assert broker.position("somefail", "billing") == total
    # A quiet while (a deploy, a night) changes nothing: the state is its newest attempts.
    Attempt.objects.filter(queue=made.queue).update(
        finished_at=timezone.now() - dt.timedelta(hours=2))
    feed.publish_many([{"n": n} for n in range(5)])
    broker.sequence("somefail")
    assert broker.group_behind(made, window=WINDOW)
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH


def test_a_group_whose_newest_attempts_all_failed_counts_its_retries_until_one_succeeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_window, "RECENT_ATTEMPTS", 5)
    feed = Topic("nowfail")
    made = made_group("nowfail", "billing")
    feed.publish_many([{"n": n} for n in range(100)])
    broker.sequence("nowfail")
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH
    ack(claim(made, 100))  # it worked...
    for _ in range(100):  # ...then everything fails
        made_now = broker.pump_group(made, BATCH, WINDOW).made
        taken = claim(made, 100)
        fail(taken)
        if not made_now and not taken:
            break
    scheduled = statuses(made)["scheduled"]
    # Held once its newest 5 attempts failed (and its retries were half a window, then a
    # window): far under the 10 windows a working group may keep.
    assert WINDOW <= scheduled <= WINDOW + 5 + BATCH < SCHEDULED_WINDOWS * WINDOW
    assert not broker.group_behind(made, window=WINDOW)
    # A retry that succeeds: it works again, its retries no longer hold it.
    retry = Message.objects.filter(queue=made.queue).order_by("id").first()
    assert retry is not None
    Message.objects.filter(pk=retry.pk).update(status="ready")
    ack(claim(made, 1))
    assert broker.group_behind(made, window=WINDOW)
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH


def test_a_group_on_two_topics_has_one_state_for_its_one_queue() -> None:
    """The retries of one topic's deliveries and the successes of the other's are one
    group's: a topic quiet for a while is not held by its busy sibling's retries."""
    busy, quiet = Topic("busyside"), Topic("quietside")
    on_busy, on_quiet = made_group("busyside", "both"), made_group("quietside", "both")
    assert on_busy.queue == on_quiet.queue
    busy.publish_many([{"n": n} for n in range(40)])
    broker.sequence("busyside")
    failed = 0
    for _ in range(40):
        made_now = broker.pump_group(on_busy, BATCH, WINDOW).made
        taken = claim(on_busy, 100)
        ack(taken[:1])
        failing = taken[1:][:max(0, 8 - failed)]
        fail(failing)
        failed += len(failing)
        ack(taken[1 + len(failing):])
        if not made_now and not taken:
            break
    assert statuses(on_busy) == {"scheduled": 8}
    quiet.publish_many([{"n": n} for n in range(3)])
    broker.sequence("quietside")
    assert broker.group_behind(on_quiet, window=WINDOW)
    assert broker.pump_group(on_quiet, BATCH, WINDOW).made == 3


def test_a_woken_member_of_a_working_group_with_many_retries_takes_the_looks_room() -> None:
    """Half a window of retries or more: the woken quick pump leaves the group to the
    look, which weighs them (a working group's don't count): it took only the room they
    left (6 - 4 = 2 of 3)."""
    feed = Topic("wokenworks")
    made = made_group("wokenworks", "billing")
    feed.publish_many([{"n": n} for n in range(6)])
    broker.sequence("wokenworks")
    assert broker.pump_group(made, BATCH, WINDOW).made == BATCH
    taken = claim(made, 100)
    fail(taken)
    assert statuses(made) == {"scheduled": BATCH}
    assert broker.pump_group(made, BATCH, WINDOW).made == 2
    ack(claim(made, 100))  # two work: the group's handler works
    feed.publish_many([{"n": n} for n in range(5)])
    _, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(3), sequence=True,
                                      woken=True)
    assert len(claimed) == 3
    assert statuses(made) == {"scheduled": BATCH, "claimed": 3}


def test_a_working_groups_retries_stop_its_pump_at_their_own_bound() -> None:
    """Most deliveries failing, but not all: the retries don't count in the window, yet
    they stop the pump at ``SCHEDULED_WINDOWS`` windows, the backlog left in the topic."""
    feed = Topic("mostfail")
    made = made_group("mostfail", "billing")
    total = 4 * SCHEDULED_WINDOWS * WINDOW
    feed.publish_many([{"n": n} for n in range(total)])
    broker.sequence("mostfail")
    for _ in range(total):
        made_now = broker.pump_group(made, BATCH, WINDOW).made
        taken = claim(made, 100)
        ack(taken[:1])
        fail(taken[1:])
        if not made_now and not taken:
            break
    bound = SCHEDULED_WINDOWS * WINDOW
    scheduled = statuses(made)["scheduled"]
    assert bound <= scheduled <= bound + BATCH
    assert broker.position("mostfail", "billing") < total
    assert broker.group_behind(made)
    assert not broker.group_behind(made, window=WINDOW)  # a --burst member ends there


def test_a_woken_member_takes_no_more_than_the_windows_room() -> None:
    """The look's pump takes ``min(claim, batch, room)``; the woken one (straight into the
    transaction, no look) only required the window not to be full and took
    ``min(claim, batch)``: with 5 retries scheduled in a window of 6 it took 4, not 1."""
    feed = Topic("wokenroom")
    made = made_group("wokenroom", "billing")
    feed.publish_many([{"n": n} for n in range(5)])
    broker.sequence("wokenroom")
    assert broker.pump_group(made, BATCH + 1, WINDOW).made == 5
    fail(claim(made, 5))
    assert statuses(made) == {"scheduled": 5}
    feed.publish_many([{"n": n} for n in range(10)])  # not sequenced: as a publish wakes
    pumped, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(BATCH),
                                           sequence=True, woken=True)
    assert (pumped.made, len(claimed)) == (1, 1)
    assert broker.position("wokenroom", "billing") == 6


def test_a_woken_pump_whose_count_comes_back_null_looks_instead(monkeypatch) -> None:
    """A producer's wake-up (KILL QUERY) landing in the woken lock's count subquery can
    make MariaDB answer NULL (seen for the look in a chaos run). The woken pump did
    ``int(None)``: a TypeError the member took for its group's own failure (an ERROR
    line, a pump problem on the row, a pause). It now looks as usual and pumps."""
    from django_mysqlq.broker import deliveries

    nulled = deliveries.LOCK_GROUP_IF_ROOM_SQL.replace(
        "SELECT id, position, ", "SELECT id, position, NULL AS counted_null, 0 * ", 1)
    assert nulled != deliveries.LOCK_GROUP_IF_ROOM_SQL
    monkeypatch.setattr(deliveries, "LOCK_GROUP_IF_ROOM_SQL", nulled)
    feed = Topic("wokennull")
    made = made_group("wokennull", "billing")
    feed.publish_many([{"n": n} for n in range(3)])  # not sequenced: as a publish wakes
    pumped, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(BATCH),
                                           sequence=True, woken=True)
    assert (pumped.made, len(claimed)) == (3, 3)


def test_the_woken_lock_counts_the_groups_retries_once() -> None:
    """The woken pump's lock read the group's scheduled deliveries twice (the select
    list's count and the condition's): two walks of the claim index's range, up to a
    window each, in the statement between a publish and its handler. It counts them once
    now, with the same answer: the room it takes is the window's less those."""
    import json

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    feed = Topic("wokenonce")
    made = made_group("wokenonce", "billing")
    feed.publish_many([{"n": n} for n in range(2)])
    broker.sequence("wokenonce")
    assert broker.pump_group(made, BATCH, WINDOW).made == 2
    fail(claim(made, 2))
    feed.publish_many([{"n": n} for n in range(10)])  # not sequenced: as a publish wakes
    with CaptureQueriesContext(connection) as sent:
        pumped, claimed = broker.pump_claiming(made, BATCH, WINDOW, claim_for(BATCH),
                                               sequence=True, woken=True)
    assert (pumped.made, len(claimed)) == (BATCH, BATCH)  # room: 6 - 2 scheduled
    [lock] = [q["sql"] for q in sent.captured_queries
              if q["sql"].endswith("FOR UPDATE SKIP LOCKED") and "'scheduled'" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE FORMAT=JSON " + lock)
        plan = json.loads(cursor.fetchone()[0])
    scans = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "status` = 'scheduled'" in str(node.get("attached_condition", "")):
                scans.append(node["r_loops"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    assert scans == [1], plan
