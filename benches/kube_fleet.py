"""A simulated fleet through a mass event: the real reconcile code, many agents, one fake API server.

Every agent is a real `Reconciler` with its own kubernetes ApiClient; the
client's urllib3 pool is replaced by the fake server's in-process pool (the
same requests through the same client code, no sockets), and time is virtual:
a discrete-event loop wakes each agent at the time its step asked for. The
fake server can model API Priority and Fairness as a server-side capacity
(requests over it get APF's 429 with Retry-After).

Scenario: the fleet starts (start-up jitter) and settles; at T every node's
disk check reports a critical finding at once; 30 minutes later every check
is clean again (5 clean runs, 30 s apart: the default hysteresis).

    python benches/kube_fleet.py --nodes 7500 --budget 375 --apf 250
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import os
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from agent import config  # noqa: E402
from agent.kube.reconciler import Reconciler  # noqa: E402
from agent.statedir import StateDir  # noqa: E402
from fakeapi import Apf, FakeApiServer  # noqa: E402
from kube_support import BUDGET_NS, CATALOG, QUOTA, finding, in_process_api, snapshot  # noqa: E402



class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_agent(i: int, fake: FakeApiServer, clock: VirtualClock, cfg: Any, root: str) -> Reconciler:
    rng = random.Random(i)
    api = in_process_api(fake, clock, cfg, rng)
    stats = api.stats
    sd = StateDir(os.path.join(root, f"n{i}"))
    sd.ensure()
    return Reconciler(cfg, f"node-{i:05d}", sd, catalog=CATALOG, api=api, dry_run=False, now=clock(), wall=lambda: 1.8e9 + clock.t,
                      rng=rng, stats=stats)


def run(nodes: int, budget: int, apf: float | None, fault_at: float, recover_after: float, spread: float) -> dict[str, Any]:
    clock = VirtualClock()
    fake = FakeApiServer(clock=clock)
    if apf:
        fake.apf = Apf(rate=apf, burst=apf, retry_after=1)
    fake.set_quota(BUDGET_NS, QUOTA, budget)
    cfg = config.defaults().kubernetes
    cfg = dataclasses.replace(cfg, kill_switch=dataclasses.replace(cfg.kill_switch, name=""))  # see README: a watch
    root = tempfile.mkdtemp(prefix="nha-fleet-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    for i in range(nodes):
        fake.add_node(f"node-{i:05d}")
    t0 = time.perf_counter()
    agents = [make_agent(i, fake, clock, cfg, root) for i in range(nodes)]
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(t: float, i: int, snap: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, i, snap))

    spread_rng = random.Random(0)
    for i in range(nodes):
        push(0.0, i, snapshot([], runs=1))
        # Each node's check sees the fault at its own next run: within `spread` (one check interval).
        seen = spread_rng.uniform(0, spread)
        push(fault_at + seen, i, snapshot([finding("FakeDiskFull")], runs=2))
        for k in range(5):
            push(fault_at + recover_after + seen + 30 * k, i, snapshot([], runs=3 + k))
    horizon = fault_at + recover_after + 3600
    due = [0.0] * nodes
    while heap:
        t, _, i, snap = heapq.heappop(heap)
        if t > horizon:
            break
        if snap is None and t < due[i] - 1e-9:
            continue  # a timer superseded by an earlier wake
        clock.t = t
        wake = agents[i].step(t, snap)
        if wake < float("inf"):
            due[i] = wake
            push(max(wake, t + 1e-6), i)
    wall = time.perf_counter() - t0
    return summarize(fake, agents, fault_at, recover_after, wall, budget)


def summarize(fake: FakeApiServer, agents: list[Reconciler], fault_at: float, recover_after: float, wall: float,
              budget: int) -> dict[str, Any]:
    recover_at = fault_at + recover_after
    phases = {"start-up": (0, fault_at), "mass failure": (fault_at, recover_at), "recovery": (recover_at, recover_at + 3600)}
    out: dict[str, Any] = {"wall_seconds": round(wall, 1), "max_slots_held": fake.leases_held_peak()}
    for name, (a, b) in phases.items():
        recs = [r for r in fake.requests if a <= r.t < b]
        per_second = collections.Counter(int(r.t) for r in recs)
        verbs = collections.Counter(r.verb for r in recs)
        last = max((r.t for r in recs if r.status < 300 and r.verb not in ("get", "list")), default=a)
        out[name] = {
            "requests": len(recs), "429": sum(1 for r in recs if r.status == 429),
            "peak_per_s": max(per_second.values(), default=0), "last_write_after_s": round(last - a, 1),
            "by_verb": dict(sorted(verbs.items())),
        }
    out["tainted_at_end"] = sum(1 for a in agents if a.node.obj and any(
        t["key"].startswith("node-health-agent/") for t in a.node.obj["spec"].get("taints", [])))
    out["budget"] = budget
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=7500)
    p.add_argument("--budget", type=int, default=375)
    p.add_argument("--apf", type=float, default=250.0, help="server capacity in requests/s (0: unlimited)")
    p.add_argument("--fault-at", type=float, default=600.0)
    p.add_argument("--recover-after", type=float, default=1800.0)
    p.add_argument("--spread", type=float, default=30.0, help="nodes see the fault within this many seconds (0: all at once)")
    a = p.parse_args()
    result = run(a.nodes, a.budget, a.apf or None, a.fault_at, a.recover_after, a.spread)
    import json

    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
