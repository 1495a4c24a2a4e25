"""A repeat offender takes only itself down: no success is left unacked when it starts.

A message lost with its worker before runs alone (``worker/gate.py``). Its neighbours'
successes went to the batched acker, and the next suspect started before that ack
committed: when it was the offender again, its crash took the innocent's finished,
unacked attempt with it and recovery charged it as a lost attempt, run after run, until
the innocent went dead (``WorkerLost``). A suspect starts only once every earlier success
is acked, and a suspect's own success is acked before anything starts after it.

Real worker processes and a real ``os._exit``: under ``--processes 1`` (the supervisor
replaces the child) and as single processes restarted after each crash (as systemd
would). Timeouts are liveness bounds.
"""

from __future__ import annotations

import collections
import json
import subprocess

import pytest

from django_mysqlq.models import Attempt, Message
from django_mysqlq.worker.draining import EXIT_DEAD
from tests.testapp import crash_tasks as tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

WORKER_ARGS = ("--queues", "crash2", "--concurrency", "4", "--burst", "--json-summary")
#: The workers of these tests know the crash2 queue's tasks (no other worker does).
RIG = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.crash_tasks"}


def enqueue_the_batch() -> tuple[int, list[int]]:
    """The tester's batch: four innocents, the offender, five more innocents."""
    first = tasks.innocent.enqueue_many([(i,) for i in range(4)])
    crasher = tasks.crash3.enqueue().id
    later = tasks.innocent.enqueue_many([(i,) for i in range(4, 9)])
    return crasher, [handle.id for handle in [*first, *later]]


def summary_of(output: str) -> dict:
    line = next((line for line in reversed(output.splitlines()) if line.startswith("{")), "")
    assert line, output[-3000:]
    return json.loads(line)


def assert_only_the_offender_paid(crasher: int, innocents: list[int], output: str) -> None:
    # Every innocent succeeded; the offender alone is left, dead after its own attempts.
    rows = list(Message.objects.values_list("pk", "status"))
    assert rows == [(crasher, "dead")], (rows, output[-3000:])
    for message_id in innocents:
        history = list(Attempt.objects.for_message(message_id))
        assert history[-1].outcome == "succeeded", ([a.outcome for a in history],
                                                    output[-3000:])
        charged = [a for a in history[:-1] if "had not started" not in a.error_message]
        # Running beside the offender's first crash (before anyone knew it) may cost one
        # attempt, as after a kill -9; its repeat crashes, run alone, cost nothing.
        assert len(charged) <= 1, ([(a.outcome, a.error_message) for a in history],
                                   output[-3000:])
    killer_history = list(Attempt.objects.for_message(crasher))
    assert killer_history[-1].outcome == "failed"
    assert [a.attempt for a in killer_history if "had not started" not in a.error_message] \
        == [1, 2, 3]
    runs = collections.Counter(Ledger.objects.filter(label__startswith="inn:")
                               .values_list("label", flat=True))
    assert set(runs) == {f"inn:{i}" for i in range(9)}


def test_under_processes_a_repeat_offender_costs_its_neighbours_nothing(start_worker):
    crasher, innocents = enqueue_the_batch()
    worker = start_worker(*WORKER_ARGS, "--processes", "1", env=RIG)
    try:
        status = worker.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running: {worker.output()[-3000:]}")
    output = worker.output()
    assert_only_the_offender_paid(crasher, innocents, output)
    assert status == EXIT_DEAD, output[-3000:]
    assert summary_of(output)["dead"] == 1, output[-3000:]


def test_a_single_process_restarted_after_each_crash_costs_its_neighbours_nothing(
        start_worker):
    crasher, innocents = enqueue_the_batch()
    statuses, outputs = [], []
    for _ in range(10):  # three counted crashes, a first that may not count, the last run
        worker = start_worker(*WORKER_ARGS, env=RIG)
        try:
            statuses.append(worker.wait(timeout=60))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running: {worker.output()[-3000:]}")
        outputs.append(worker.output())
        if statuses[-1] != 1:  # os._exit(1) took it down: start the next, as systemd would
            break
    output = "\n".join(outputs)
    assert_only_the_offender_paid(crasher, innocents, output)
    # The run that recovered the offender's last crash buried it: its --burst says so.
    assert statuses[-1] == EXIT_DEAD, (statuses, outputs[-1][-3000:])
    assert summary_of(outputs[-1])["dead"] == 1, outputs[-1][-3000:]


def test_a_suspects_own_success_is_acked_before_anything_starts_after_it(start_worker):
    """The reverse: a message lost once succeeds alone; a task that crashes for the first
    time starts right after it. With a slow acker the suspect's success was still unacked
    then, went down with the crash, and recovery charged the suspect an attempt."""
    suspect = tasks.innocent.enqueue(0).id
    Message.objects.filter(pk=suspect).update(losses=1)  # as if lost with a worker once
    crasher = tasks.crash3.using(delay=1.5).enqueue().id
    worker = start_worker("--queues", "crash2", "--concurrency", "2", "--processes", "1",
                          "--burst", "--burst-wait", "5", "--json-summary",
                          env={**RIG, "MYSQLQ_TEST_ACK_DELAY": "5"})
    try:
        worker.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running: {worker.output()[-3000:]}")
    output = worker.output()
    assert list(Message.objects.values_list("pk", "status")) == [(crasher, "dead")], \
        output[-3000:]
    history = list(Attempt.objects.for_message(suspect))
    assert [(a.outcome, a.attempt) for a in history] == [("succeeded", 1)], \
        ([(a.outcome, a.error_message) for a in history], output[-3000:])
    assert Ledger.objects.filter(label="inn:0").count() == 1
