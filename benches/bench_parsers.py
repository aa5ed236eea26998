#!/usr/bin/env python3
"""Native vs Python parsers on realistic sizes, end to end as the agent calls them.

Each parser takes the bytes of a realistic file (64 NICs, 64 block devices in
the 5.5+ format, ~500 mounts of a Kubernetes GPU node: tests/fixtures/parsers)
and returns the list of records, through `agent.native` (the native library)
and through its Python twin. Prints the median and minimum microseconds per
call and the ratios (Python / native).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from _timing import measure

from agent import native

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "parsers"
CASES = {
    "net_dev": ("net_dev_64nics", native.parse_net_dev),
    "diskstats": ("diskstats_5.5_17fields", native.parse_diskstats),
    "mountinfo": ("mountinfo_k8s_gpu_node", native.parse_mountinfo),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=40, help="batches per implementation (default 40)")
    ap.add_argument("--timer", choices=("cpu", "wall"), default="cpu", help="thread CPU time (default) or wall time")
    ap.add_argument("--only", choices=sorted(CASES), nargs="+", help="parsers to run (default: all)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    if native.IMPLEMENTATION != "native":
        print(f"bench_parsers: native parsers not loaded: {native.describe()}", file=sys.stderr)
        return 2
    results = {}
    for name in args.only or CASES:
        fixture, fn = CASES[name]
        data = (FIXTURES / fixture).read_bytes()
        twin = native.PYTHON_TWINS[name]
        records = fn(data)
        assert records == twin(data), f"{name}: native and Python disagree on {fixture}"
        figs = measure({"native": partial(fn, data), "python": partial(twin, data)}, args.repeat, args.timer)
        results[name] = {
            "fixture": fixture,
            "bytes": len(data),
            "records": len(records),
            "native_us": {"median": figs["native"].median * 1e6, "min": figs["native"].minimum * 1e6},
            "python_us": {"median": figs["python"].median * 1e6, "min": figs["python"].minimum * 1e6},
            "ratio_median": figs["python"].median / figs["native"].median,
            "ratio_min": figs["python"].minimum / figs["native"].minimum,
        }
    if args.json:
        print(json.dumps({"timer": args.timer, "repeat": args.repeat, "parsers": results}, indent=2))
        return 0
    print(f"timer: {args.timer}, {args.repeat} batches each; microseconds per call")
    print(
        f"{'parser':10} {'records':>7} {'native med':>10} {'min':>7} {'python med':>10} {'min':>7} {'ratio med':>9} {'min':>6}"
    )
    for name, r in results.items():
        n, p = r["native_us"], r["python_us"]
        print(
            f"{name:10} {r['records']:7d} {n['median']:10.1f} {n['min']:7.1f} {p['median']:10.1f} {p['min']:7.1f}"
            f" {r['ratio_median']:8.1f}x {r['ratio_min']:5.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
