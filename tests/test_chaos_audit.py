"""The chaos run's order and limit audit (bench/chaos/ordering.py) on made-up ledgers: it
must catch a subject run out of order and a key run past its limit, and let pass what
at-least-once allows (a message run again after a kill -9, before anything after it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.chaos import events as ev
from bench.chaos.config import GATE_LIMIT
from bench.chaos.ordering import audit


def run(start: float, end: float | None, pid: int = 1) -> Any:
    return SimpleNamespace(start=start, end=end, pid=pid)


def message(message_id: int, kind: str, key: str, *runs: Any) -> Any:
    return SimpleNamespace(id=message_id, kind=kind, gate_key=key, runs=list(runs))


def test_a_subject_run_in_order_passes_even_with_a_rerun_after_a_kill():
    kill = ev.Event(ev.KILL, 2.5, pid=7)
    chain = [message(1, "ordered", "s", run(1, 2), run(2.2, None, pid=7), run(3, 4)),
             message(2, "ordered", "s", run(5, 6))]
    assert audit(chain, [kill])["metrics"]["order_violations"] == 0


def test_a_later_message_started_before_the_earlier_one_ended_is_caught():
    chain = [message(1, "ordered", "s", run(1, 3)), message(2, "ordered", "s", run(2, 4))]
    assert audit(chain, [])["metrics"]["order_violations"] == 1
    # ... and one that ran while a killed run of the earlier one was still going:
    kill = ev.Event(ev.KILL, 5.0, pid=7)
    chain = [message(1, "ordered", "s", run(1, None, pid=7)), message(2, "ordered", "s",
                                                                     run(3, 4))]
    assert audit(chain, [kill])["metrics"]["order_violations"] == 1


def test_a_key_past_its_limit_is_caught():
    keyed = [message(n, "limited", "k", run(1, 5)) for n in range(GATE_LIMIT)]
    assert audit(keyed, [])["metrics"]["limit_violations"] == 0
    keyed.append(message(99, "limited", "k", run(4, 6)))
    result = audit(keyed, [])
    assert result["metrics"]["limit_violations"] == 1
    assert result["metrics"]["limit_peak"] == GATE_LIMIT + 1
