"""``python -m bench.perf.cpu``: the worker process's CPU and statements per task.

One ``runqueueworker --burst`` runs in-process in a probe subprocess and drains ``--tasks``
no-op tasks; the probe reads its own CPU (``getrusage``, all threads) around the command and
counts the statements its connections send (``MySQLdb``'s ``Connection.query``). A second
burst on the then empty queue measures start-up and shut-down alone, which is subtracted::

    cpu_us_per_task = (cpu(drain) - cpu(empty)) / tasks

CPU per task is robust to other load on the machine, wall time is not. Several checkouts
(``--checkout before=/tmp/before``: a ``git worktree add --detach /tmp/before REV``) are
measured interleaved, round after round, each on its own database
(``mysqlq_cpu_<label>``, created afresh and migrated by its own code)::

    python -m bench.perf.cpu --checkout before=/tmp/before --checkout after=. --rounds 5
    python -m bench.perf.cpu --rounds 1 --profile /tmp/prof    # cProfile of every thread

The figures are medians over the rounds; with two checkouts the ratio is the median of the
paired (round by round) ratios of the last to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Creates the checkout's database afresh and migrates it (run inside the checkout).
_SETUP = """
import os, MySQLdb, django
from django.conf import settings
django.setup()
db = settings.DATABASES["default"]
conn = MySQLdb.connect(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                       passwd=db["PASSWORD"])
conn.cursor().execute(f"DROP DATABASE IF EXISTS `{db['NAME']}`")
conn.cursor().execute(f"CREATE DATABASE `{db['NAME']}` CHARACTER SET utf8mb4")
conn.close()
from django.core.management import call_command
call_command("migrate", verbosity=0, interactive=False)
"""

#: Empties the queue tables and enqueues ``n`` no-op tasks (run inside the checkout).
_FILL = """
import sys, django
django.setup()
from django.db import connection
from bench.perf.benchapp.tasks import noop
with connection.cursor() as cursor:
    for table in ("mysqlq_message", "mysqlq_attempt", "mysqlq_worker"):
        cursor.execute(f"TRUNCATE TABLE {table}")
n = int(sys.argv[1])
for start in range(0, n, 5000):
    noop.enqueue_many([noop.call() for _ in range(min(5000, n - start))])
"""

#: One burst worker in this process: CPU, statements and wall time around the command.
_PROBE = """
import json, resource, sys, threading, time, django
django.setup()
import MySQLdb.connections
from django.core.management import call_command
from django.db import connection

args, profile_to = json.loads(sys.argv[1]), sys.argv[2]
sent = [0]
_query = MySQLdb.connections.Connection.query
def query(self, sql):
    sent[0] += 1
    return _query(self, sql)
MySQLdb.connections.Connection.query = query
# CPU of each thread by name (time.thread_time at its end; the main thread's at the end).
thread_cpu = {}
_run = threading.Thread.run
def run(self):
    try:
        _run(self)
    finally:
        name = self.name.rstrip("0123456789")
        thread_cpu[name] = thread_cpu.get(name, 0.0) + time.thread_time()
threading.Thread.run = run
profile = None
if profile_to:
    # Python 3.12's cProfile sees every thread (sys.monitoring): one profiler for all.
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw
(cpu0, switches0), wall0, sent0 = cpu(), time.monotonic(), sent[0]
main0 = time.thread_time()
try:
    call_command("runqueueworker", *args)
except SystemExit:
    pass
(cpu1, switches1), wall1, sent1 = cpu(), time.monotonic(), sent[0]
thread_cpu["main"] = time.thread_time() - main0
if profile is not None:
    profile.disable()
    profile.dump_stats(profile_to)
with connection.cursor() as cursor:
    cursor.execute("SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome = 'succeeded'")
    done = cursor.fetchone()[0]
    cursor.execute("SELECT COUNT(*) FROM mysqlq_message")
    left = cursor.fetchone()[0]
print(json.dumps({"cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "statements": sent1 - sent0,
                  "switches": switches1 - switches0, "threads": thread_cpu, "done": done,
                  "left": left}))
