"""``python -m bench.chaos``: run the queue under load while breaking things, then audit it.

    python -m bench.chaos --minutes 2                   # the full run (about 2.5 minutes)
    python -m bench.chaos --seconds 40 --json out.json  # the CI run (about a minute)
    python -m bench.chaos --galera --seconds 40         # on the 3-node Galera cluster

What it does, on its own database ``mysqlq_chaos`` (``MYSQLQ_CHAOS_DB``, ``…_HOST``,
``…_PORT``, ``…_USER``, ``…_PASSWORD`` override; created and migrated, tables emptied):

1. starts ``--workers`` processes of ``runqueueworker --concurrency 4 --batch 5`` (settings
   ``bench.chaos.settings``: heartbeat 1 s, lease 5 s, recovery sweep 0.5 s, poll 0.2 s);
2. runs ``--producers`` threads that enqueue ``--rate`` messages/s in small transactions:
   plain tasks (ledger row at start, sleep 0-300 ms, ledger row at end) and ``atomic=True``
   tasks (one business row, committed with the ack), some delayed, a few rolled back;
   and topic messages (``publish``, ``publish_many``, mostly keyed) to the topic ``chaos``,
   whose three consumer groups (failing 5, 10 and 30 % of runs on purpose, fast retries)
   and broadcast subscription every worker runs (``bench/chaos/ledger/stream.py``);
3. meanwhile, at random intervals: ``kill -9`` of a worker, SIGTERM of another, ``KILL
   CONNECTION`` of all of a worker's connections (each replaced by a fresh worker), a
   message of a task that kills the worker running it (``os._exit``; it must die alone,
   after its own two attempts), a ready row held ``FOR UPDATE`` by the harness for a few
   seconds (the rest must keep flowing), and one restart of MariaDB mid-run
   (``--no-restart`` to skip it; it needs root and disturbs every other user of the server
   for a few seconds);
4. stops the producers, lets the workers drain the queue, stops them with SIGTERM;
5. audits the ledger, the business rows and the queue's history, prints a markdown table
   and writes JSON (``--json PATH``, else ``bench/results/chaos-<time>/result.json``).

With ``--galera`` the run uses the cluster of ``bench/cluster/galera.sh`` (started if it
isn't running; the server on 3306 is left alone): the harness and the producers on node 1
(port 4306), the workers spread over nodes 2 and 3, claims judged by lease alone
(``LEASE_SECONDS`` 3, ``MYSQLQ_CHAOS_LEASE`` overrides), KILL CONNECTION sent on the
worker's own node, and instead of the server restart a kill -9 of the node most workers
use, started again 4 s later (it rejoins by IST while the load goes on). Recovery of a
kill -9 then takes a lease, and a lapsed leader's lease is noticed within two sweep
intervals: the limit on its median is the lease + twice RECOVERY_SECONDS + 2 s (6 s).

It exits 1 when the audit fails: a message lost; a duplicate run with no kill -9, KILL
CONNECTION or restart to explain it; atomic work not exactly once; a run of a rolled-back
message; a message acked without having run, dead, or still queued after the drain; a
claim taken back from a worker nothing had happened to (or left behind by a graceful
stop); a claim held unstarted for longer than a lease; a worker that crashed (not by the
crashing task) or did not stop cleanly; a crashing task not dead at the end; a locked-row
window in which nothing else finished; or a median kill-to-reclaim time over 5 s. The
JSON holds the evidence of each failed check (message ids, runs, history rows, the events
around them). It exits 2
when the harness itself could not do its job. The topic's audit fails it too: a committed
message some group never handled; a rolled-back one sequenced, handled or heard; a topic
duplicate with nothing to explain it; a keyed message out of order within a group; a
group's position short of the topic's last offset; a broadcast message a process that
lived through its window never heard (see docs/reliability.md for the window).

The run restarts the server it uses: the machine's by default. ``--port``, ``--server``,
``--pid-file`` and ``--server-args=…`` name a private one (bench/chaos/server.py).

Worker logs go to the run's directory under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

SETTINGS = "bench.chaos.settings"
#: LEASE_SECONDS of a --galera run: claims are judged by lease alone there.
GALERA_LEASE = 3.0
RESULTS = Path(__file__).resolve().parents[1] / "results"


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=_positive(float), help="length of the load (2)")
    length.add_argument("--seconds", type=_positive(float), help="length of the load")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the result here")
    parser.add_argument("--workers", type=_positive(int), default=3,
                        help="worker processes (3)")
    parser.add_argument("--producers", type=_positive(int), default=2,
                        help="producer threads (2)")
    parser.add_argument("--rate", type=_positive(float), default=30.0,
                        help="messages per second, all producers together (30)")
    parser.add_argument("--interval", type=_positive(float), default=4.0,
                        help="mean seconds between chaos actions (4)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (from the clock)")
    parser.add_argument("--no-restart", action="store_true", help="don't restart MariaDB")
    target = parser.add_argument_group(
        "the server", "where the run's database lives, and the server it restarts (defaults: "
        "127.0.0.1:3306 and Debian's mariadbd); on a shared machine, a private server")
    target.add_argument("--host", help="MariaDB host (MYSQLQ_CHAOS_HOST, 127.0.0.1)")
    target.add_argument("--port", type=_positive(int), help="its port (MYSQLQ_CHAOS_PORT, 3306)")
    target.add_argument("--server", metavar="PATH",
                        help="the mariadbd binary started again after the restart's shutdown "
                             "(MYSQLQ_CHAOS_SERVER, /usr/sbin/mariadbd)")
    target.add_argument("--pid-file", metavar="PATH",
                        help="that server's pid file (MYSQLQ_CHAOS_PID_FILE, "
                             "/run/mysqld/mysqld.pid)")
    target.add_argument("--server-args", metavar="ARGS",
                        help="its options, as one shell string (MYSQLQ_CHAOS_SERVER_ARGS), "
                             "e.g. '--defaults-file=/tmp/chaos/my.cnf'")
    parser.add_argument("--galera", action="store_true",
                        help="run on the 3-node Galera cluster (bench/cluster/galera.sh), "
                             "with a kill -9 of a node instead of the restart")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 60.0 * (args.minutes or 2.0)
    if args.seconds < 10:
        parser.error("--seconds must be at least 10 (warm-up and cool-down take 6)")
    return args


def _log_to(run_dir: Path) -> None:
    """The harness's own queue logs (producers' wake-ups) go to a file, progress to stderr."""
    handler = logging.FileHandler(run_dir / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    queue_logger = logging.getLogger("django_mysqlq")
    queue_logger.handlers = [handler]
    progress = logging.StreamHandler(sys.stderr)
    progress.setFormatter(logging.Formatter("chaos %(asctime)s %(message)s", "%H:%M:%S"))
    logging.getLogger("bench.chaos").handlers = [progress]


def _target(args: argparse.Namespace) -> None:
    """The server options, as the environment the settings, the restart and the workers
    read."""
    for option, name in (("host", "HOST"), ("port", "PORT"), ("server", "SERVER"),
                         ("pid_file", "PID_FILE"), ("server_args", "SERVER_ARGS")):
        value = getattr(args, option)
        if value is not None:
            os.environ[f"MYSQLQ_CHAOS_{name}"] = str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Always the chaos settings: a DJANGO_SETTINGS_MODULE of some project must not leak in.
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    _target(args)
    if args.galera:
        from . import galera

        os.environ["MYSQLQ_CHAOS_HOST"] = "127.0.0.1"
        os.environ["MYSQLQ_CHAOS_PORT"] = str(galera.HARNESS_PORT)
        os.environ.setdefault("MYSQLQ_CHAOS_LEASE", str(GALERA_LEASE))
    import django

    django.setup()
    from .admin import HarnessError
    from .config import ChaosConfig
    from .report import markdown, write_json
    from .run import Run

    seed = args.seed if args.seed is not None else int(time.time())
    config = ChaosConfig(seconds=args.seconds, workers=args.workers,
                         producers=args.producers, rate=args.rate,
                         mean_interval=args.interval, restart=not args.no_restart, seed=seed)
    if args.galera:
        from django_mysqlq.conf import get_settings

        from . import galera

        try:
            print(galera.start_cluster(), end="", file=sys.stderr)
        except HarnessError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            return 2
        # A crashed worker's claims run out of lease; if it led the sweeps, its lease row
        # too, and a follower notices within two sweep intervals: then the 2 s of slack
        # the single server's limit allows.
        conf = get_settings()
        config = dataclasses.replace(
            config, galera=True, restart=False, worker_ports=galera.WORKER_PORTS,
            recovery_limit=conf.LEASE_SECONDS + 2 * conf.RECOVERY_SECONDS + 2.0)
    run_dir = RESULTS / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    _log_to(run_dir)
    try:
        result = Run(config, run_dir).execute()
    except HarnessError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chaos: interrupted; workers stopped, no verdict.", file=sys.stderr)
        return 2
    json_path = args.json or run_dir / "result.json"
    write_json(result, json_path)
    print(markdown(result))
    print(f"\nSeed {seed}; JSON: {json_path}; logs: {run_dir}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
