"""``python -m bench.perf.paired``: ``bench.perf`` on several checkouts, interleaved, paired.

Each round runs ``python -m bench.perf`` once in every checkout (its own code, its own
database ``mysqlq_paired_<label>``), one after the other, so that the machine's drift hits
all of them alike; the figures of one round are compared with each other (paired ratios),
and the medians over the rounds are reported::

    git worktree add --detach /tmp/before f5fff37
    python -m bench.perf.paired --checkout before=/tmp/before --checkout after=. --rounds 5
    python -m bench.perf.paired --checkout before=/tmp/before --checkout after=. \\
        --rounds 5 -- --only burndown --repeat 1 --set 'burndown=((20000, ((1, 1),), (10,)),)'

Arguments after ``--`` go to every ``bench.perf`` run (default ``--only burndown,latency
--repeat 1``). The table has, per figure, the median of each checkout and the median of
the paired ratios of the last checkout to the first (above 1: the last is higher, which
is better for a rate and worse for a latency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ARGS = ["--only", "burndown,latency", "--repeat", "1"]


def run_once(label: str, checkout: Path, args: list[str], out: Path) -> dict[str, float]:
    """One ``bench.perf`` run in ``checkout``; its figures' medians by key."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    env["MYSQLQ_BENCH_DB"] = f"mysqlq_paired_{label}"
    command = [sys.executable, "-m", "bench.perf", *args, "--out", str(out)]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.perf.paired: {label} failed (status {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    [path] = sorted(out.glob("perf-*.json"))
    run: dict[str, Any] = json.loads(path.read_text())
    return {f"{r['workload']}/{r['case']}/{r['metric']}": r["median"]
            for r in run.get("results", []) if r.get("median") is not None}


def parse(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = DEFAULT_ARGS
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(prog="python -m bench.perf.paired", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", required=True, metavar="LABEL=DIR",
                        help="a checkout to run (repeat: two or more); the first is the base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each run's results under this directory")
    args = parser.parse_args(argv)
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    checkouts = []
    for item in args.checkout:
        label, _, directory = item.partition("=")
        if not directory or not label.isidentifier():
            raise SystemExit(f"bench.perf.paired: --checkout wants LABEL=DIR, got {item!r}")
        checkouts.append((label, Path(directory).resolve()))
    if len(checkouts) < 2:
        raise SystemExit("bench.perf.paired: give at least two checkouts")
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mysqlq-paired-"))
    rounds: list[dict[str, dict[str, float]]] = []
    for number in range(args.rounds):
        row = {}
        for label, path in checkouts:
            out = base / f"r{number + 1}-{label}"
            out.mkdir(parents=True, exist_ok=True)
            print(f"[paired] round {number + 1}/{args.rounds}: {label}", flush=True)
            row[label] = run_once(label, path, args.extra, out)
        rounds.append(row)
    first, last = checkouts[0][0], checkouts[-1][0]
    keys = [key for key in rounds[0][first] if all(key in r[lab] for r in rounds
                                                      for lab, _ in checkouts)]
    labels = [label for label, _ in checkouts]
    print(f"\n{args.rounds} round(s) of bench.perf {' '.join(args.extra)}: medians; "
          f"ratio = {last} / {first}, median of the paired ratios\n")
    print("| figure | " + " | ".join(labels) + " | ratio | ratios by round |")
    print("| --- | " + " | ".join("---:" for _ in labels) + " | ---: | --- |")
    for key in keys:
        medians = [statistics.median(r[label][key] for r in rounds) for label in labels]
        ratios = [r[last][key] / r[first][key] for r in rounds if r[first][key]]
        ratio = f"{statistics.median(ratios):.3f}" if ratios else "-"
        print(f"| {key} | " + " | ".join(f"{m:,.4g}" for m in medians) + f" | {ratio} | "
              + ", ".join(f"{x:.2f}" for x in ratios) + " |")
    (base / "paired.json").write_text(json.dumps({"checkouts": [str(p) for _, p in checkouts],
                                                  "args": args.extra, "rounds": rounds}))
    print(f"\n[paired] results kept in {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
