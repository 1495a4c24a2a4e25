"""The chaos schedule, and the actions: kill -9, SIGTERM, KILL CONNECTION, a task that
kills its worker, a ready row locked by a stranger, restart.

The plan is drawn up front from the seed: actions at random intervals in the middle of
the run, the first three one of each kind (so even a short run sees them all), and one
server restart somewhere between 35 % and 60 % of the run; on a Galera cluster
(``--galera``), a kill -9 of one of the workers' nodes instead, started again after
``node_down_seconds`` (on a thread: it rejoins while the chaos goes on). Actions run one
at a time on the harness's main thread; a replacement worker is started right after
every kill and every SIGTERM, so the pool keeps its size.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time

from django.db import DatabaseError

from . import admin, galera, procnet, server
from . import events as ev
from .config import ChaosConfig
from .events import EventLog
from .producers import enqueue_crash
from .workers import Worker, WorkerPool

logger = logging.getLogger("bench.chaos")

ACTIONS = (ev.KILL, ev.SIGTERM, ev.CONNECTION_KILL, ev.CRASHING_TASK, ev.LOCKED_ROW)
WEIGHTS = (0.35, 0.15, 0.25, 0.1, 0.15)
#: A restart waits until every worker has been up this long (past its start-up checks).
SETTLED_SECONDS = 3.0


@dataclasses.dataclass(frozen=True)
class Planned:
    offset: float  # seconds after the start of the run
    action: str


def plan(config: ChaosConfig, rng: random.Random) -> list[Planned]:
    first, last = config.warmup, config.seconds - config.cooldown
    planned: list[Planned] = []
    kinds = list(ACTIONS)
    rng.shuffle(kinds)
    at = first
    while True:
        at += min(rng.expovariate(1 / config.mean_interval), 2 * config.mean_interval) + 0.5
        if at > last:
            break
        action = kinds.pop(0) if kinds else rng.choices(ACTIONS, WEIGHTS)[0]
        planned.append(Planned(at, action))
    if (config.restart or config.galera) and last > first:
        outage = ev.NODE_KILL if config.galera else ev.RESTART
        planned.append(Planned(rng.uniform(0.35, 0.6) * config.seconds, outage))
    return sorted(planned, key=lambda item: item.offset)


class Monkey:
    def __init__(self, config: ChaosConfig, pool: WorkerPool, events: EventLog,
                 rng: random.Random) -> None:
        self.pool = pool
        self.events = events
        self.rng = rng
        self.pending = plan(config, rng)
        self.done: list[str] = []
        self.locked_row_seconds = config.locked_row_seconds
        self.node_down_seconds = config.node_down_seconds
        self.restarting: threading.Thread | None = None
        self.harness_errors: list[str] = []

    def step(self, elapsed: float) -> None:
        """Carry out the next planned action if it is due."""
        if not self.pending or self.pending[0].offset > elapsed:
            return
        action = self.pending[0].action
        if action in ev.OUTAGES and self.pool.youngest_age() < SETTLED_SECONDS:
            return  # a worker is still starting: its system checks need the server
        self.pending.pop(0)
        if action == ev.RESTART:
            self._restart()
        elif action == ev.NODE_KILL:
            self._kill_a_node()
        elif action == ev.CONNECTION_KILL:
            self._kill_connections()
        elif action == ev.CRASHING_TASK:
            self._crashing_task()
        elif action == ev.LOCKED_ROW:
            self._lock_a_ready_row()
        else:
            target = self._target()
            if action == ev.KILL:
                self.pool.kill(target, detail=f"worker {target.index}")
            else:
                self.pool.terminate(target)
            self.pool.start()
        self.done.append(action)

    def _target(self) -> Worker:
        """A random running worker, preferring the ones that hold claims."""
        running = self.pool.running()
        try:
            claims = admin.claims_by_worker()
        except admin.HarnessError:
            claims = {}
        busy = [w for w in running
                if any(f":{w.pid}:" in worker_id for worker_id in claims)]
        return self.rng.choice(busy or running)

    def _kill_connections(self) -> None:
        """KILL CONNECTION every connection of one worker (control, tasks, acker, ledger)."""
        candidates = self.pool.running()
        self.rng.shuffle(candidates)
        for worker in candidates:
            if worker.port in self.pool.down:
                continue  # its node is down: nothing to kill there
            try:  # the worker's node's process list (per node on a cluster)
                by_port = admin.connections_by_port(worker.port)
            except admin.HarnessError:
                continue
            ids = sorted(by_port[port] for port in procnet.client_ports(worker.pid)
                         if port in by_port)
            if not ids:
                continue
            at = time.time()
            killed = admin.kill_connections(ids, worker.port)
            self.events.add(ev.CONNECTION_KILL, worker.pid, at=at,
                            detail=f"worker {worker.index}: killed connections "
                                   f"{', '.join(map(str, killed))}")
            return
        logger.warning("No worker connection found to kill; skipping this action.")

    def _crashing_task(self) -> None:
        """Enqueue a message whose task kills the worker that runs it (``os._exit``)."""
        try:
            message_id = enqueue_crash()
        except DatabaseError as exc:
            logger.warning("Could not enqueue a crashing task (%s); skipping this action.", exc)
            return
        self.events.add(ev.CRASHING_TASK, None, detail=f"message #{message_id}")

    def _lock_a_ready_row(self) -> None:
        """Hold the head ready row ``FOR UPDATE`` on a harness connection for a while."""
        held = admin.lock_head_row(self.locked_row_seconds)
        if held is None:
            logger.warning("No ready row to lock; skipping this action.")
            return
        message_id, at, until = held
        self.events.add(ev.LOCKED_ROW, None, at=at, until=until,
                        detail=f"message #{message_id} locked for {until - at:.1f}s")

    def _kill_a_node(self) -> None:
        """kill -9 of the node most workers use; it starts again on a thread after
        ``node_down_seconds`` (rejoining takes a while: the chaos goes on meanwhile)."""
        running = [worker.port for worker in self.pool.running() if worker.port]
        if not running:
            logger.warning("No worker on a cluster node; skipping the node kill.")
            return
        port = max(set(running), key=running.count)
        self.pool.down.add(port)
        at = galera.kill_node(port)
        node = galera.node_of(port)
        event = self.events.add(ev.NODE_KILL, None, at=at, port=port,
                                detail=f"node {node} (port {port}) killed -9")
        logger.info("Killed Galera node %d (port %d); it starts again in %.0fs.", node, port,
                    self.node_down_seconds)

        def restart() -> None:
            time.sleep(self.node_down_seconds)
            try:
                synced = galera.start_node(port)
            except admin.HarnessError as exc:
                self.harness_errors.append(str(exc))
                return
            self.pool.down.discard(port)
            self.events.finish(event, synced, f"node {node} (port {port}) killed -9, Synced "
                                              f"again after {synced - at:.1f}s")
            logger.info("Galera node %d is Synced again, %.1fs after its kill.", node,
                        synced - at)

        self.restarting = threading.Thread(target=restart, name="chaos-node-restart",
                                           daemon=True)
        self.restarting.start()

    def wait_for_nodes(self, timeout: float = 300.0) -> None:
        """Until a killed node is back (the drain and the stop need it)."""
        if self.restarting is not None:
            self.restarting.join(timeout)
        if self.harness_errors:
            raise admin.HarnessError(self.harness_errors[0])

    def _restart(self) -> None:
        logger.info("Restarting MariaDB...")
        down_at, up_at = server.restart_server()
        self.events.add(ev.RESTART, None, at=down_at, until=up_at,
                        detail=f"server down for {up_at - down_at:.1f}s")
        logger.info("MariaDB answers again after %.1fs.", up_at - down_at)
