"""Topics with real worker processes: a ledger proves each consumer group handled each
message (none lost; twice only for runs of a process killed with kill -9), in key order,
through random failures; a failing group goes to its dead letter without delaying the
others, and its dead deliveries can be requeued; broadcast reaches every live process,
and a process started late begins at the latest offset; a broadcast topic whose read fails
holds back none of the reader's others."""

from __future__ import annotations

import signal
import sys
from collections import Counter

import pytest
from django.db.models import F

from django_mysqlq import broker
from django_mysqlq.broker import Operator
from django_mysqlq.models import Attempt, Message, TopicDelivery, TopicGroup, TopicState, Worker
from django_mysqlq.topicnames import delivery_task_name, group_queue
from tests import topic_ops_support
from tests.burst import run_burst
from tests.conftest import wait_for
from tests.operator_support import make_dead
from tests.subject_support import order_violations
from tests.testapp import broadcast_handlers, topic_handlers
from tests.testapp.models import GateRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 120.0
ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.topic_handlers"}
WORKER = ("--concurrency", "4", "--batch", "8")
GROUPS = ("billing", "audit", "broken")


def started(*workers) -> None:
    for worker in workers:
        wait_for(lambda worker=worker: "started: queues=" in worker.output(), timeout=60,
                 message="the worker to start")


def stop(*workers) -> None:
    for worker in workers:
        if worker.popen.poll() is None:
            worker.signal(signal.SIGTERM)
    for worker in workers:
        if worker.popen.poll() is None:
            assert worker.wait(timeout=30) == 0, worker.output()


def ok_seqs(label: str, group: str) -> Counter[int]:
    return Counter(GateRun.objects.filter(label=label, key__startswith=f"{group}:", edge="end",
                                          outcome="ok").values_list("seq", flat=True))


def publish(label: str, count: int, first: int = 0, **extra: object) -> None:
    values = [{"label": label, "seq": seq, **extra} for seq in range(first, first + count)]
    topic_handlers.ledger.publish_many(values, keys=[f"k{seq % 10}" for seq in
                                                     range(first, first + count)])


@pytest.mark.parametrize("members", [(), ("--groups", ",".join(GROUPS))],
                         ids=["every-queue", "groups-only"])
def test_each_group_handles_each_message_through_failures_and_a_kill_9(start_worker,
                                                                         members):
    """Both member shapes: a worker of every queue (its groups' deliveries pumped ready,
    then claimed) and --groups members (pumps that claim for their member)."""
    label = "topic-ledger"
    first, second = (start_worker(*WORKER, *members, env=ENV) for _ in range(2))
    started(first, second)
    assert set(TopicGroup.objects.filter(topic="ledger").values_list("group_name", flat=True)
               ) == set(GROUPS)
    total = 300
    # Random failures only where attempts can't run out: "broken" has 3, and 0.1 ** 3 per
    # message over 300 messages would send one dead in about a quarter of the runs.
    publish(label, total, fail_rate=0.1, flaky=["billing", "audit"], sleep_ms=5)
    wait_for(lambda: sum(ok_seqs(label, "billing").values()) >= 60, timeout=PATIENCE,
             message="a fifth of billing's messages")
    first.signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    third = start_worker(*WORKER, *members, env=ENV)
    started(third)

    def all_handled() -> bool:
        return all(set(ok_seqs(label, group)) == set(range(total)) for group in GROUPS)

    try:
        wait_for(all_handled, timeout=PATIENCE, message="every group to handle every message")
    except BaseException:
        for group in GROUPS:
            missing = sorted(set(range(total)) - set(ok_seqs(label, group)))
            print(group, "missing", missing[:20], "dead", broker.dead_deliveries("ledger", group),
                  "left", list(Message.objects.filter(queue=f"group:{group}").values_list(
                      "id", "status", "attempts", "gate_key")[:10]))
        raise
    stop(second, third)
    killed = first.pid
    duplicates = 0
    for group in GROUPS:
        for seq, count in ok_seqs(label, group).items():
            if count == 1:
                continue
            # Twice only as a run of the killed process (its ack lost with it), then once
            # more by a live one, after it: never twice in one process, nor by two live ones.
            runs = list(GateRun.objects.filter(label=label, key__startswith=f"{group}:",
                                               seq=seq, edge="end", outcome="ok"
                                               ).order_by("at").values_list("pid", "at"))
            pids = Counter(pid for pid, _ in runs)
            assert count == 2 and pids[killed] == 1 and runs[0][0] == killed, (
                f"{group} handled #{seq} {count} times, not one run killed then one more: "
                f"{runs}")
            duplicates += 1
    # Duplicates only after the crash, and few: at most what the killed process held.
    assert duplicates <= 3 * 8 + 20, duplicates
    assert order_violations(label, killed=frozenset({killed})) == []
    # Broadcast: the surviving process alive at the publish got every message; the one
    # started after them begins at the latest offset, so it heard none of them.
    for worker in (second, third):
        got = set(GateRun.objects.filter(label=f"{label}/broadcast", pid=worker.pid)
                  .values_list("seq", flat=True))
        assert got == (set() if worker is third else set(range(total))), (worker.pid, got)
    # Every delivery is linked to its offset, once (no replay here); none is left in the
    # queue.
    assert not Message.objects.filter(queue__startswith="group:").exists()
    offsets = set(range(1, broker.last_offset("ledger") + 1))
    assert len(offsets) == total
    for group in GROUPS:
        linked = TopicDelivery.objects.filter(topic="ledger", group_name=group)
        assert linked.count() == total
        assert set(linked.values_list("offset", flat=True)) == offsets
        assert broker.position("ledger", group) == broker.last_offset("ledger")
    print(f"ledger: {total} messages x {len(GROUPS)} groups, {duplicates} duplicate runs "
          "after the kill -9")


