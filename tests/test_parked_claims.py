"""An idle worker's parks and its claims, with real worker processes.

A worker whose park timed out went on to claim (one with rate-limited tasks did so after
every park) while its row still said parked: producers' wake-ups (``KILL QUERY``) went to
it rather than to a worker really asleep, and landed in its claim. A park now tells a
timeout (``slept``: nothing to claim) from a sleep cut to a due time (``due``: a delayed
message, a schedule's occurrence, a rate-limited key's next start), and a worker clears
its parked mark before any claim.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.testapp import rated_tasks, tasks
from tests.testapp.models import GateRun, Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _claims(watch: Path) -> list[str]:
    return watch.read_text().split() if watch.exists() else []


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
