"""Per-pod internet accounting against the real kernel, both backends: a node
namespace routing for three pod namespaces, a cluster peer and an internet
peer, real TCP. The traffic check runs in the node namespace with a static
pod view standing in for the pod watch (netns_runner's pods file)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import NO_HOST_KMSG as HERMETIC, require_tool
from netns_helpers import Result, runner
from traffic_lab import PodLab, lab_agent, metric, pod_lab, send, steady, until

pytestmark = pytest.mark.privileged

MB = 1_000_000
TOLERANCE = 0.02  # against the IP bytes the pod's own interface carried
ARP = 1024  # the interface also carries ARP (28 bytes a frame, not IP): matters only where the flow is ACKs alone
BYTES, PACKETS = "node_health_pod_traffic_bytes_total", "node_health_pod_traffic_packets_total"


def pods_json(L: PodLab, names: list[str]) -> list[dict]:
    out = [{"namespace": "team", "name": n, "uid": f"uid-{n}", "ips": [L.pod_addr(n)]} for n in names]
    # the node's own address as a host-network pod: never counted per pod
    out.append({"namespace": "kube-system", "name": "kube-proxy", "uid": "uid-kp", "ips": ["198.51.100.1"],
                "host_network": True})
    return out


class Pods:
    """The pods file netns_runner serves as the check's PodView (absent: pods unknown)."""

    def __init__(self, path) -> None:  # type: ignore[no-untyped-def]
        self.path = path

    def set(self, pods: list[dict] | None) -> None:
        if pods is None:
            self.path.unlink(missing_ok=True)
        else:
            self.path.write_text(json.dumps(pods))


def per_pod(res: Result) -> dict[tuple[str, str], float]:
    return {(s["labels"]["pod"], s["labels"]["direction"]): float(s["value"])
            for s in res.data["samples"] if s["name"] == BYTES}


def our_rules(L: PodLab, backend: str) -> list[str]:
    return [line for line in L.node.save(backend, "-t", "mangle").splitlines() if "node-health-agent:pod-" in line]


@pytest.fixture(params=["legacy", "nft"])
def checked(request, tmp_path):
    backend = request.param
    require_tool(f"iptables-{backend}")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[checks.traffic]\nbackend = "{backend}"\n')
    pods = Pods(tmp_path / "pods.json")
    pods.set([])
    with pod_lab(3) as L, runner(L.node, str(cfg), str(tmp_path / "state"),  # type: ignore[arg-type]
                                 args=("traffic", str(pods.path))) as r:
        r.set_pods = pods.set  # type: ignore[attr-defined]
        yield L, r, backend


def test_each_pod_counted_to_the_right_pod_and_direction(checked) -> None:
    L, r, backend = checked
    r.set_pods(pods_json(L, ["pod0", "pod1", "pod2"]))
    first = r.run()
    assert metric_of(first, "node_health_pod_traffic_accounting_up") == 1
    assert set(per_pod(first)) == {(p, d) for p in ("pod0", "pod1", "pod2") for d in ("internet-in", "internet-out")}
    assert metric_of(first, "node_health_pod_traffic_rules") == 6
    assert len(our_rules(L, backend)) == 6 + 2  # a rule per pod and direction, and the two jumps

    # cluster traffic is not internet traffic
    send(L.ns["pod2"], L.ns["cluster"], "10.77.0.2", 3 * MB)
    send(L.ns["cluster"], L.ns["pod0"], L.pod_addr("pod0"), 2 * MB)
    assert per_pod(r.run()) == per_pod(first)

    before = per_pod(r.run())
    wire = {p: L.l3_bytes(p) for p in ("pod0", "pod1", "pod2")}
    send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 6 * MB)
    send(L.ns["internet"], L.ns["pod1"], L.pod_addr("pod1"), 5 * MB)
    send(L.ns["pod2"], L.ns["internet"], "198.51.100.2", 2 * MB)
    send(L.ns["internet"], L.ns["pod2"], L.pod_addr("pod2"), 3 * MB)
    after = per_pod(r.run())
    grew = {k: after[k] - before[k] for k in after}
    for p in ("pod0", "pod1", "pod2"):
        rx, tx = (now - then for now, then in zip(L.l3_bytes(p), wire[p]))
        assert abs(grew[(p, "internet-in")] - rx) <= max(TOLERANCE * rx, ARP), (p, grew, rx)
        assert abs(grew[(p, "internet-out")] - tx) <= max(TOLERANCE * tx, ARP), (p, grew, tx)
    assert 6 * MB <= grew[("pod0", "internet-out")] <= 6 * MB * 1.05
    assert 5 * MB <= grew[("pod1", "internet-in")] <= 5 * MB * 1.05
    assert grew[("pod1", "internet-out")] < 0.05 * 5 * MB  # only the ACKs


