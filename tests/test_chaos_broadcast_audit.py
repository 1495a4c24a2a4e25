"""The chaos run's broadcast audit (bench/chaos/broadcast.py) on made-up lifetimes: a
process owes what was sequenced after its start line and that it outlived by the grace
(stretched over a server outage); a miss, a message heard before the process even
started, and a message heard twice are caught."""

from __future__ import annotations

from bench.chaos import events as ev
from bench.chaos.broadcast import GRACE, Sequenced, audit
from bench.chaos.events import Event
from bench.chaos.lifetimes import Lifetime

SEQUENCED = {f"t{i}": Sequenced(i, 100.0 + 10 * i) for i in range(1, 6)}  # 110 … 150


def heard(pid: int, *offsets: int) -> dict[tuple[int, str], int]:
    return {(pid, f"t{offset}"): 1 for offset in offsets}


def test_a_process_alive_throughout_owes_everything_and_a_miss_is_caught():
    life = Lifetime(7, spawned=90.0, ready=95.0, ended=None)
    full = audit([life], SEQUENCED, heard(7, 1, 2, 3, 4, 5), [])["metrics"]
    assert (full["broadcast_owed"], full["broadcast_heard"], full["broadcast_missed"]) == (
        5, 5, 0)
    result = audit([life], SEQUENCED, heard(7, 1, 2, 4, 5), [])
    assert result["metrics"]["broadcast_missed"] == 1
    assert result["broadcast_missed"][0]["offset"] == 3


def test_late_start_and_early_end_are_excused_but_not_beyond_the_grace():
    # Spawned at 115, ready at 125: t2 (120) is excused at start, t1 (110) not its business.
    late = Lifetime(8, spawned=115.0, ready=125.0, ended=None)
    metrics = audit([late], SEQUENCED, heard(8, 3, 4, 5), [])["metrics"]
    assert (metrics["broadcast_owed"], metrics["broadcast_excused_start"]) == (3, 1)
    # Killed 1 s after t4 (140) was sequenced: t4 excused; t3 (130) owed, ten seconds before.
    killed = Lifetime(9, spawned=90.0, ready=95.0, ended=141.0)
    metrics = audit([killed], SEQUENCED, heard(9, 1, 2), [])["metrics"]
    assert (metrics["broadcast_excused_end"], metrics["broadcast_missed"]) == (1, 1)
    assert 141.0 - 140.0 < GRACE < 141.0 - 130.0


def test_an_outage_stretches_the_window():
    # The server was down 131-139: t3 (130) could not be read before 139 + GRACE.
    outage = Event(ev.RESTART, 131.0, until=139.0)
    killed = Lifetime(9, spawned=90.0, ready=95.0, ended=140.0)
    metrics = audit([killed], SEQUENCED, heard(9, 1, 2), [outage])["metrics"]
    assert (metrics["broadcast_excused_end"], metrics["broadcast_missed"]) == (1, 0)
    # A KILL CONNECTION excuses nothing: the reader keeps its position.
    kill = Event(ev.CONNECTION_KILL, 131.0, pid=9)
    metrics = audit([killed], SEQUENCED, heard(9, 1, 2), [kill])["metrics"]
    assert metrics["broadcast_missed"] == 1


def test_heard_before_start_and_heard_twice_are_caught():
    late = Lifetime(8, spawned=125.0, ready=127.0, ended=None)
    metrics = audit([late], SEQUENCED, {**heard(8, 1, 3, 4, 5), (8, "t5"): 2}, [])["metrics"]
    assert metrics["broadcast_before_start"] == 1  # t1, sequenced at 110
    assert metrics["broadcast_duplicates"] == 1