def test_a_failing_group_goes_dead_without_delaying_the_others_and_can_be_requeued(
        start_worker):
    label = "topic-dead"
    worker = start_worker(*WORKER, env=ENV)
    started(worker)
    publish(label, 6, always_fail=["broken"])
    wait_for(lambda: all(set(ok_seqs(label, group)) == set(range(6))
                         for group in ("billing", "audit")),
             timeout=PATIENCE, message="billing and audit to handle everything")
    wait_for(lambda: len(broker.dead_deliveries("ledger", "broken")) == 6, timeout=PATIENCE,
             message="broken's six deliveries to go dead")
    dead = broker.dead_deliveries("ledger", "broken")
    assert set(Message.objects.filter(pk__in=dead).values_list("attempts", flat=True)) == {3}
    # The others finished before broken's deliveries were out of attempts.
    last_other = GateRun.objects.filter(label=label, key__startswith="billing:").order_by(
        "-at").values_list("at", flat=True)[0]
    last_broken = GateRun.objects.filter(label=label, key__startswith="broken:").order_by(
        "-at").values_list("at", flat=True)[0]
    assert last_other < last_broken
    # The trace: each broken delivery's attempts, on this worker, with the outcome.
    trace = Attempt.objects.filter(message_id__in=dead).values_list("outcome", "worker_id")
    assert Counter(outcome for outcome, _ in trace) == {"retried": 12, "failed": 6}
    assert all(worker_id for _, worker_id in trace)
    # Requeued from the dead letter: one more attempt each, which fails again.
    requeued = broker.requeue_dead("topic:ledger:broken", Operator("test:requeue"))
    assert sorted(requeued) == sorted(dead)
    wait_for(lambda: set(Message.objects.filter(pk__in=dead).values_list("attempts", flat=True)
                         ) == {4} and len(broker.dead_deliveries("ledger", "broken")) == 6,
             timeout=PATIENCE, message="the requeued deliveries to run once more")
    assert Attempt.objects.filter(message_id__in=dead, outcome="requeued").count() == 6
    stop(worker)


def dead_letter_of(topic: str, group: str, count: int) -> list[int]:
    """``count`` dead deliveries of the group, made by its pump (no worker: their
    status is set as a worker's last failed attempt leaves it)."""
    made = topic_ops_support.group(topic, group)
    topic_ops_support.publish(topic, count)
    while broker.pump(made, batch=1000, window=count):
        pass
    ids = list(Message.objects.filter(task_name=made.task_name).values_list("pk", flat=True))
    assert len(ids) == count
    Message.objects.filter(pk__in=ids).update(status="dead", attempts=F("max_attempts"))
    return sorted(ids)


def test_requeuing_a_whole_dead_letter_requeues_each_dead_delivery_once(monkeypatch):
    """A group's member whose handler still fails at once sends requeued deliveries back
    to the dead letter while the requeue goes on (no worker here: each batch requeued
    goes dead again before the next is read). The requeue walks the dead letter by id:
    each delivery dead at the call is requeued once, and the call ends. (It read "the
    first 1,000 dead" on every pass: the deliveries of its first pass came first again,
    requeued again and again, another attempt and history row each time, never ending
    while they failed.)"""
    dead = dead_letter_of("orders", "stuck", 2500)
    module = sys.modules[broker.requeue_dead.__module__]
    real = module.requeue
    passes: list[int] = []

    def requeue_then_fail_again(ids, *args, **kwargs):
        passes.append(len(ids))
        assert len(passes) <= 10, f"still requeuing after {sum(passes)} ids: {passes}"
        done = real(ids, *args, **kwargs)
        Message.objects.filter(pk__in=done).update(status="dead", attempts=F("max_attempts"))
        return done

    monkeypatch.setattr(module, "requeue", requeue_then_fail_again)
    requeued = broker.requeue_dead(delivery_task_name("orders", "stuck"),
                                   Operator("test:requeue"))
    assert sorted(requeued) == dead  # each once
    assert passes == [1000, 1000, 500]
    history = Counter(Attempt.objects.filter(outcome="requeued").values_list(
        "message_id", flat=True))
    assert history == Counter(dead)
    # One more attempt each, once: max_attempts 2 -> 3.
    assert set(Message.objects.filter(pk__in=dead).values_list("max_attempts", flat=True)
               ) == {3}


