"""The fleet breaker in a fleet simulation: the real `Ladder` and `KubeRemediation` on every node, one fake
API server, virtual time.

`wave`: every node reports the same definite false positive (an ``rma`` finding, or a ``reboot`` one) at
t=0. Shipped settings ([remediation] enforce with drain, reboot, retire; default timings; the disruption
budget `--budget`; the breaker's count `--count` and percent 5 %). The run goes on `--hold` hours after
the breaker trips (nothing more may be disrupted), then a person resets it (records deleted, the key set to
"false") and it runs until the breaker trips again (it must resume, and stop again at the threshold).

`few`: the same, with the fault on `--faulty` nodes only: the breaker must never trip.

    python benches/fleet_breaker.py wave --nodes 100 --budget 2
    python benches/fleet_breaker.py wave --nodes 1000 --budget 10 --fault reboot
    python benches/fleet_breaker.py few --nodes 100 --faulty 4
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import logging
import os
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DISRUPTION_NS, DISRUPTION_QUOTA = "node-health-disruption", "node-health-disruption-budget"
RECORDS = "node-health-disrupted"
KS_NS, KS = "node-health", "node-health-agent-kill-switch"
EPOCH = 1.8e9
TICK = 60.0  # each ladder ticks once a virtual minute (the runner: every snapshot, at least every 10 s)
REBOOT = 300.0  # seconds a node takes to come back from a reboot


class VirtualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class SimCluster:
    """The runner's KubeSide: the real KubeRemediation; the node's taint is assumed on the Node (the taint
    writer is not simulated)."""

    present = True

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def taint_withheld(self) -> str:
        return ""


@dataclasses.dataclass
class Node:
    name: str
    ladder: Any
    host: Any
    faulty: bool
    boots: int = 1
    back_at: float | None = None
    reboots_seen: int = 0


def run(nodes: int, budget: int, count: int, faulty: int, fault: str, hold_h: float, limit_h: float,
        reset: bool = True, percent: float = 5.0) -> dict[str, Any]:
    from kube_drain import kube_settings
    from kube_fleet import in_process_api
    from remediation_support import CATALOG, FakeHost, fault_list, finding, settings

    from agent.kube.api import ApiError, Wait
    from agent.kube.remediate import KubeRemediation
    from agent.remediation.ladder import Ladder
    from agent.statedir import StateDir
    from fakeapi import FakeApiServer

    clock = VirtualClock()
    fake = FakeApiServer(clock=clock, wall=lambda: EPOCH + clock.t)
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, budget)
    fake.set_quota(RECORDS, RECORDS, count)
    fake.set_quota("node-health-budget", "node-health-taint-budget", max(1, nodes // 20))
    fake.set_configmap(KS_NS, KS, {"paused": "false"})
    kcfg = kube_settings()
    kcfg = dataclasses.replace(kcfg, kill_switch=dataclasses.replace(kcfg.kill_switch, name=KS),
                               breaker=dataclasses.replace(kcfg.breaker, max_disrupted_percent=percent))
    rcfg = settings(mode="enforce", actions=["drain", "reboot", "retire"], reset_gpu_after="2m", reboot_after="10m",
                    drain_after="10m", rma_after="10m", reboot={"min_uptime": "0s"})
    the_fault = fault_list(finding("RowRemapFailure", "rma") if fault == "rma" else finding("XidCritical79", "reboot"))
    root = tempfile.mkdtemp(prefix="fleet-breaker-")
    fleet: list[Node] = []
    for i in range(nodes):
        name = f"node-{i:05d}"
        fake.add_node(name)
        fake.add_pod("team", f"job-{i:05d}", name, owner=("ReplicaSet", f"job-{i}"), stop_after=5)

        rem = KubeRemediation(in_process_api(fake, clock, kcfg, random.Random(i)), name, fake.node(name)["metadata"]["uid"],
                              kcfg, namespace="node-health", wall=lambda: EPOCH + clock.t, rng=random.Random(i))
        host = FakeHost(rcfg)
        host.boot = f"{name}-boot-1"
        host.clock, host.boot_t0 = clock, -100_000.0  # the boot clock (every wait of the ladder) runs in virtual time
        state = StateDir(os.path.join(root, name))
        state.ensure()
        ladder = Ladder(rcfg, state, host, SimCluster(rem), catalog=CATALOG, clock=lambda: EPOCH + clock.t, mono=clock,
                        uptime=host.boot_clock)
        fleet.append(Node(name, ladder, host, faulty=i < faulty))
    fake.requests.clear()
    heap = [(0.0, i) for i in range(nodes)]
    heapq.heapify(heap)
    tripped_at: list[float] = []
    reset_at: float | None = None
    snapshot: dict[str, Any] = {}
    stop_at = limit_h * 3600
    t0 = time.perf_counter()

    def state() -> str:
        return str((fake.cluster.get(("", "configmaps", KS_NS, KS)) or {}).get("data", {}).get("breaker", ""))

    while heap:
        t, i = heapq.heappop(heap)
        if t > stop_at:
            if not (reset and reset_at is None and tripped_at):
                break
            snapshot = summary(fake, fleet, tripped_at, None, t)  # a person resets it
            reset_at = t
            for name in [o["metadata"]["name"] for o in fake.objects("coordination.k8s.io", "leases", RECORDS)]:
                fake.cluster.delete(("coordination.k8s.io", "leases", RECORDS, name))
            data = dict((fake.cluster.get(("", "configmaps", KS_NS, KS)) or {}).get("data") or {})
            data["breaker"] = "false"
            fake.set_configmap(KS_NS, KS, data)
            stop_at = t + limit_h * 3600
        clock.t = t
        n = fleet[i]
        if n.back_at is not None and t >= n.back_at:  # the node came back from its reboot
            n.boots += 1
            n.host.booted(f"{n.name}-boot-{n.boots}")
            n.host.up = 99_999.0  # min_uptime is not what this simulation is about
            n.back_at = None
        if n.back_at is None:
            try:
                n.ladder.tick(the_fault if n.faulty else [])
            except (ApiError, Wait):
                pass
            if n.host.count("reboot") > n.reboots_seen:
                n.reboots_seen = n.host.count("reboot")
                n.back_at = t + REBOOT
        if state() == "tripped" and len(tripped_at) == (1 if reset_at is None else 2) - 1:
            tripped_at.append(t)
            if reset_at is None:
                stop_at = t + hold_h * 3600  # it must stay stopped this long; then a person resets it
            else:
                stop_at = t + 1800
        heapq.heappush(heap, (t + TICK, i))
    out = summary(fake, fleet, tripped_at, reset_at, clock.t)
    out.update(nodes=nodes, budget=budget, count=count, percent=percent, threshold=min(count, max(1, int(percent * nodes / 100))),
               faulty=faulty, fault=fault, wall_seconds=round(time.perf_counter() - t0, 1))
    if snapshot:
        out["before_reset"] = snapshot
    return out


def summary(fake: Any, fleet: list[Node], tripped_at: list[float], reset_at: float | None, now: float) -> dict[str, Any]:
    created = [r for r in fake.log(verbs=("create",)) if f"/namespaces/{RECORDS}/leases" in r.path and r.status < 300]
    drains = [r for r in fake.requests if r.path.endswith("/eviction") and r.status == 201]
    first_trip = tripped_at[0] if tripped_at else None
    after_trip = [r for r in created if first_trip is not None and r.t > first_trip and (reset_at is None or r.t < reset_at)]
    data = (fake.cluster.get(("", "configmaps", KS_NS, KS)) or {}).get("data", {})
    return {
        "tripped_at_s": [round(x, 1) for x in tripped_at],
        "reset_at_s": round(reset_at, 1) if reset_at is not None else None,
        "simulated_s": round(now, 1),
        "records_created": len(created),
        "records_created_while_tripped": len(after_trip),
        "records_now": fake.cluster.leases_in(RECORDS),
        "nodes_drained": len({r.path.split("/pods/")[1].split("/")[0] for r in drains}),  # job-<i> runs on node i
        "evictions": len(drains),
        "reboots": sum(n.host.count("reboot") for n in fleet),
        "retired": sum(1 for n in fleet if n.ladder.rec.retired is not None),
        "breaker": data.get("breaker", ""), "breaker_reason": data.get("breaker-reason", ""),
        "requests": len(fake.requests),
        "requests_per_node": round(len(fake.requests) / len(fleet), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("wave", "few"))
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--budget", type=int, default=2)
    p.add_argument("--count", type=int, default=30, help="the records quota (the breaker's count)")
    p.add_argument("--percent", type=float, default=5.0, help="[kubernetes.breaker] max_disrupted_percent")
    p.add_argument("--faulty", type=int, default=4, help="few: nodes with the fault")
    p.add_argument("--fault", choices=("rma", "reboot"), default="rma")
    p.add_argument("--hold", type=float, default=6.0, help="hours it must stay stopped before the reset")
    p.add_argument("--limit", type=float, default=24.0, help="hours simulated at most (each phase)")
    a = p.parse_args()
    logging.disable(logging.ERROR)
    faulty = a.nodes if a.what == "wave" else a.faulty
    print(json.dumps(run(a.nodes, a.budget, a.count, faulty, a.fault, a.hold, a.limit, reset=a.what == "wave",
                         percent=a.percent), indent=2))


if __name__ == "__main__":
    main()
