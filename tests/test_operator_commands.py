"""The operator commands: queuestats, queuerequeue, queuecancel, queuepurge, queuepause."""

from __future__ import annotations

import io
import json
import os
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_mysqlq import broker, ops
from django_mysqlq.models import Attempt, Message
from tests.operator_support import make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def statuses() -> dict[int, str]:
    return dict(Message.objects.values_list("pk", "status"))


def test_queuestats_table_and_json():
    make_dead()
    tasks.record.enqueue("r")
    tasks.on_other_queue.enqueue("o")
    broker.set_paused("other", True, ops.cli_operator())
    table, _ = run("queuestats")
    lines = table.splitlines()
    assert lines[0].split() == ["queue", "ready", "scheduled", "claimed", "blocked",
                                "throttled", "dead", "oldest", "1m", "5m", "60m", "fail%"]
    default = next(line for line in lines if line.startswith("default"))
    assert default.startswith("default (no worker) ")  # a ready message and no worker
    assert default.split()[2:9] == ["worker)", "1", "0", "0", "0", "0", "1"]
    assert default.split()[-1] == "100"  # one attempt in the last hour, and it failed
    assert any(line.startswith("other (paused)") for line in lines)
    assert "workers alive: 0" in table
    data = json.loads(run("queuestats", "--json")[0])
    by_name = {q["name"]: q for q in data["queues"]}
    assert by_name["default"]["dead"] == 1 and by_name["other"]["paused"] is True
    assert by_name["default"]["throughput"] == {"1m": 1, "5m": 1, "60m": 1}
    assert data["top_failing"] == [{"task": "tests.testapp.tasks.always_fails", "failures": 1}]


def test_queuestats_refuses_an_unknown_database_naming_the_queue_ones():
    """Not a ConnectionDoesNotExist traceback: what to give instead."""
    with pytest.raises(CommandError, match=r"--database 'nosuch' holds no queue \(queue "
                                           r"databases: default\)"):
        call_command("queuestats", "--database", "nosuch", stdout=io.StringIO())


def test_queuerequeue_defaults_to_dead_and_honours_filters():
    dead_a = make_dead(label="a")
    dead_b = make_dead(task=tasks.record, label="b")
    later = tasks.record.using(delay=3600).enqueue("later")
    out, _ = run("queuerequeue", "--task", "tests.testapp.tasks.always_fails", "--dry-run")
    assert out.strip() == "1 message(s) would be requeued."
    assert statuses()[dead_a] == "dead"
    out, err = run("queuerequeue", "--task", "tests.testapp.tasks.always_fails",
                   "--reset-attempts")
    assert out.strip() == "Requeued 1 message(s)." and "requeued 1/1" in err
    assert statuses() == {dead_a: "ready", dead_b: "dead", later.id: "scheduled"}
    assert Message.objects.get(pk=dead_a).attempts == 0
    assert Attempt.objects.get(message_id=dead_a, outcome="requeued").actor.startswith("cli:")
    run("queuerequeue", "--status", "scheduled")
    assert statuses()[later.id] == "ready"


def test_queuerequeue_since_and_queue_filters():
    old = make_dead(label="old")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET enqueued_at = enqueued_at - INTERVAL 3 DAY "
                       "WHERE id = %s", [old])
    new = make_dead(label="new")
    run("queuerequeue", "--since", "1d", "--queue", "default")
    assert statuses() == {old: "dead", new: "ready"}
    run("queuerequeue", "--queue", "other")
    assert statuses()[old] == "dead"


def test_queuerequeue_refuses_claimed_as_a_status():
    with pytest.raises(CommandError, match="only ready, scheduled, dead"):
        run("queuerequeue", "--status", "claimed")


def test_queuecancel_needs_a_status_and_walks_batches(monkeypatch):
    monkeypatch.setattr(ops, "BATCH", 4)
    tasks.record.enqueue_many([[f"m{i}"] for i in range(10)])
    dead = make_dead(task=tasks.on_other_queue)
    with pytest.raises(CommandError, match=r"--status \(ready, scheduled, dead, blocked, "
                       r"throttled; comma-separated\)"):  # every status it takes
        run("queuecancel", "--queue", "default")
    out, _ = run("queuecancel", "--status", "ready", "--dry-run")
    assert out.strip() == "10 message(s) would be cancelled."
    out, err = run("queuecancel", "--status", "ready,dead", "--queue", "default")
    assert out.strip() == "Cancelled 10 message(s)."
    assert err.splitlines() == ["cancelled 4/10", "cancelled 8/10", "cancelled 10/10"]
    assert statuses() == {dead: "dead"}
    assert Attempt.objects.filter(outcome="cancelled").count() == 10