def test_requeuing_dead_deliveries_by_id_leaves_other_tasks_alone():
    """The ids given are filtered by the task named: a dead message of another task
    (another group's delivery, or a plain task) stays dead and is not in the result."""
    mine = dead_letter_of("orders", "stuck", 2)
    theirs = dead_letter_of("refunds", "other", 1)
    plain = make_dead()
    requeued = broker.requeue_dead(delivery_task_name("orders", "stuck"),
                                   Operator("test:requeue"), ids=[*mine, *theirs, plain])
    assert sorted(requeued) == mine
    assert set(Message.objects.filter(pk__in=mine).values_list("status", flat=True)
               ) == {"ready"}
    assert set(Message.objects.filter(pk__in=[*theirs, plain]).values_list(
        "status", flat=True)) == {"dead"}
    assert not Attempt.objects.filter(message_id__in=[*theirs, plain],
                                      outcome="requeued").exists()


@pytest.mark.parametrize("isolation", [{}, {"MYSQLQ_TEST_ISOLATION": "repeatable read"}],
                         ids=["read-committed", "repeatable-read"])
def test_broadcast_reaches_every_live_process_and_a_late_one_starts_at_the_latest(
        start_worker, isolation):
    """Also with the workers' site at REPEATABLE READ: a reader whose reads shared one
    snapshot would see no message published after its first read."""
    label = "topic-broadcast"
    env = {**ENV, **isolation}
    first, second = (start_worker("--queues", "default", env=env) for _ in range(2))
    started(first, second)
    publish(label, 5)

    def seen(pid: int) -> set[int]:
        return set(GateRun.objects.filter(label=f"{label}/broadcast", key=f"broadcast:{pid}")
                   .values_list("seq", flat=True))

    wait_for(lambda: seen(first.pid) == seen(second.pid) == set(range(5)), timeout=PATIENCE,
             message="both processes to get the five messages")
    late = start_worker("--queues", "default", env=env)
    started(late)
    publish(label, 3, first=5)
    wait_for(lambda: all(seen(w.pid) >= {5, 6, 7} for w in (first, second, late)),
             timeout=PATIENCE, message="every process to get the later messages")
    stop(first, second, late)
    assert seen(late.pid) == {5, 6, 7}
    assert seen(first.pid) == seen(second.pid) == set(range(8))
    # Each process handled each message once (nothing is retried or acked).
    assert GateRun.objects.filter(label=f"{label}/broadcast").count() == 8 + 8 + 3
    # Workers of --queues default serve no group: no deliveries were made.
    assert not TopicDelivery.objects.exists()


def test_a_broadcast_topic_whose_read_fails_holds_back_none_of_the_readers_others(
        start_worker):
    """A real server error at every poll of the reader's first topic: its row's last_offset
    set by hand to BIGINT's largest value, so sequencing its message fails (1264, out of
    range). Before, that error ended each poll before the second topic, whose messages
    never came. Now they come, the failure is logged once, and the first topic's message
    comes once its row is put back."""
    env = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.broadcast_handlers"}
    worker = start_worker("--queues", "default", env=env)
    started(worker)

    def heard(topic: str) -> set[int]:
        return set(GateRun.objects.filter(label=f"{topic}/broadcast", pid=worker.pid)
                   .values_list("seq", flat=True))

    TopicState.objects.filter(name="wedged").update(last_offset=2**63 - 1)
    broadcast_handlers.wedged.publish({"seq": 0})
    broadcast_handlers.flowing.publish_many([{"seq": seq} for seq in range(3)])
    wait_for(lambda: heard("flowing") == {0, 1, 2}, timeout=PATIENCE,
             message="the second topic's messages")
    broadcast_handlers.flowing.publish({"seq": 3})  # (polls go on failing the first)
    wait_for(lambda: heard("flowing") == {0, 1, 2, 3}, timeout=PATIENCE,
             message="the second topic's next message")
    assert heard("wedged") == set()
    # Said once in the log, and on the worker's row while it lasts (queuestats, the
    # dashboard and the admin show it).
    row = Worker.objects.filter(pid=worker.pid, stopped_at__isnull=True)
    wait_for(lambda: "the broadcast read of topic 'wedged' failing since " in
             row.get().troubles, timeout=PATIENCE, message="the worker's row to say it")
    assert "Out of range value for column 'msg_offset'" in row.get().troubles
    TopicState.objects.filter(name="wedged").update(last_offset=0)
    wait_for(lambda: heard("wedged") == {0}, timeout=PATIENCE,
             message="the first topic's message once its row is put back")
    wait_for(lambda: row.get().troubles == "", timeout=PATIENCE,
             message="the worker's row to say nothing fails any more")
    stop(worker)
    output = worker.output()
    assert output.count("Broadcast reader: reading topic 'wedged' failed") == 1, output
    assert "Out of range value for column 'msg_offset'" in output
    assert "Broadcast reader: topic 'wedged' reads again." in output


