"""Per-pod accounting end to end, the whole chain as it runs on a node: `agent run` in the lab's node namespace,
the pods learnt from the API server (the one pod watch: a LIST, then a WATCH with ``spec.nodeName``), their
addresses turned into rules of ours, real TCP from the pod namespaces, the counts on /metrics under the pods'
names; a pod deleted from the API → its series and its rules gone, the other pod's untouched.

The fake API server listens on 127.0.0.1 inside the node namespace (started from a thread that entered it), so the
agent there reaches it as it would reach its API server; nothing leaves the namespaces this test made."""

from __future__ import annotations

from typing import Any

import pytest
from agentproc import Agent
from conftest import require_tool
from fakeapi import FakeApiServer
from kube_support import BUDGET_NS, NODE, QUOTA
from traffic_lab import metric, pod_lab, send, until

from agent.registry import CHECKS

pytestmark = pytest.mark.privileged

MB = 1_000_000
BYTES = "node_health_pod_traffic_bytes_total"
OTHERS = "".join(f"[checks.{name}]\nenabled = false\n" for name in CHECKS if name != "traffic")


def ours(L: Any, pod: str) -> list[str]:
    """Our per-pod rules that name this pod's address."""
    addr = f" {L.pod_addr(pod)}/32 "
    return [line for line in L.node.save("legacy", "-t", "mangle").splitlines()
            if "node-health-agent:pod-" in line and addr in line]


def bytes_of(samples: dict[Any, float], pod: str, direction: str = "internet-out") -> float | None:
    return metric(samples, BYTES, namespace="team", pod=pod, direction=direction)


@pytest.mark.slow
def test_pods_from_the_api_counted_under_their_names_and_forgotten_when_deleted(tmp_path) -> None:
    require_tool("iptables-legacy")
    with pod_lab(2) as L:
        fake = FakeApiServer(bookmark_interval=0.2)
        L.node.call(fake.start)
        try:
            fake.add_node(NODE)
            fake.set_quota(BUDGET_NS, QUOTA, 10)
            for name in ("pod0", "pod1"):
                fake.add_pod("team", name, NODE)
                ip = L.pod_addr(name)
                fake.edit_pod("team", name, lambda p, ip=ip: p["status"].update(podIP=ip, podIPs=[{"ip": ip}]))
            fake.add_pod("team", "elsewhere", "gpu-node-2")  # another node's pod: never seen
            kc = fake.kubeconfig(str(tmp_path / "kc"))
            cfg = tmp_path / "agent.toml"
            cfg.write_text(
                f'[agent]\nnode_name = "{NODE}"\nlog_format = "text"\n'
                '[kubernetes]\nstartup_jitter = "0s"\n[kubernetes.kill_switch]\nname = ""\n'
                '[checks.traffic]\ninterval = "1s"\nbackend = "legacy"\n' + OTHERS  # nothing else runs (no host kernel log)
            )
            agent = Agent(tmp_path, config_path=cfg, netns=L.node, args=("--kubeconfig", kc),
                          log_path=tmp_path / "agent.log", log_format=None, start=False)
            agent.start()
            try:
                until(agent, "both pods' series", lambda s: bytes_of(s, "pod0") is not None
                      and bytes_of(s, "pod1") is not None, timeout=60)
                assert bytes_of(agent.samples(), "elsewhere") is None
                send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 2 * MB)
                send(L.ns["pod1"], L.ns["cluster"], "10.77.0.2", 2 * MB)  # cluster traffic: not internet
                samples = until(agent, "pod0's internet bytes", lambda s: (bytes_of(s, "pod0") or 0) >= 2 * MB and s)
                assert bytes_of(samples, "pod0") < 2 * MB * 1.1  # payload plus TCP/IP headers, nothing else
                assert (bytes_of(samples, "pod1") or 0) < 64 * 1024  # the cluster transfer is not internet
                assert [len(ours(L, p)) for p in ("pod0", "pod1")] == [2, 2]  # one address each, two directions

                fake.cluster.delete(("", "pods", "team", "pod0"))
                until(agent, "pod0's series gone", lambda s: bytes_of(s, "pod0") is None
                      and bytes_of(s, "pod1") is not None)
                assert [len(ours(L, p)) for p in ("pod0", "pod1")] == [0, 2]
                assert L.pod_addr("pod0") not in L.node.save("legacy", "-t", "mangle")
                pods_reqs = [r.verb for r in fake.log() if r.path == "/api/v1/pods"]
                assert pods_reqs.count("list") == 1 and "watch" in pods_reqs  # one watch, no polling
            finally:
                assert agent.stop(20) == 0
        finally:
            fake.stop()
