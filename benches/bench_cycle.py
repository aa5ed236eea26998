#!/usr/bin/env python3
"""CPU time of one full cycle of the host checks, in process.

Builds the enabled checks from a config (the embedded defaults unless
--config) with a throwaway state dir, then runs them:

- each check's `run()` on its own, timing the CPU time of the calling thread;
- a whole cycle through the scheduler (`Scheduler.run_once`, every check in
  its own thread, as `agent run --once` does), timing the CPU time of the
  whole process (`resource.getrusage`, threads included);
- the agent's own child processes (the filesystem probe worker of
  agent/probeproc.py): their CPU time is read from /proc/<pid>/stat, in clock
  ticks (10 ms), so it is given as the mean over all steady cycles, beside the
  whole process's own over the same cycles.

The first cycle pays for imports and first-time setup, so it is reported apart
from the steady cycles after it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from agent.runtime import Overrides, build_checks, load_config
from agent.scheduler import Scheduler
from agent.store import Store


def process_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """utime + stime of this process's live children (not counted by getrusage until reaped)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                pids = fh.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def scheduler_cycle(checks: list) -> tuple[float, float]:  # type: ignore[type-arg]
    sched = Scheduler(Store())
    sched.configure(checks, immediate=True)
    cpu, wall = process_cpu(), time.perf_counter()
    sched.run_once()
    return process_cpu() - cpu, time.perf_counter() - wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", metavar="FILE", help="config file (default: the embedded defaults)")
    ap.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks (enabled or not)")
    ap.add_argument("--cycles", type=int, default=20, help="steady cycles after the first (default 20)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    cfg = load_config(Overrides(config_path=args.config))
    with tempfile.TemporaryDirectory(prefix="nha-bench-") as state:
        checks = build_checks(cfg, state, args.only)
        first_cpu, first_wall = scheduler_cycle(checks)
        per_check: dict[str, list[float]] = {check.name: [] for check, _ in checks}
        cycles: list[tuple[float, float]] = []
        own, kids = process_cpu(), children_cpu()
        for _ in range(args.cycles):
            for check, _ in checks:
                start = time.thread_time()
                check.run()
                per_check[check.name].append(time.thread_time() - start)
            cycles.append(scheduler_cycle(checks))
        own, kids = (process_cpu() - own) / args.cycles / 2, (children_cpu() - kids) / args.cycles / 2
    cpu = [c for c, _ in cycles]
    result = {
        "checks": sorted(per_check),
        "first_cycle_ms": {"cpu": first_cpu * 1e3, "wall": first_wall * 1e3},
        "cycle_cpu_ms": {"median": statistics.median(cpu) * 1e3, "min": min(cpu) * 1e3},
        "cycle_wall_ms": {"median": statistics.median(w for _, w in cycles) * 1e3},
        # each steady cycle runs every check twice (alone, then through the scheduler): per run of all checks
        "mean_cpu_ms": {"process": own * 1e3, "children": kids * 1e3},
        "check_cpu_ms": {n: {"median": statistics.median(v) * 1e3, "min": min(v) * 1e3} for n, v in per_check.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"checks: {', '.join(result['checks']) or '(none enabled)'}; {args.cycles} steady cycles")
    print(f"{'':34} {'median ms':>9} {'min ms':>8}")
    print(f"{'first cycle (scheduler), CPU':34} {first_cpu * 1e3:9.2f}")
    print(
        f"{'steady cycle (scheduler), CPU':34} {result['cycle_cpu_ms']['median']:9.2f} {result['cycle_cpu_ms']['min']:8.2f}"
    )
    print(f"{'steady cycle (scheduler), wall':34} {result['cycle_wall_ms']['median']:9.2f}")
    print(f"{'mean per cycle, process CPU':34} {own * 1e3:9.2f}")
    print(f"{'mean per cycle, child processes CPU':34} {kids * 1e3:9.2f}")
    for name, fig in result["check_cpu_ms"].items():
        print(f"{'  ' + name + '.run(), thread CPU':34} {fig['median']:9.2f} {fig['min']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