def test_a_burst_member_pumps_until_its_group_has_caught_up_then_exits(start_worker):
    """--burst: a member ends only once its group has every message of the topic (none
    sequenced when it starts, and more than one pump's worth), each handled once, in
    key order."""
    label = "topic-burst"
    broker.create_group(broker.GroupSpec(
        topic="ledger", group="billing", queue=group_queue("billing"),
        task_name=delivery_task_name("ledger", "billing"), on_dead="skip", max_attempts=40,
        retry_backoff=0.1, timeout=None, start="latest"))
    total = 1200  # more than TOPIC_PUMP_BATCH (500) and the window (1000)
    publish(label, total)
    # ... and one key: each pump's deliveries after the first wait behind it (blocked).
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq}
                                        for seq in range(total, total + 40)], keys=["one"] * 40)
    total += 40
    assert broker.position("ledger", "billing") == broker.last_offset("ledger") == 0
    summary, output = run_burst(start_worker, *WORKER, "--groups", "billing", env=ENV,
                                patience=PATIENCE)
    assert summary["succeeded"] == total, output
    assert ok_seqs(label, "billing") == Counter(range(total))
    assert broker.position("ledger", "billing") == broker.last_offset("ledger") == total
    assert not Message.objects.filter(queue=group_queue("billing")).exists()
    assert order_violations(label) == []  # key order held


def test_groups_option_makes_a_worker_a_member_of_those_groups_only(start_worker):
    """``runqueueworker --groups billing`` serves the queue ``group:billing`` (and creates
    that group at start), no other group; ``--queues default --groups audit`` serves both."""
    from tests.burst import run_burst

    label = "topic-groups-option"
    counts, output = run_burst(start_worker, "--groups", "billing", env=ENV)
    assert "started: queues=group:billing " in output, output
    assert set(TopicGroup.objects.filter(topic="ledger").values_list("group_name", flat=True)
               ) == {"billing"}
    publish(label, 6)
    counts, output = run_burst(start_worker, "--groups", "billing", env=ENV)
    assert counts["succeeded"] == 6, output
    assert ok_seqs(label, "billing") == Counter(range(6))
    assert not GateRun.objects.filter(label=label).exclude(key__startswith="billing:").exclude(
        label__endswith="/broadcast").exists()
    counts, output = run_burst(start_worker, "--queues", "default", "--groups", "audit",
                               env=ENV)
    assert "started: queues=default,group:audit " in output, output
    assert set(TopicGroup.objects.filter(topic="ledger").values_list("group_name", flat=True)
               ) == {"billing", "audit"}
    # '*' (every known queue) with --groups: all of them, each group once, no error.
    counts, output = run_burst(start_worker, "--queues", "*", "--groups", "billing,audit",
                               env=ENV)
    started = next(line for line in output.splitlines() if "started: queues=" in line)
    served = started.split("queues=")[1].split()[0].split(",")
    assert {"default", "group:billing", "group:audit", "group:broken"} <= set(served)
    assert len(served) == len(set(served)), started


def test_a_member_started_before_its_topic_had_a_message_picks_up_the_first_at_once(
        start_worker):
    """The topic has no row yet (publishers never make one): the member's start makes it,
    so its looks see the first message when it is published, not at the leader's next
    upkeep (a start that only sequenced without waiting left the row missing, and a
    publish then waited up to half a minute)."""
    assert not broker.topic_names()
    worker = start_worker(*WORKER, "--groups", "billing", env=ENV)
    started(worker)
    wait_for(lambda: TopicGroup.objects.filter(topic="ledger", group_name="billing").exists(),
             message="the member to make its group")
    assert broker.topic_names() == ["ledger"]  # made before the group, at the start
    publish("first", 1)
    wait_for(lambda: ok_seqs("first", "billing") == Counter({0: 1}), timeout=10,
             message="billing to handle the first message")
    stop(worker)
