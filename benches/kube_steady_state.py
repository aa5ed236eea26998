"""API requests per node-hour of a healthy node, with every periodic timer of the agent scaled down.

Real actuator threads (node resync, the kill-switch list + watch with
bookmarks) against the fake API server over HTTP, with every interval divided
by --scale (20 min resync → 6 s, a 30-60 min watch → 9-18 s, 60 s bookmarks →
0.3 s, a check every 30 s → 0.15 s); the counts are scaled back to one hour.
Requests of the first --warmup seconds (start-up: the first read, the first
condition write, the first list) are left out.

    python benches/kube_steady_state.py --nodes 5 --seconds 60 --scale 200
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from agent.kube import actuator  # noqa: E402
from fakeapi import FakeApiServer  # noqa: E402
from kube_support import BUDGET_NS, QUOTA, settings, snapshot, start_actuator  # noqa: E402

KS = "node-health-agent-kill-switch"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--scale", type=float, default=200.0)
    p.add_argument("--warmup", type=float, default=3.0)
    a = p.parse_args()
    defaults = settings()
    actuator.WATCH_MIN = max(1, round(actuator.WATCH_MIN / a.scale))
    actuator.WATCH_MAX = max(1, round(actuator.WATCH_MAX / a.scale))
    fake = FakeApiServer(bookmark_interval=60.0 / a.scale)
    fake.start()
    fake.set_quota(BUDGET_NS, QUOTA, 10)
    fake.set_configmap("node-health", KS, {"paused": "false"})
    cfg = settings(kill_switch=KS, qps=defaults.qps * a.scale, burst=8,
                   resync_interval=config_resync() / a.scale, backoff_max=300 / a.scale)
    nodes = [f"node-{i}" for i in range(a.nodes)]
    agents = []
    for n in nodes:
        fake.add_node(n)
        agents.append(start_actuator(fake, tempfile.mkdtemp(), cfg, node=n))
    start = time.monotonic()
    runs = 1
    try:
        while time.monotonic() - start < a.seconds + a.warmup:
            for act in agents:
                act.offer(snapshot([], runs=runs))
            runs += 1
            time.sleep(30.0 / a.scale)
    finally:
        for act in agents:
            act.stop()
        fake.stop()
    recs = [r for r in fake.requests if r.t >= start + a.warmup and r.t < start + a.warmup + a.seconds]
    hours = a.seconds * a.scale / 3600 * a.nodes
    by = collections.Counter((r.verb, r.path.rsplit("/", 1)[-1] if r.verb in ("list", "watch") else r.verb) for r in recs)
    writes = sum(n for (v, _), n in by.items() if v in ("create", "update", "patch", "delete"))
    print(f"node-hours={hours:.1f} requests/node-hour={len(recs) / hours:.2f} writes/node-hour={writes / hours:.2f}")
    for (verb, what), n in sorted(by.items()):
        print(f"  {verb:6s} {what:12s} {n / hours:.2f}/node-hour")


def config_resync() -> float:
    from agent import config

    return config.defaults().kubernetes.resync_interval


if __name__ == "__main__":
    main()
