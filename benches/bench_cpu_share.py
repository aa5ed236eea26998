#!/usr/bin/env python3
"""CPU share of `agent run` at its default intervals (goal: 0.5 % of one core or less).

Starts `agent run` as a subprocess (the embedded default config, or --config),
waits until it is up and past its start (--warmup), then reads utime + stime
of the whole process from /proc/<pid>/stat at the start and the end of a
window of --seconds, scraping /metrics every --scrape-interval seconds as a
Prometheus server would. Prints the CPU seconds used, the share of one core,
and the RSS at the end of the window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _agent import running_agent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", metavar="FILE", help="config file for `agent run` (default: the embedded defaults)")
    ap.add_argument("--seconds", type=float, default=300.0, help="length of the measured window (default 300)")
    ap.add_argument("--warmup", type=float, default=35.0, help="seconds between start and the window (default 35)")
    ap.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds between scrapes; 0 for none (default 15)"
    )
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    with running_agent(args.config) as agent:
        time.sleep(args.warmup)
        cpu0, wall0 = agent.cpu_seconds(), time.monotonic()
        scrapes = 0
        while (left := wall0 + args.seconds - time.monotonic()) > 0:
            if args.scrape_interval > 0:
                code, _ = agent.get("/metrics")
                scrapes += code == 200
                time.sleep(min(args.scrape_interval, left))
            else:
                time.sleep(left)
        cpu, wall = agent.cpu_seconds() - cpu0, time.monotonic() - wall0
        rss = agent.status().get("VmRSS", 0)
    share = 100 * cpu / wall
    result = {
        "config": args.config or "embedded defaults",
        "window_s": wall,
        "cpu_s": cpu,
        "share_percent": share,
        "scrapes": scrapes,
        "rss_kB_at_end": rss,
        "goal_percent": 0.5,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"agent run ({result['config']}): {wall:.0f}s window after {args.warmup:.0f}s warm-up, {scrapes} scrapes")
    print(f"  CPU {cpu:.2f}s = {share:.3f} % of one core (goal 0.5 % or less); RSS at the end {rss / 1024:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