def metric_of(res: Result, name: str) -> float | None:
    return res.sample(name)


def test_deleted_pod_loses_its_series_and_rules(checked) -> None:
    L, r, backend = checked
    r.set_pods(pods_json(L, ["pod0", "pod1", "pod2"]))
    r.run()
    send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 1 * MB)
    kept = per_pod(r.run())[("pod0", "internet-out")]
    gens = {line for line in our_rules(L, backend) if L.pod_addr("pod0") in line}
    r.set_pods(pods_json(L, ["pod0", "pod2"]))
    res = r.run()
    assert {p for p, _ in per_pod(res)} == {"pod0", "pod2"}
    assert not any(L.pod_addr("pod1") + "/32" in line for line in our_rules(L, backend))
    assert {line for line in our_rules(L, backend) if L.pod_addr("pod0") in line} == gens  # untouched
    assert per_pod(res)[("pod0", "internet-out")] >= kept
    r.set_pods(None)  # the pod watch lost: unknown, never zero
    res = r.run()
    assert per_pod(res) == {} and res.sample("node_health_pod_traffic_accounting_up") == 0
    assert ("pods", "PodTrafficUnknown") in res.reasons
    assert len(our_rules(L, backend)) == 4 + 2  # the pods last known count on


def test_flush_under_load_repaired_and_monotonic(checked) -> None:
    L, r, backend = checked
    r.set_pods(pods_json(L, ["pod0", "pod1", "pod2"]))
    r.run()
    seen = []
    with steady(L.ns["pod0"], L.ns["internet"], "198.51.100.2") as sent:
        for flush in (["-F"], ["-F", "NODE-HEALTH-POD-OUT"], ["-F"]):
            seen.append(per_pod(r.run())[("pod0", "internet-out")])
            L.node.run(f"iptables-{backend}", "-t", "mangle", *flush)
            res = r.run()  # the next run puts them back
            assert res.sample("node_health_traffic_rules_in_place", family="ipv4") == 1
            assert len(our_rules(L, backend)) == 8
            seen.append(per_pod(res)[("pod0", "internet-out")])
            floor = len(sent)
            while len(sent) < floor + 2:  # counting again, from where it was
                r.run()
    seen.append(per_pod(r.run())[("pod0", "internet-out")])
    assert seen == sorted(seen)
    assert seen[-1] - seen[-2] >= 2 * 4_000_000


