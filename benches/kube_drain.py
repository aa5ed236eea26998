"""Drain benchmarks against the fake API server: one node with 100 pods behind PDBs, and a 7,500-node fleet.

`node`: one `KubeRemediation` through the real client over HTTP; time is the
fake server's virtual clock (the ladder's tick is 1 s), so PDB waits, backoff
and the rate limit count in full, and the wall time of the requests is
measured beside it. From the moment the ladder acts on the fatal finding
(claim_slot) to the node fully drained.

`fleet`: every node fails at once; each agent (the real KubeRemediation,
in-process client, virtual time) claims a disruption slot, drains its pods,
"reboots" (holds the slot), and releases it. Reports peak evictions/s, the
most slots held at once (from the fake server's log), and when the last node
was handled.

    python benches/kube_drain.py node
    python benches/kube_drain.py fleet --nodes 7500 --budget 75 --apf 250
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kube_fleet, also when a test loads this file

DISRUPTION_NS, DISRUPTION_QUOTA = "node-health-disruption", "node-health-disruption-budget"


class VirtualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def kube_settings() -> Any:
    from agent import config

    cfg = config.defaults().kubernetes
    return dataclasses.replace(cfg, kill_switch=dataclasses.replace(cfg.kill_switch, name=""))


def populate_node(fake: Any, node: str, ready_after: float) -> dict[str, int]:
    """100 evictable pods (and 10 that stay): apps behind PDBs of three kinds, and pods with no budget."""
    for i in range(4):  # 4 x 10 replicas, maxUnavailable 1: one pod of each at a time
        fake.add_replicaset(f"serve-{i}", "api", 10, node, labels={"app": "api"}, ready_after=ready_after)
        fake.add_pdb(f"serve-{i}", "api", {"app": "api"}, max_unavailable=1)
    for i in range(3):  # 3 x 10 replicas, minAvailable 50 %
        fake.add_replicaset(f"batch-{i}", "work", 10, node, labels={"app": "work"}, ready_after=ready_after)
        fake.add_pdb(f"batch-{i}", "work", {"app": "work"}, min_available="50%")
    for i in range(30):  # no budget at all
        fake.add_pod("scratch", f"job-{i}", node, owner=("ReplicaSet", f"job-{i}"), stop_after=5)
    for i in range(5):
        fake.add_pod(f"ds-{i}", f"agent-{i}", node, owner=("DaemonSet", f"agent-{i}"))
        fake.add_pod("kube-system", f"sys-{i}", node, owner=("ReplicaSet", f"sys-{i}"))
    return {"evictable": 100, "kept": 10}


def bench_node(rounds: int, ready_after: float, retry_max: float | None = None, qps: float | None = None,
               watch: bool = False) -> dict[str, Any]:
    from agent.kube.api import Wait
    from agent.kube.podwatch import PodWatch
    from agent.kube.remediate import KubeRemediation
    from fakeapi import FakeApiServer
    from kube_support import make_api, wait_for

    drained, walls, requests, refused, pod_reads = [], [], [], [], []
    for r in range(rounds):
        clock = VirtualClock(1000.0)
        fake = FakeApiServer(clock=clock, wall=lambda c=clock: 1.8e9 + c.t)  # type: ignore[misc]
        fake.start()
        try:
            fake.add_node("gpu-1")
            fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, 1)
            populate_node(fake, "gpu-1", ready_after)
            cfg = kube_settings()
            if retry_max is not None:
                cfg = dataclasses.replace(cfg, drain=dataclasses.replace(cfg.drain, retry_max=retry_max))
            if qps is not None:
                cfg = dataclasses.replace(cfg, drain=dataclasses.replace(cfg.drain, qps=qps))
            tmp = tempfile.mkdtemp(prefix="nha-drain-bench-")
            pw = None
            if watch:  # the agent's one pod watch (a check reads pods): the drain reads it instead of listing
                pw = PodWatch(make_api(fake, tmp, cfg), "gpu-1", cfg.pods, rng=random.Random(r))
                pw.start()
                wait_for(lambda: pw is not None and pw.drain_pods() is not None)
            rem = KubeRemediation(make_api(fake, tmp, cfg, clock), "gpu-1", fake.node("gpu-1")["metadata"]["uid"], cfg,
                                  namespace="node-health", rng=random.Random(r), watched=pw.drain_pods if pw else None)
            t0, spent = clock.t, 0.0
            while clock.t - t0 < 7200:
                w = time.perf_counter()
                try:
                    if rem.claim_slot(clock.t) and rem.drain(clock.t).done:
                        spent += time.perf_counter() - w
                        break
                except Wait:
                    pass
                spent += time.perf_counter() - w
                clock.t += 1.0  # the ladder's tick
                fake.tick()  # the kubelets and controllers act at this time, whether or not the agent asks
                if pw is not None:  # the watch delivers within milliseconds; here, before the next tick
                    wait_for(lambda: synced(fake, pw, "gpu-1"))
            drained.append(clock.t - t0)
            walls.append(spent)
            requests.append(len(fake.requests))
            refused.append(sum(1 for x in fake.requests if x.path.endswith("/eviction") and x.status == 429))
            pod_reads.append(sum(1 for x in fake.requests if x.path == "/api/v1/pods"))
        finally:
            if pw is not None:
                pw.stop()
            fake.stop()
    med = sorted(drained)[len(drained) // 2]
    return {"rounds": rounds, "replacement_ready_after_s": ready_after, "drained_after_s_median": med,
            "drained_after_s": drained, "wall_in_agent_s_median": round(sorted(walls)[len(walls) // 2], 2),
            "requests_median": sorted(requests)[len(requests) // 2], "pdb_429_median": sorted(refused)[len(refused) // 2],
            "pod_list_and_watch_requests_median": sorted(pod_reads)[len(pod_reads) // 2], "pod_watch": watch}


def synced(fake: Any, pw: Any, node: str) -> bool:
    """The pod watch has seen every pod write of `node` so far (pods, and which are terminating)."""
    def key(p: dict[str, Any]) -> tuple[str, bool]:
        return p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))
    live = {key(p) for p in fake.pods(node) if p["status"].get("phase") not in ("Succeeded", "Failed")}
    return live == {key(p) for p in pw.drain_pods() or ()}


# ---------------------------------------------------------------- the fleet


@dataclasses.dataclass
class Agent:
    rem: Any
    phase: str = "claim"  # claim → drain → reboot → done
    until: float = 0.0


def make_remediation(i: int, fake: Any, clock: VirtualClock, cfg: Any) -> Any:
    from agent.kube.remediate import KubeRemediation
    from kube_fleet import in_process_api

    name = f"node-{i:05d}"
    rng = random.Random(i)
    return KubeRemediation(in_process_api(fake, clock, cfg, rng), name, fake.node(name)["metadata"]["uid"], cfg,
                           namespace="node-health", wall=lambda: 1.8e9 + clock.t, rng=rng)


def populate_fleet(fake: Any, nodes: int, ready_after: float) -> None:
    """Per node: 2 pods of apps spread over 10 nodes (PDB maxUnavailable 1), 1 pod with no budget, 1 DaemonSet pod."""
    from fakeapi.workloads import ReplicaSet

    for i in range(nodes):
        fake.add_node(f"node-{i:05d}")
    for app in range(nodes * 2 // 10):
        ns = f"app-{app:05d}"
        fake.add_pdb(ns, "svc", {"app": "svc"}, max_unavailable=1)
        members = [(app * 10 + k) % nodes if k < 5 else (app * 10 + k + nodes // 2) % nodes for k in range(10)]
        fake.workloads.replicasets[(ns, "svc")] = ReplicaSet(ns, "svc", 10, {"app": "svc"}, "spare-node", ready_after,
                                                             uid=f"uid-replicaset-{ns}-svc", made=10)
        for k, n in enumerate(members):
            fake.add_pod(ns, f"svc-{k}", f"node-{n:05d}", labels={"app": "svc"}, owner=("ReplicaSet", "svc"))
    for i in range(nodes):
        fake.add_pod("scratch", f"job-{i:05d}", f"node-{i:05d}", owner=("ReplicaSet", f"job-{i}"))
        fake.add_pod("monitoring", f"exporter-{i:05d}", f"node-{i:05d}", owner=("DaemonSet", "exporter"))


def bench_fleet(nodes: int, budget: int, apf: float | None, reboot: float, ready_after: float) -> dict[str, Any]:
    from agent.kube.api import ApiError, Wait
    from fakeapi import Apf, FakeApiServer

    clock = VirtualClock()
    fake = FakeApiServer(clock=clock, wall=lambda: 1.8e9 + clock.t)
    if apf:
        fake.apf = Apf(rate=apf, burst=apf, retry_after=1)
    fake.set_quota(DISRUPTION_NS, DISRUPTION_QUOTA, budget)
    populate_fleet(fake, nodes, ready_after)
    fake.requests.clear()
    cfg = kube_settings()
    agents = [Agent(make_remediation(i, fake, clock, cfg)) for i in range(nodes)]
    heap = [(0.0, i) for i in range(nodes)]  # every node's fault is seen at t=0
    t0 = time.perf_counter()
    done_at = 0.0
    while heap:
        t, i = heapq.heappop(heap)
        clock.t = t
        a = agents[i]
        try:
            nxt = step(a, t, reboot)
        except Wait as w:
            nxt = w.until
        except ApiError:
            nxt = a.rem.api.gate.backing_off_until if a.rem.api.gate.backing_off_until > t else t + 5
        if a.phase == "done":
            done_at = max(done_at, t)
            continue
        heapq.heappush(heap, (max(nxt, t + 1e-3), i))
    handled = sum(1 for a in agents if a.phase == "done")
    return summarize(fake, nodes, budget, handled, done_at, time.perf_counter() - t0)


def step(a: Agent, t: float, reboot: float) -> float:
    rem = a.rem
    if a.phase == "claim":
        if rem.claim_slot(t):
            a.phase = "drain"
            return t
        return max(rem.budget.retry_at, t + 1)
    if a.phase in ("drain", "reboot") and not rem.renew_slot(t):  # as the ladder does on every tick while it holds one
        a.phase = "claim"  # the slot was reclaimed: claim one again before the next step
        return t
    if a.phase == "drain":
        if rem.drain(t).done:
            a.phase, a.until = "reboot", t + reboot
            return a.until
        return t + 1  # the ladder's tick
    if a.phase == "reboot" and t >= a.until:
        rem.release_slot(t)
        a.phase = "done"
    return a.until


def summarize(fake: Any, nodes: int, budget: int, handled: int, done_at: float, wall: float) -> dict[str, Any]:
    peak = fake.leases_held_peak(DISRUPTION_NS)
    evictions = [r for r in fake.requests if r.path.endswith("/eviction")]
    per_s = collections.Counter(int(r.t) for r in evictions if r.status == 201)
    per_s_all = collections.Counter(int(r.t) for r in fake.requests)
    left = sum(1 for p in fake.objects("", "pods") if p["metadata"]["namespace"] != "monitoring"
               and p["spec"]["nodeName"] != "spare-node")
    claimed, held = {}, []  # from the log: when each node's Lease was created, and how long it was held
    for r in fake.log(verbs=("create", "delete")):
        if f"/namespaces/{DISRUPTION_NS}/leases" in r.path and r.status < 300:
            if r.verb == "create":
                claimed[r.body["metadata"]["name"]] = r.t
            else:
                held.append(r.t - claimed.pop(r.path.rsplit("/", 1)[1]))
    return {
        "nodes": nodes, "budget": budget, "max_slots_held": peak, "slots_held_at_end": fake.cluster.leases_in(DISRUPTION_NS),
        "handled": handled, "evictable_pods_left": left,
        "every_node_handled_after_s": round(done_at, 1), "requests_per_node": round(len(fake.requests) / nodes, 1),
        "slot_held_s_median": round(sorted(held)[len(held) // 2], 1) if held else 0.0,
        "slots_in_use": round(sum(held) / (budget * done_at), 3) if done_at else 0.0,  # of budget × time
        "evictions_201": sum(per_s.values()), "evictions_429_pdb": sum(1 for r in evictions if r.status == 429),
        "peak_evictions_per_s": max(per_s.values(), default=0),
        "requests": len(fake.requests), "requests_429": sum(1 for r in fake.requests if r.status == 429),
        "peak_requests_per_s": max(per_s_all.values(), default=0),
        "by_verb": dict(sorted(collections.Counter(r.verb for r in fake.requests).items())),
        "wall_seconds": round(wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    n = sub.add_parser("node", help="one node, 100 pods behind PDBs, over HTTP")
    n.add_argument("--rounds", type=int, default=5)
    n.add_argument("--ready-after", type=float, default=10.0, help="seconds a replacement pod takes to turn Ready")
    n.add_argument("--retry-max", type=float, default=None, help="[kubernetes.drain] retry_max (default: the config's)")
    n.add_argument("--qps", type=float, default=None, help="[kubernetes.drain] qps (default: the config's)")
    n.add_argument("--watch", action="store_true", help="the pod watch runs (a check reads pods): the drain reads it")
    f = sub.add_parser("fleet", help="every node of a fleet fails at once")
    f.add_argument("--nodes", type=int, default=7500)
    f.add_argument("--budget", type=int, default=75)
    f.add_argument("--apf", type=float, default=250.0, help="server capacity in requests/s (0: unlimited)")
    f.add_argument("--reboot", type=float, default=300.0, help="seconds a node holds its slot after the drain")
    f.add_argument("--ready-after", type=float, default=10.0)
    a = p.parse_args()
    import logging

    logging.disable(logging.WARNING)  # a fleet logs every refused eviction once
    if a.what == "node":
        out = bench_node(a.rounds, a.ready_after, a.retry_max, a.qps, a.watch)
    else:
        out = bench_fleet(a.nodes, a.budget, a.apf or None, a.reboot, a.ready_after)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