"""


def _env(checkout: Path, label: str, ack_batch: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    env["DJANGO_SETTINGS_MODULE"] = "bench.perf.settings"
    env["MYSQLQ_BENCH_DB"] = f"mysqlq_cpu_{label}"
    env["PYTHONUNBUFFERED"] = "1"
    if ack_batch is not None:
        env["MYSQLQ_BENCH_ACK_BATCH"] = str(ack_batch)
    return env


def _python(checkout: Path, env: dict[str, str], code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.perf.cpu: a step in {checkout} failed "
                         f"(status {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def _probe(checkout: Path, env: dict[str, str], worker_args: list[str],
           profile_to: str = "") -> dict[str, Any]:
    out = _python(checkout, env, _PROBE, json.dumps(worker_args), profile_to)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def measure(checkout: Path, env: dict[str, str], tasks: int, worker_args: list[str],
            profile_to: str = "") -> dict[str, Any]:
    """One drain of ``tasks`` no-op tasks and one empty burst; per-task figures."""
    _python(checkout, env, _FILL, str(tasks))
    drain = _probe(checkout, env, worker_args, profile_to)
    if drain["done"] != tasks or drain["left"]:
        raise SystemExit(f"bench.perf.cpu: {checkout}: {drain['done']} of {tasks} "
                         f"succeeded, {drain['left']} left")
    empty = _probe(checkout, env, worker_args)
    return {
        "cpu_us_per_task": round((drain["cpu_s"] - empty["cpu_s"]) / tasks * 1e6, 1),
        "statements_per_task": round((drain["statements"] - empty["statements"]) / tasks, 3),
        # Context switches of the process (voluntary and not): thread wake-ups, mostly.
        "switches_per_task": round((drain["switches"] - empty["switches"]) / tasks, 2),
        # CPU per task of each kind of thread (main: the control loop).
        "threads_us_per_task": {
            name: round((seconds - empty["threads"].get(name, 0.0)) / tasks * 1e6, 1)
            for name, seconds in drain["threads"].items()},
        "tasks_per_cpu_s": round(tasks / max(drain["cpu_s"] - empty["cpu_s"], 1e-9)),
        "wall_tasks_per_s": round(tasks / max(drain["wall_s"] - empty["wall_s"], 1e-9)),
        "drain": drain, "empty": empty,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.perf.cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", default=[], metavar="LABEL=DIR",
                        help="a checkout to measure (repeatable; default: this one as "
                             "'this'); LABEL names its database mysqlq_cpu_LABEL")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ack-batch", type=int, default=None,
                        help="MYSQLQ['ACK_BATCH_SIZE'] of the workers (default: theirs)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="write a cProfile of each drain (all threads: Python >= 3.12) to DIR")
    parser.add_argument("--json", type=Path, default=None, help="write all figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    checkouts: list[tuple[str, Path]] = []
    for item in args.checkout or [f"this={ROOT}"]:
        label, _, directory = item.partition("=")
        if not directory or not label.isidentifier():
            raise SystemExit(f"bench.perf.cpu: --checkout wants LABEL=DIR, got {item!r}")
        checkouts.append((label, Path(directory).resolve()))
    worker_args = ["--concurrency", str(args.threads), "--batch", str(args.batch),
                   "--burst", "--burst-wait", "0", "-v", "0"]
    envs = {label: _env(path, label, args.ack_batch) for label, path in checkouts}
    for label, path in checkouts:
        _python(path, envs[label], _SETUP)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, dict[str, Any]]] = []
    for number in range(args.rounds):
        row: dict[str, dict[str, Any]] = {}
        for label, path in checkouts:
            profile_to = str(args.profile / f"{label}-r{number}.prof") if args.profile else ""
            row[label] = measure(path, envs[label], args.tasks, worker_args, profile_to)
            figures = row[label]
            print(f"[cpu] round {number + 1} {label}: {figures['cpu_us_per_task']} us/task, "
                  f"{figures['statements_per_task']} statements/task, "
                  f"{figures['switches_per_task']} switches/task, "
                  f"threads {figures['threads_us_per_task']}, "
                  f"{figures['wall_tasks_per_s']} tasks/s wall", flush=True)
        rounds.append(row)
    print(f"\n{args.tasks:,} no-op tasks, {args.threads} thread(s), --batch {args.batch}, "
          f"{args.rounds} round(s): medians")
    print("| checkout | worker CPU µs/task | statements/task | switches/task | tasks/s (wall) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, _ in checkouts:
        def med(key: str, label: str = label) -> float:
            return statistics.median(r[label][key] for r in rounds)
        print(f"| {label} | {med('cpu_us_per_task'):.1f} | {med('statements_per_task'):.3f} "
              f"| {med('switches_per_task'):.2f} | {med('wall_tasks_per_s'):,.0f} |")
    if len(checkouts) > 1:
        first, last = checkouts[0][0], checkouts[-1][0]
        ratio = statistics.median(r[last]["cpu_us_per_task"] / r[first]["cpu_us_per_task"]
                                  for r in rounds)
        print(f"\nCPU per task {last} / {first}, paired median: {ratio:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