def test_a_chain_the_agent_rebuilds_keeps_what_it_counted_since_the_last_run(checked) -> None:
    """A repair that rebuilds one of our chains (its count rule starts again at 0, a new generation) first takes
    what the old rule counted since the last run: nothing the rules saw is lost to the agent's own repair."""
    L, r, backend = checked
    r.set_pods(pods_json(L, ["pod0"]))
    r.run()

    def node_out(res: Result) -> float:
        value = res.sample("node_health_traffic_bytes_total", direction="internet-out", family="ipv4")
        assert value is not None
        return value

    base, pod_base = node_out(r.run()), per_pod(r.run())[("pod0", "internet-out")]
    send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 2 * MB)  # counted by the rules, not read by the agent yet
    L.node.run(f"iptables-{backend}", "-t", "mangle", "-I", "NODE-HEALTH-INTERNET-OUT", "1", "-p", "icmp", "-j", "RETURN")
    res = r.run()  # our chain altered: rebuilt
    assert res.sample("node_health_traffic_rules_in_place", family="ipv4") == 1
    assert not any("-p icmp" in line for line in L.node.save(backend, "-t", "mangle").splitlines()
                   if line.startswith("-A NODE-HEALTH-INTERNET-OUT"))
    assert node_out(res) >= base + 2 * MB
    assert per_pod(res)[("pod0", "internet-out")] >= pod_base + 2 * MB


def test_restart_carries_the_counts_on(checked, tmp_path) -> None:
    L, r, backend = checked
    r.set_pods(pods_json(L, ["pod0"]))
    r.run()
    send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 2 * MB)
    before = per_pod(r.run())[("pod0", "internet-out")]
    r.close()
    L.node.run(f"iptables-{backend}", "-t", "mangle", "-F", "NODE-HEALTH-POD-OUT")  # re-created while down
    cfg = tmp_path / "agent.toml"
    with runner(L.node, str(cfg), str(tmp_path / "state"), args=("traffic", str(tmp_path / "pods.json"))) as again:  # type: ignore[arg-type]
        assert per_pod(again.run())[("pod0", "internet-out")] >= before
        send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 1 * MB)
        assert per_pod(again.run())[("pod0", "internet-out")] >= before + 1 * MB


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_agent_with_static_entries_repairs_within_the_interval(tmp_path, backend: str) -> None:
    """The daemon without a cluster: `[checks.traffic.pods] static` entries, a firewall flush under load."""
    require_tool(f"iptables-{backend}")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[agent]\nlog_format = "text"\n'
        f'[checks.traffic]\ninterval = "1s"\nbackend = "{backend}"\n'
        '[checks.traffic.pods]\nstatic = { "farm-a" = "10.88.1.0/24", "farm-b" = "10.88.2.0/24" }\n' + HERMETIC
    )
    with pod_lab(2) as L:
        agent = lab_agent(L.node, tmp_path, cfg, tmp_path / "agent.log")
        agent.start()
        try:
            def farm_a(s: dict) -> float | None:  # type: ignore[type-arg]
                return metric(s, BYTES, namespace="", pod="farm-a", direction="internet-out")

            until(agent, "per-pod series", lambda s: farm_a(s) is not None)
            send(L.ns["pod0"], L.ns["internet"], "198.51.100.2", 2 * MB)
            floor = until(agent, "farm-a counted", lambda s: (farm_a(s) or 0) >= 2 * MB and farm_a(s))
            with steady(L.ns["pod0"], L.ns["internet"], "198.51.100.2") as sent:
                runs_at = metric(agent.samples(), "node_health_check_runs_total", check="traffic") or 0
                L.node.run(f"iptables-{backend}", "-t", "mangle", "-F")
                samples = until(agent, "repaired", lambda s: metric(
                    s, "node_health_traffic_rules_repaired_total", family="ipv4") and s)
                # repaired by the run that followed the flush (the one under way may have read before it)
                assert (metric(samples, "node_health_check_runs_total", check="traffic") or 0) <= runs_at + 2
                assert farm_a(samples) >= floor
                at_repair, sent_at_repair = farm_a(samples), len(sent)
                until(agent, "more sent", lambda s: len(sent) >= sent_at_repair + 3, timeout=60)
            until(agent, "farm-a counting again", lambda s: (farm_a(s) or 0) >= at_repair + 2 * 4_000_000)
            assert metric(agent.samples(), BYTES, namespace="", pod="farm-b", direction="internet-out") == 0
            assert len(re.findall("node-health-agent:pod-", L.node.save(backend, "-t", "mangle"))) == 4 + 2
        finally:
            agent.stop(20)
