#!/usr/bin/env python3
"""Resident memory of `agent run` after start (goal: 64 MB or less with every check on).

Starts `agent run` as a subprocess (the embedded default config, or --config;
a throwaway state dir; a free loopback port), waits for /healthz to answer
200, scrapes /metrics once so that the exposition code is loaded too, lets it
settle, then reads VmRSS (and the peak, VmHWM) from /proc/<pid>/status.
Heavy libraries are imported only when their feature is enabled and present,
so use a config with every check on to measure the worst case.

``--fake-h100s N`` runs it with N fake H100s (the tests' libnvidia-ml.so.1,
needs gcc) and the traffic check off, and ``--telemetry both`` twice, with
``[checks.gpu_telemetry]`` off and on: what the GPU telemetry costs (goal
≤ 10 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from _agent import running_agent

FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "VmData")


def measure(config: str | None, settle: float) -> dict[str, int] | None:
    with running_agent(config) as agent:
        code, _ = agent.get("/metrics")
        if code != 200:
            print(f"bench_rss: /metrics answered {code}", file=sys.stderr)
            return None
        time.sleep(settle)
        agent.get("/metrics")
        return agent.status()


def fake_gpu_configs(tmp: str, count: int, base: str | None) -> dict[str, str]:
    """Config files for `count` fake H100s, with the telemetry check off and on."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
    from fakenvml import Scenario, build, h100

    lib = build(tmp)
    os.environ["FAKE_NVML_SCENARIO"] = os.path.join(tmp, "scenario.txt")
    Scenario(os.environ["FAKE_NVML_SCENARIO"]).set([h100(i) for i in range(count)])
    head = open(base).read() if base else ""
    out = {}
    for name, on in (("off", "false"), ("on", "true")):
        path = out[name] = os.path.join(tmp, f"telemetry-{name}.toml")
        with open(path, "w") as fh:
            fh.write(f'{head}\n[checks.gpu]\nnvml_library = "{lib}"\n[checks.traffic]\nenabled = false\n'
                     f"[checks.gpu_telemetry]\nenabled = {on}\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", metavar="FILE", help="config file for `agent run` (default: the embedded defaults)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the first scrape (default 5)")
    ap.add_argument("--fake-h100s", type=int, default=0, metavar="N", help="run with N fake H100s (the tests' fake NVML)")
    ap.add_argument("--telemetry", choices=("on", "off", "both"), default="on", help="with --fake-h100s: the telemetry check")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nha-rss-") as tmp:
        if args.fake_h100s:
            configs = fake_gpu_configs(tmp, args.fake_h100s, args.config)
            runs = {k: v for k, v in configs.items() if args.telemetry in (k, "both")}
        else:
            runs = {args.config or "embedded defaults": args.config}
        statuses = {}
        for name, config in runs.items():
            status = measure(config, args.settle)
            if status is None:
                return 1
            statuses[name] = status
    result = {"runs": {n: {k: s.get(k) for k in FIELDS} for n, s in statuses.items()}, "goal_MB": 64}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, status in statuses.items():
        what = f"{args.fake_h100s} fake H100s, telemetry {name}" if args.fake_h100s else name
        print(f"agent run ({what}), {args.settle:.0f}s after the first scrape:")
        for key in FIELDS:
            print(f"  {key:8} {status.get(key, 0) / 1024:7.1f} MB")
    if {"on", "off"} <= statuses.keys():
        delta = (statuses["on"].get("VmRSS", 0) - statuses["off"].get("VmRSS", 0)) / 1024
        print(f"telemetry adds {delta:+.1f} MB of VmRSS (goal: 10 MB or less)")
    print("goal: VmRSS 64 MB or less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
