#!/usr/bin/env python3
"""Resident memory of `agent run` after start (goal: 64 MB or less with every check on).

Starts `agent run` as a subprocess (the embedded default config, or --config;
a throwaway state dir; a free loopback port), waits for /healthz to answer
200, scrapes /metrics once so that the exposition code is loaded too, lets it
settle, then reads VmRSS (and the peak, VmHWM) from /proc/<pid>/status.
Heavy libraries are imported only when their feature is enabled and present,
so use a config with every check on to measure the worst case.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _agent import running_agent

FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "VmData")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", metavar="FILE", help="config file for `agent run` (default: the embedded defaults)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the first scrape (default 5)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    with running_agent(args.config) as agent:
        code, _ = agent.get("/metrics")
        if code != 200:
            print(f"bench_rss: /metrics answered {code}", file=sys.stderr)
            return 1
        time.sleep(args.settle)
        status = agent.status()
    result = {"config": args.config or "embedded defaults", "kB": {k: status.get(k) for k in FIELDS}, "goal_MB": 64}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"agent run ({result['config']}), {args.settle:.0f}s after the first scrape:")
    for key in FIELDS:
        print(f"  {key:8} {status.get(key, 0) / 1024:7.1f} MB")
    print("goal: VmRSS 64 MB or less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
