"""One chaos run from start to verdict: set up, load, inflict, drain, stop, analyze."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connections

from django_mysqlq.conf import get_settings

from . import admin, analysis, broadcast, facts, logs, server, streamfacts, topics_audit
from .config import ChaosConfig
from .events import EventLog
from .lifetimes import lifetimes
from .monkey import Monkey
from .producers import Producer
from .workers import WorkerPool

logger = logging.getLogger("bench.chaos")

TICK = 0.05
START_PATIENCE = 30.0


def _close_connections() -> None:
    for connection in connections.all():
        with contextlib.suppress(DatabaseError):
            connection.close()


def _prepare(restart: bool) -> None:
    if restart:
        server.check_restartable()
    admin.create_database()
    others = admin.foreign_connections()
    if others:
        listed = ", ".join(f"{cid} ({host})" for cid, host in others[:10])
        raise admin.HarnessError(
            f"{len(others)} other connection(s) use the database {admin.database_name()}: "
            f"{listed}. Is another chaos run going? Stop it, or set MYSQLQ_CHAOS_DB.")
    admin.create_database(afresh=True)
    call_command("migrate", verbosity=0, interactive=False)
    _close_connections()


def _wait_registered(pool: WorkerPool) -> None:
    """Until every running worker has its row in mysqlq_worker (it is claiming)."""
    deadline = time.monotonic() + START_PATIENCE
    while True:
        with admin.connect() as conn:
            cursor = conn.cursor()
            cursor.execute("SELECT pid FROM mysqlq_worker WHERE stopped_at IS NULL")
            registered = {int(row[0]) for row in cursor.fetchall()}
        missing = [w for w in pool.running() if w.pid not in registered]
        if not missing:
            return
        if pool.reap():
            raise admin.HarnessError(f"A worker exited at start; see {missing[0].log_path}.")
        if time.monotonic() > deadline:
            raise admin.HarnessError(
                f"Worker {missing[0].index} did not register within {START_PATIENCE:.0f}s; "
                f"see {missing[0].log_path}.")
        time.sleep(0.1)


class Run:
    def __init__(self, config: ChaosConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.events = EventLog()
        self.pool = WorkerPool(log_dir, self.events, config.worker_args(), config.worker_ports)
        self.rng = random.Random(config.seed)
        self.stop_producers = threading.Event()
        self.producers = [Producer(i, config, self.stop_producers, config.seed * 1000 + i)
                          for i in range(config.producers)]
        self.timing: dict[str, float] = {}
        self.monkey = Monkey(config, self.pool, self.events, self.rng)

    def _phase(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.timing[name] = round(now - since, 1)
        return now

    def execute(self) -> dict[str, Any]:
        began = mark = time.monotonic()
        _prepare(self.config.restart)
        try:
            for _ in range(self.config.workers):
                self.pool.start()
            _wait_registered(self.pool)
            mark = self._phase("setup", mark)
            self._chaos()
            mark = self._phase("chaos", mark)
            self._drain()
            # Broadcast readers are nobody's backlog: give them the audit's grace to read
            # the last messages, so the final stop excuses none (broadcast.py).
            time.sleep(broadcast.GRACE)
            mark = self._phase("drain", mark)
            logger.info("Stopping the workers (SIGTERM).")
            self.pool.stop_all()
            mark = self._phase("stop", mark)
        finally:
            self.stop_producers.set()
            for producer in self.producers:
                producer.join(30)
            self.pool.kill_all()
            _close_connections()
        result = self._analyze()
        self._phase("analysis", mark)
        self.timing["total"] = round(time.monotonic() - began, 1)
        result["timing"] = self.timing
        return result

    def _replace_crashed(self) -> None:
        for _ in range(self.pool.reap()):
            logger.warning("A worker exited by itself; starting a replacement.")
            self.pool.start()

    def _chaos(self) -> None:
        monkey = self.monkey
        logger.info("Load and chaos for %.0fs: %d workers, %d producers at %.0f msg/s; "
                    "%d actions planned.", self.config.seconds, self.config.workers,
                    self.config.producers, self.config.rate, len(monkey.pending))
        for producer in self.producers:
            producer.start()
        started = time.monotonic()
        seen = 0
        while (elapsed := time.monotonic() - started) < self.config.seconds:
            self._replace_crashed()
            monkey.step(elapsed)
            for event in self.events.all()[seen:]:
                logger.info("[%5.1fs] %s pid=%s %s", elapsed, event.kind, event.pid,
                            event.detail)
            seen = len(self.events.all())
            time.sleep(TICK)
        self.stop_producers.set()
        for producer in self.producers:
            producer.join(30)
        if monkey.pending:
            logger.warning("%d planned action(s) not carried out: %s", len(monkey.pending),
                           [item.action for item in monkey.pending])
        monkey.wait_for_nodes()  # a killed cluster node is back before the drain

    def _drain(self) -> None:
        """Let the workers empty the queue (dead messages aside), within a bound."""
        deadline = time.monotonic() + self.config.drain_timeout
        backlog: dict[str, int] = {}
        while time.monotonic() < deadline:
            self._replace_crashed()
            backlog = admin.queue_backlog()
            backlog.pop("dead", None)
            backlog.update(admin.topic_backlog())
            if not backlog:
                logger.info("Queue drained.")
                return
            time.sleep(0.2)
        logger.warning("Queue and topic not drained after %.0fs: %s", self.config.drain_timeout,
                       backlog)

    def _analyze(self) -> dict[str, Any]:
        rolled_back = {token for producer in self.producers
                       for token in producer.stats.rolled_back_tokens}
        events = self.events.all()
        lease = get_settings().LEASE_SECONDS
        task_facts = facts.load()
        result = analysis.analyze(task_facts, events, rolled_back,
                                  self.config.recovery_limit, lease, self.pool.ports_by_pid())
        crash_runs = {run.pid: run.start for m in task_facts.messages.values()
                      if m.kind == "crash" for run in m.runs}
        topic = topics_audit.analyze(streamfacts.load(), events, rolled_back,
                                     lifetimes(self.pool.workers, crash_runs), lease)
        result["metrics"].update(topic.pop("metrics"))
        result["metrics"]["topic_rolled_back"] = sum(p.stats.published_rolled_back
                                                     for p in self.producers)
        result["metrics"]["topic_published_bulk"] = sum(p.stats.published_bulk
                                                        for p in self.producers)
        result["failures"] += topic.pop("failures")
        result["ok"] = not result["failures"]
        result.update(topic)
        _close_connections()
        result["log_errors"] = logs.error_lines(self.log_dir)
        result["producers"] = {
            "transactions": sum(p.stats.transactions for p in self.producers),
            "committed": sum(p.stats.committed for p in self.producers),
            "rolled_back": sum(p.stats.rolled_back for p in self.producers),
            "errors": sum(p.stats.errors for p in self.producers),
            "last_errors": [p.stats.last_error for p in self.producers if p.stats.last_error],
        }
        result["workers"] = {
            "started": len(self.pool.workers),
            "ports": {str(w.pid): w.port for w in self.pool.workers if w.port is not None},
            "exit_statuses": {str(pid): status
                              for pid, status in self.pool.exit_statuses.items()},
        }
        result["events"] = [event.as_dict() for event in events]
        result["config"] = self.config.as_dict()
        result["logs"] = str(self.log_dir)
        return result
