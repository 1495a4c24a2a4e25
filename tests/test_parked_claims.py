"""An idle worker's parks and its claims, with real worker processes.

A worker whose park timed out went on to claim (one with rate-limited tasks did so after
every park) while its row still said parked: producers' wake-ups (``KILL QUERY``) went to
it rather than to a worker really asleep, and landed in its claim. A park now tells a
timeout (``slept``: nothing to claim) from a sleep cut to a due time (``due``: a delayed
message, a schedule's occurrence, a rate-limited key's next start), and a worker clears
its parked mark before any claim.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.test_locked_and_bad_rows import RowLock
from tests.testapp import rated_tasks, tasks
from tests.testapp.models import GateRun, Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _statements(watch: Path) -> list[str]:
    """One line per statement the worker ran: ``listening=<0|1>`` for a claim, else ``-``
    (tests/claim_watch.py)."""
    return watch.read_text().split() if watch.exists() else []


def _claims(watch: Path) -> list[str]:
    return [line for line in _statements(watch) if line.startswith("listening=")]


def test_a_worker_never_claims_while_its_row_says_parked(start_worker, tmp_path):
    watch = tmp_path / "claims"
    worker = start_worker("--concurrency", "2", env={"MYSQLQ_TEST_CLAIM_WATCH": str(watch)})
    wait_for(lambda: " started: " in worker.output(), message="the worker to start")
    time.sleep(3)  # idle: its parks time out, half a second each here (RECOVERY_SECONDS)
    # Woken by a producer; a rate-limited key's second message at the key's next start
    # (100/m: 0.6 s on), the park cut to that time; a delayed message when it is due.
    tasks.record.enqueue("woken")
    rated = [rated_tasks.per_minute.enqueue(seq, "parked").id for seq in range(2)]
    tasks.record.using(delay=1.0).enqueue("delayed")
    wait_for(lambda: not Message.objects.exists(), timeout=20,
             message="the three kinds of message to run")
    assert set(Ledger.objects.values_list("label", flat=True)) == {"woken", "delayed"}
    assert GateRun.objects.filter(label="parked", edge="start").count() == len(rated)
    time.sleep(2)
    claims = _claims(watch)
    assert claims and set(claims) == {"listening=0"}, claims


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rates(worker, watch: Path, seconds: float) -> tuple[float, float]:
    """Statements a second the worker ran, and its CPU seconds a second, over ``seconds``."""
    statements, cpu, began = len(_statements(watch)), _cpu_seconds(worker.pid), time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - began
    return ((len(_statements(watch)) - statements) / took,
            (_cpu_seconds(worker.pid) - cpu) / took)


def test_an_idle_worker_does_not_spin_on_a_ready_row_a_stranger_holds(start_worker,
                                                                      tmp_path):
    """A committed ready message whose row another transaction holds (``SELECT … FOR
    UPDATE`` left open): every park saw it ready and ended at once, every claim stepped
    around it and took nothing, and round again, with no pause: about a thousand
    statements a second and a quarter of a core, for as long as the lock lasted. The
    parks now pass over it, for a poll interval at a time; a new message still runs at
    once, and the held one once its lock goes."""
    held = tasks.record.enqueue("held").id
    watch = tmp_path / "statements"
    with RowLock([held]):
        worker = start_worker("--concurrency", "2",
                              env={"MYSQLQ_TEST_CLAIM_WATCH": str(watch)})
        wait_for(lambda: " started: " in worker.output(), message="the worker to start")
        time.sleep(2)  # (it met the locked row at once: its claims step around it)
        held_rate, held_cpu = _rates(worker, watch, 3)
        started = time.monotonic()
        tasks.record.enqueue("free")
        wait_for(lambda: Ledger.objects.filter(label="free").exists(), timeout=10,
                 message="a new message to run while the row is held")
        assert time.monotonic() - started < 1.0
        assert Message.objects.get(pk=held).status == "ready"
    wait_for(lambda: Ledger.objects.filter(label="held").exists(), timeout=10,
             message="the held message to run once its lock is gone")
    time.sleep(2)
    idle_rate, idle_cpu = _rates(worker, watch, 3)
    # Measured: some 40 statements a second while the row is held (a claim every poll
    # interval, 0.2 s here), 9 idle (parks of half a second at most: RECOVERY_SECONDS);
    # it was over a thousand, and a third of a core.
    assert held_rate < max(100.0, 4 * idle_rate), (held_rate, idle_rate)
    assert held_cpu < 0.1, (held_cpu, idle_cpu)
