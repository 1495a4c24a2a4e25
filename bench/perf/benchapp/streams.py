"""Topic subscriptions of the ``streams`` workload (bench/perf/workloads/streams.py).

Loaded by its workers only (``MYSQLQ_BENCH_STREAMS=1`` adds this module to
``TASK_MODULES``), so the other workloads' workers are not members of these groups.
Groups ``g0`` … ``g3`` of topic ``bench`` do nothing (their rates are the stream's own);
group ``lat`` of topic ``benchlat`` stamps its start like ``tasks.stamp``.
"""

from __future__ import annotations

import os
import time

from django_mysqlq import Topic, TopicEvent

from .tasks import _stamp_fd

bench = Topic("bench")
benchlat = Topic("benchlat")
GROUPS = ("g0", "g1", "g2", "g3")


def _noop(event: TopicEvent) -> None:
    """Does nothing."""


for _group in GROUPS:
    bench.subscribe(group=_group, start="earliest", max_attempts=1)(_noop)


@benchlat.subscribe(group="lat", max_attempts=1)
def stamp(event: TopicEvent) -> None:
    started_ns = time.time_ns()
    os.write(_stamp_fd(), f"{event.payload['seq']} 0 {started_ns}\n".encode())
