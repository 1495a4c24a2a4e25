"""The chaos run's order and limit audit (bench/chaos/ordering.py) on made-up ledgers: it
must catch a subject run out of order and a key run past its limit, and let pass what
at-least-once allows (a message run again after a kill -9, before anything after it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.chaos import events as ev
from bench.chaos.config import GATE_LIMIT, RATE_LIMIT, RATE_SLACK, RATE_WINDOW_SECONDS
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


def test_a_rate_key_past_its_limit_in_a_window_is_caught():
    """Starts spaced by the limit pass; the slack's worth more in one window fails, and a
    run cut short by a kill -9 counts like any other start (its claim took a slot)."""
    spacing = RATE_WINDOW_SECONDS / RATE_LIMIT * 1.001  # (exact multiples round either way)
    keyed = [message(n, "rated", "r0", run(n * spacing, n * spacing + 0.1))
             for n in range(3 * RATE_LIMIT)]
    assert audit(keyed, [])["metrics"]["rate_violations"] == 0
    assert audit(keyed, [])["metrics"]["rate_peak"] == RATE_LIMIT
    crowd = [message(100 + n, "rated", "r1", run(10 + n * 0.01, None, pid=7))
             for n in range(RATE_LIMIT + RATE_SLACK + 1)]
    result = audit(keyed + crowd, [ev.Event(ev.KILL, 11, pid=7)])
    assert result["metrics"]["rate_violations"] == 1
    assert result["rate_peaks"] == {"r0": RATE_LIMIT, "r1": RATE_LIMIT + RATE_SLACK + 1}


def test_an_unclean_stop_is_excused_only_when_its_node_was_down_during_the_stop():
    sigterm = ev.Event(ev.SIGTERM, 10.0, pid=7)
    stop = ev.Event(ev.STOP_STATUS, 20.0, pid=7, port=4307)
    # Its node killed before the SIGTERM and back after it: excused.
    down = ev.Event(ev.NODE_KILL, 5.0, until=15.0, port=4307)
    assert ev.node_down_while_stopping(stop, [sigterm, down, stop])
    # Killed during the stop, not back yet: excused.
    assert ev.node_down_while_stopping(stop, [sigterm, ev.Event(ev.NODE_KILL, 12.0, port=4307),
                                            stop])
    # Another node, a node back before the SIGTERM, or killed after the stop: not.
    assert not ev.node_down_while_stopping(
        stop, [sigterm, ev.Event(ev.NODE_KILL, 5.0, until=15.0, port=4306), stop])
    assert not ev.node_down_while_stopping(
        stop, [sigterm, ev.Event(ev.NODE_KILL, 2.0, until=8.0, port=4307), stop])
    assert not ev.node_down_while_stopping(
        stop, [sigterm, ev.Event(ev.NODE_KILL, 25.0, port=4307), stop])
    assert not ev.node_down_while_stopping(ev.Event(ev.STOP_STATUS, 20.0, pid=7),
                                         [sigterm, down])


def test_kill_orphans_whose_wait_overlapped_a_node_kill_are_counted_apart():
    """A kill -9's orphans wait for the recovery sweep; a Galera node killed meanwhile may
    have been the sweeper's, and a new sweeper takes over only after its lease: those
    orphans are counted apart, not in the kill -9 recovery figures."""
    from bench.chaos.recovery import recovery

    def lost(pid: int, started: float, finished: float) -> Any:
        return SimpleNamespace(attempt=1, outcome="lost", pid=pid, started=started,
                               finished=finished, error_class="WorkerLost")

    def again(started: float) -> Any:
        return SimpleNamespace(attempt=2, outcome="succeeded", pid=9, started=started,
                               finished=started + 0.1, error_class="")

    facts: Any = SimpleNamespace(messages={
        1: SimpleNamespace(id=1, runs=[], tries=[lost(7, 9.0, 14.0), again(14.2)]),
        2: SimpleNamespace(id=2, runs=[], tries=[lost(8, 29.0, 34.0), again(34.5)]),
    })
    kills = [ev.Event(ev.KILL, 10.0, pid=7), ev.Event(ev.KILL, 30.0, pid=8)]
    # No node kill: both orphans count (sweeps 4 s after their kills).
    clean = recovery(facts, kills).as_dict()
    assert (clean["orphans"], clean["node_down"], clean["sweep_seconds"]["median"]) == (2, 0, 4.0)
    # A node down from 12 to 20 s overlaps the first orphan's wait (10 → 14) only.
    node = ev.Event(ev.NODE_KILL, 12.0, until=20.0, port=4307)
    apart = recovery(facts, [*kills, node]).as_dict()
    assert (apart["orphans"], apart["node_down"]) == (1, 1)
    assert apart["reclaim_seconds"]["median"] == 4.5
    # Overlap cases: down before and back during; killed during and never back; not.
    assert ev.node_down_during([ev.Event(ev.NODE_KILL, 5.0, until=11.0)], 10.0, 14.0)
    assert ev.node_down_during([ev.Event(ev.NODE_KILL, 13.0)], 10.0, 14.0)
    assert not ev.node_down_during([ev.Event(ev.NODE_KILL, 2.0, until=9.0)], 10.0, 14.0)
    assert not ev.node_down_during([ev.Event(ev.NODE_KILL, 15.0, until=19.0)], 10.0, 14.0)


def test_a_worker_sigtermed_before_it_started_is_not_an_unclean_stop(tmp_path):
    """A replacement worker SIGTERMed during its start has no handlers yet: the default
    action ends it (-15) before it registered or claimed anything (a CI chaos run counted
    one as unclean). One that had logged its start and exits non-zero still counts."""
    import signal
    import subprocess
    import sys
    import time

    from bench.chaos.workers import Worker, WorkerPool

    events = ev.EventLog()
    pool = WorkerPool(tmp_path, events, [])
    for index, log_text in enumerate(("", "Worker w started: queues=default\n")):
        log_path = tmp_path / f"worker-{index}.log"
        log_path.write_text(log_text)
        popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        worker = Worker(index, popen, log_path, time.time())
        pool.workers.append(worker)
        pool.terminate(worker)
        popen.wait(10)
    pool.reap()
    kinds = [e.kind for e in events.all() if e.kind != ev.SIGTERM]
    assert kinds == [ev.STOPPED_STARTING, ev.STOP_STATUS]
    assert all(worker.popen.returncode == -signal.SIGTERM for worker in pool.workers)