def test_queuepurge_deletes_old_history_in_batches():
    for label in "abcde":
        make_dead(label=label)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_attempt SET finished_at = finished_at - INTERVAL 40 DAY "
                       "WHERE error_message <> 'boom e'")
    out, _ = run("queuepurge", "--older-than", "30d", "--dry-run")
    assert out.startswith("4 history row(s) finished before")
    assert Attempt.objects.count() == 5
    out, err = run("queuepurge", "--older-than", "30d", "--batch-size", "3")
    assert out.strip() == "Deleted 4 history row(s)."
    assert err.splitlines() == ["deleted 3/4", "deleted 4/4"]
    assert list(Attempt.objects.values_list("error_message", flat=True)) == ["boom e"]
    with pytest.raises(CommandError, match="duration like"):
        run("queuepurge", "--older-than", "soon")


def test_queuepause_and_resume():
    out, _ = run("queuepause", "emails", "reports")
    assert "Paused now: emails, reports." in out
    assert broker.paused_queues() == {"emails", "reports"}
    out, _ = run("queuepause", "--resume", "emails")
    assert "Paused now: reports." in out


def test_queuestats_watch_repeats_until_interrupted(monkeypatch):
    from django_mysqlq.management.commands import queuestats

    sleeps: list[float] = []
    real_sleep, main = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:
        # time.sleep is patched for every thread: one left running by an earlier test
        # (sleeping between its polls) must neither count nor take the interrupt, or the
        # command never sees the third sleep and prints forever (a CI run hung there).
        if threading.current_thread() is not main:
            real_sleep(seconds)
            return
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(queuestats.time, "sleep", sleep)
    out, _ = run("queuestats", "--watch", "0.5")
    assert out.count("workers alive:") == 3 and sleeps == [0.5, 0.5, 0.5]


# --------------------------------------------------------------------------- absurd input


@pytest.mark.parametrize("duration", [
    "99999999999w", "5300w", "9" * 400 + "s", "1" + "0" * 20 + "d", "36525.1d"])
def test_queuepurge_refuses_absurd_durations_with_what_it_accepts(duration):
    for dry_run in ([], ["--dry-run"]):
        with pytest.raises(CommandError, match=r"at most 100 years \(5217w\)"):
            run("queuepurge", "--older-than", duration, *dry_run)


@pytest.mark.parametrize("since", [
    "99999999999w", "0001-01-01T00:00+05:00", "9999-12-31T23:00-05:00"])
def test_since_out_of_range_is_refused_with_what_it_accepts(since):
    with pytest.raises(CommandError, match="--since"):
        run("queuecancel", "--status", "dead", "--since", since, "--dry-run")


def test_a_hundred_years_is_accepted():
    make_dead()
    out, _ = run("queuepurge", "--older-than", "5217w", "--dry-run")
    assert out.startswith("0 history row(s) finished before")


def test_an_absurd_duration_is_one_line_on_the_command_line_not_a_traceback(worker_env):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "django", "queuepurge", "--older-than", "99999999999w"],
        env=worker_env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    [error] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "at most 100 years" in error


@pytest.mark.parametrize("queue", [
    "a,b", " padded", "padded ", "\tq", "", "x" * 65, "caf\udce9"])
def test_queuepause_refuses_names_that_can_never_be_queues(queue):
    for extra in ([], ["--resume"]):
        with pytest.raises(CommandError, match="can never be a queue") as caught:
            run("queuepause", "ok", queue, *extra)
        assert "without commas or surrounding whitespace" in str(caught.value)
    assert broker.paused_queues() == set()


def test_queuerequeue_refuses_blocked_with_what_to_do_instead():
    """A blocked message can't be requeued (it would jump its subject's order): the
    command said "0 would be requeued"-style results for a filter it then ignored."""
    from tests.testapp import gated

    first = gated.ordered_step.enqueue("k", 1, "blocked-cli")
    second = gated.ordered_step.enqueue("k", 2, "blocked-cli")
    assert Message.objects.get(pk=second.id).status == "blocked"
    with pytest.raises(CommandError, match="queuesubject requeue-head"):
        run("queuerequeue", "--status", "blocked", "--dry-run")
    with pytest.raises(CommandError, match="a requeue would make it jump"):
        run("queuerequeue", "--status", "dead,blocked")
    assert statuses() == {first.id: "ready", second.id: "blocked"}
    out, _ = run("queuecancel", "--status", "blocked", "--dry-run")
    assert out.strip() == "1 message(s) would be cancelled."


def test_a_command_run_without_a_terminal_or_user_variables_names_the_account(
        monkeypatch) -> None:
    """Cron, ``docker exec`` and systemd: no terminal (``os.getlogin()`` fails) and often no
    ``USER``. The operator was ``cli:unknown``; it is the account the process runs as."""
    import pwd

    def no_terminal() -> str:
        raise OSError(6, "No such device or address")

    monkeypatch.setattr(ops.os, "getlogin", no_terminal)
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    assert ops.cli_operator().name == f"cli:{pwd.getpwuid(os.getuid()).pw_name}"
