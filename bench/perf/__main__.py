"""``python -m bench.perf``: run the benchmark, write JSON, a markdown table and plots.

    python -m bench.perf                    # everything, 3 repeats (about 15 minutes, 2 cores)
    python -m bench.perf --smoke            # tiny sizes, 1 repeat: CI's smoke run (seconds)
    python -m bench.perf --only raw,burndown --repeat 5 --out /tmp/bench
    python -m bench.perf --only backlog --backlog-rows 200000 --history-rows 200000
    python -m bench.perf --set latency_rates=(50,) --set latency_seconds=30
    python -m bench.perf --only burndown,cluster --repeat 1   # + the 3-node Galera cluster

The database is ``mysqlq_bench`` on 127.0.0.1:3306 (``MYSQLQ_BENCH_DB``, ``…_HOST``,
``…_PORT``, ``…_USER``, ``…_PASSWORD`` override); it is created and migrated, and its
queue tables are emptied between measurements. The ``cluster`` workload (only with
``--only``) also uses the Galera cluster of ``bench/cluster/galera.sh`` (started if needed).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import ALL_WORKLOADS, FULL, SMOKE, WORKLOADS, Sizes, override

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results"


def _workloads(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL_WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload(s) {', '.join(unknown) or repr(text)}; "
            f"choose from {', '.join(ALL_WORKLOADS)}")
    return [name for name in ALL_WORKLOADS if name in names]


def _repeat(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", "--quick", dest="smoke", action="store_true",
                        help="tiny sizes and 1 repeat (unless --repeat): checks the harness "
                             "works, measures nothing worth quoting")
    parser.add_argument("--only", type=_workloads, default=list(WORKLOADS),
                        metavar="WORKLOAD[,…]",
                        help=f"run only these: {', '.join(ALL_WORKLOADS)} (cluster only "
                             "when named)")
    parser.add_argument("--repeat", type=_repeat, default=None,
                        help="repeats of each measurement (default 3, 1 with --smoke)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for the results (default {DEFAULT_OUT})")
    parser.add_argument("--retries", type=int, default=0, metavar="N",
                        help="when the server restarts under a workload, wait for it and "
                             "measure that workload again, up to N times (default 0: stop)")
    parser.add_argument("--backlog-rows", type=_repeat, default=None, metavar="N",
                        help="ready rows of the large backlog case (default 1,000,000)")
    parser.add_argument("--history-rows", type=_repeat, default=None, metavar="N",
                        help="finished history rows of the backlog case (default 1,000,000)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        dest="assignments",
                        help="override any size of bench/perf/config.py:Sizes, e.g. "
                             "--set latency_seconds=30 --set 'contention_claimers=(1,2,4,8)'")
    args = parser.parse_args(argv)
    try:
        args.sizes = _sizes(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    assignments = list(args.assignments)
    if args.backlog_rows is not None:
        assignments.append(f"backlog_large={args.backlog_rows}")
    if args.history_rows is not None:
        assignments.append(f"backlog_history={args.history_rows}")
    return override(SMOKE if args.smoke else FULL, assignments)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.perf.settings"  # never the tests' database
    import django

    from . import db, environment, plots, report, workers
    from .context import Context
    from .errors import BenchError

    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + ("-smoke" if args.smoke else "")
    clock = time.monotonic()
    repeat = args.repeat or (1 if args.smoke else 3)
    sizes = args.sizes
    log_dir = Path(tempfile.mkdtemp(prefix="mysqlq-bench-"))
    error: str | None = None
    timings: dict[str, float] = {}
    run: dict[str, Any] = {}
    try:
        db.ensure_database(afresh=True)
        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        conn = db.connect()
        run = {
            "run_id": run_id, "mode": "smoke" if args.smoke else "full",
            "started_at": started_at, "command": " ".join(["python -m bench.perf",
                                                           *(argv or sys.argv[1:])]),
            "machine": environment.machine(), "versions": environment.versions(conn),
            "server": db.server_variables(conn),
            "settings": {"repeat": repeat, "database": db.connect_args()["database"],
                         "MYSQLQ": environment.queue_settings(),
                         "sizes": _plain(sizes)},
            "workloads": args.only,
        }
        ctx = Context(sizes=sizes, repeat=repeat, smoke=args.smoke, log_dir=log_dir,
                      conn=conn)
        run["retried"] = []
        try:
            for name in args.only:
                began = time.monotonic()
                _run_workload(ctx, name, args.retries, run["retried"])
                timings[name] = round(time.monotonic() - began, 1)
        finally:
            run["results"] = ctx.results.as_list()
    except BenchError as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted (Ctrl-C)"
    except Exception as exc:
        if not db.is_server_gone(exc):
            raise
        error = (f"MariaDB went away during the run ({exc}); another session may have "
                 "restarted it. Run the benchmark again.")
    finally:
        workers.kill_all()
        if run:
            _empty_tables()
    if not run:  # failed before anything was measured
        print(f"bench: {error}", file=sys.stderr)
        return 2
    run["duration_s"] = round(time.monotonic() - clock, 1)
    run["workload_seconds"] = timings
    run["error"] = error
    args.out.mkdir(parents=True, exist_ok=True)
    run["plots"] = plots.draw(run, args.out)
    json_path, md_path = report.write(run, args.out)
    print(md_path.read_text())
    print(f"[bench] wrote {json_path} and {md_path}", flush=True)
    if error:
        print(f"bench: {error}\n(worker logs kept in {log_dir})", file=sys.stderr)
        return 2
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _run_workload(ctx: Any, name: str, retries: int, retried: list[dict[str, str]]) -> None:
    """Run one workload; after a server restart, wait and run it again (``retries`` times)."""
    from django.db import connections

    from . import db, workers

    for attempt in range(retries + 1):
        ctx.log(f"--- {name}" + (f" (again, attempt {attempt + 1})" if attempt else ""))
        try:
            importlib.import_module(f"bench.perf.workloads.{name}").run(ctx)
            return
        except Exception as exc:
            if not db.is_server_gone(exc) or attempt == retries:
                raise
            ctx.log(f"{name}: the server went away or restarted ({exc}); measuring again")
            retried.append({"workload": name, "reason": str(exc).splitlines()[0]})
            workers.kill_all()
            ctx.results.drop(name)
            db.wait_for_server()
            connections.close_all()
            ctx.conn = db.connect()


def _empty_tables() -> None:
    """Leave no million-row tables behind on a shared server (best effort)."""
    import MySQLdb

    from . import db
    from .errors import BenchError

    try:
        conn = db.connect()
        try:
            db.truncate_queue(conn)
        finally:
            conn.close()
    except (BenchError, OSError, MySQLdb.Error):
        pass


def _plain(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


if __name__ == "__main__":
    sys.exit(main())
