"""The operator commands refuse option values that make no sense with a one-line error
that says what is accepted, instead of taking them for "nothing to do" or a traceback."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def on_command_line(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "django", *args], env=env,
                          capture_output=True, text=True, timeout=60)


# --------------------------------------------------------------------------- queuehistory


@pytest.mark.parametrize(("option", "value", "high"), [
    ("--rows-per-partition", "0", "9223372036854775807"),
    ("--rows-per-partition", "-5", "9223372036854775807"),
    ("--rows-per-partition", "1.5", "9223372036854775807"),
    ("--ahead", "0", "8192"),
    ("--ahead", "-3", "8192"),
])
def test_queuehistory_partition_refuses_counts_below_1(option, value, high):
    """Not "Nothing to do": the broker refuses them, and so does the command, up front."""
    args = ["--rows-per-partition", "100"] if option == "--ahead" else []
    with pytest.raises(CommandError, match=f"argument {option}: expected a whole number "
                                           f"from 1 to {high}, not '{value}'"):
        run("queuehistory", "partition", *args, f"{option}={value}")


def test_queuehistory_partition_refuses_ahead_0_on_the_command_line(worker_env):
    done = on_command_line(worker_env, "queuehistory", "partition", "--ahead", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argument --ahead: expected a whole number from 1 to 8192, not '0'" in done.stderr


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(("command", "option", "what"), [
    (["queuerequeue"], "--since", "a duration ago"),
    (["queuecancel", "--status", "dead"], "--since", "a duration ago"),
    (["queuepurge"], "--older-than", "a duration"),
    (["queuepurge"], "--dead-older-than", "a duration"),
    (["queuepurge"], "--workers-older-than", "a duration"),
    (["queuepipeline", "report", "--output", "/nonexistent"], "--since", "a duration ago"),
    (["queuepipeline", "replay"], "--until", "a duration ago"),
    (["queuepipeline", "archive", "--to", "/nonexistent"], "--older-than", "a duration"),
    (["queuepipeline", "enqueue", "--task", "t", "--input", "x"], "--delay", "a duration"),
    (["queuetopic", "lookup", "--topic", "t"], "--since", "a duration ago"),
])
def test_a_duration_written_with_a_dash_says_to_write_it_without(command, option, what):
    """Not argparse's bare "expected one argument": what to write instead."""
    with pytest.raises(CommandError, match=f"argument {option}: {what} is written without "
                                           f"a dash: {option} 2h, not {option} -2h$"):
        run(*command, option, "-2h")
    with pytest.raises(CommandError, match=f"expected {what} without a dash: write 2h, "
                                           "not -2h"):
        run(*command, f"{option}=-2h")
    with pytest.raises(CommandError, match=f"argument {option}: expected one argument"):
        run(*command, option, "--dry-run")  # not a duration: argparse's word stands


def test_a_dashed_duration_is_one_line_on_the_command_line(worker_env):
    for args, line in [
            (["queuerequeue", "--since", "-2h"], "argument --since: a duration ago is "
             "written without a dash: --since 2h, not --since -2h"),
            (["queuepurge", "--older-than", "-30d"], "argument --older-than: a duration is "
             "written without a dash: --older-than 30d, not --older-than -30d")]:
        done = on_command_line(worker_env, *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        [error] = [said for said in done.stderr.splitlines() if "error:" in said]
        assert error.endswith(f"error: {line}"), error


# --------------------------------------------------------------------------- queuestats --watch


@pytest.mark.parametrize("seconds", ["inf", "-inf", "nan", "1e400", "-5", "0", "0.1", "abc"])
def test_queuestats_watch_takes_only_a_finite_interval_of_half_a_second_or_more(
        seconds, monkeypatch):
    """inf crashed in time.sleep after the first print; nan and -5 redrew every 0.2 s; 0
    printed once: each is refused before anything is printed."""
    from django_mysqlq.management.commands import queuestats

    real_sleep, main = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:  # patched for every thread: see the --watch test
        if threading.current_thread() is not main:
            real_sleep(seconds)
            return
        raise AssertionError(f"slept {seconds}: the interval was taken")

    monkeypatch.setattr(queuestats.time, "sleep", sleep)
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"argument --watch: expected a number of seconds "
                                           r"from 0\.5 to 3155760000 \(100 years\), e\.g\. "
                                           f"--watch 5, not '{seconds}'"):
        call_command("queuestats", f"--watch={seconds}", stdout=out)
    assert out.getvalue() == ""


def test_queuestats_watch_inf_is_one_line_on_the_command_line(worker_env):
    done = on_command_line(worker_env, "queuestats", "--watch", "inf")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
    assert "error: argument --watch: expected a number of seconds from 0.5" in done.stderr


# --------------------------------------------------------------------------- runqueueworker


@pytest.mark.parametrize(("args", "said"), [
    (["--exit-zero"], "--exit-zero needs --burst"),
    (["--burst-wait", "3"], "--burst-wait needs --burst"),
    (["--burst-wait", "0"], "--burst-wait needs --burst"),  # 0.0 == False: it slipped past
    (["--burst-wait", "5", "--exit-zero"], "--exit-zero and --burst-wait need --burst"),
    (["--exit-zero", "--processes", "2"], "--exit-zero needs --burst"),
])
def test_runqueueworker_refuses_burst_options_without_burst(args, said, monkeypatch):
    """They were taken and ignored: the worker ran until stopped instead of draining."""
    from django_mysqlq.management.commands import runqueueworker

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was started")

    monkeypatch.setattr(runqueueworker, "Workers", never)
    monkeypatch.setattr(runqueueworker, "Supervisor", never)
    with pytest.raises(CommandError, match=f"^{said} \\(drain the queues, then exit\\); "
                                           "without it the worker runs until stopped"):
        run("runqueueworker", *args)


def test_runqueueworker_takes_burst_options_with_burst():
    out, _ = run("runqueueworker", "--burst", "--exit-zero", "--burst-wait", "0",
                 "--queues", "nothing-here", "--json-summary", "-v", "0")
    assert json.loads(out)["processed"] == 0


def test_a_worker_run_on_the_callers_thread_leaves_it_as_it_found_it():
    """Its stop bounded this thread's statements (a lock wait then ended at the stop's
    deadline: a later test's claim failed with max_statement_time exceeded) and bound
    the thread to the worker's database."""
    import threading

    from django.db import connection

    import tests.testapp.broadcast_handlers  # noqa: F401 (a broadcast reader to start)
    from django_mysqlq.broker.base import past_deadline
    from django_mysqlq.routing import bound_alias

    run("runqueueworker", "--burst", "--queues", "nothing-here", "-v", "0")
    # Its broadcast reader ended with it (a --burst run's end set no stop event: the
    # reader read on in this process, and a later test's publish ran its handler).
    assert not [t for t in threading.enumerate() if t.name == "mysqlq-broadcast"]
    assert bound_alias() is None
    assert not past_deadline()
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.max_statement_time")
        assert float(cursor.fetchone()[0]) == 0.0
