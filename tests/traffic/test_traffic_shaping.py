"""Internet-only egress shaping in network namespaces with real TCP (issue 15 item 2).

The traffic check runs in the node namespace (netns_runner, with a pods file as its PodView); pods send
to the internet peer and the cluster peer through the node's one uplink at the same time. Rates are the
median of half-second samples at the receiver, turned into wire rates (what HTB limits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import NO_HOST_KMSG as HERMETIC
from conftest import require_tool
from netns_helpers import runner
from traffic_lab import measure, shape_lab

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

ANNOTATION = "node-health-agent/internet-egress-bandwidth"
LIMIT = 50_000_000
TOLERANCE = 0.10  # the 50 ± 10 %
FULL = 4 * LIMIT  # "full speed": well above the limit (veth between namespaces carries Gbit/s even loaded)


def config(tmp: Path, backend: str = "nft", enabled: bool = True, extra: str = "") -> str:
    path = tmp / "agent.toml"
    path.write_text(
        f'[checks.traffic]\nenabled = true\nbackend = "{backend}"\n'
        f"[checks.traffic.shaping]\nenabled = {'true' if enabled else 'false'}\n{extra}" + HERMETIC
    )
    return str(path)


def pod(name: str, ip: str, limit: str | None = None, namespace: str = "train", **extra: object) -> dict:
    annotations = {ANNOTATION: limit} if limit is not None else {}
    return {"namespace": namespace, "name": name, "uid": f"uid-{name}", "ips": [ip], "annotations": annotations,
            **extra}


def write_pods(path: Path, pods: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(pods))
    tmp.replace(path)


def within(rate: float, want: float) -> bool:
    return abs(rate - want) <= want * TOLERANCE


def mbit(rate: float) -> str:
    return f"{rate / 1e6:.1f} Mbit/s"


@pytest.fixture
def lab_and_pods(tmp_path):
    require_tool("tc")
    require_tool("iptables-nft")
    with shape_lab() as L:
        pods_file = tmp_path / "pods.json"
        write_pods(pods_file, [pod("pod-a", L.addr["pod-a"], "50M"), pod("pod-b", L.addr["pod-b"])])
        yield L, pods_file


def test_shaped_pod_is_limited_to_the_internet_only(lab_and_pods, tmp_path) -> None:
    L, pods_file = lab_and_pods
    before = L.qdiscs()
    with runner(L.node, config(tmp_path), str(tmp_path / "state"), args=["traffic", str(pods_file)]) as r:
        res = r.run()
        assert not res.data["findings"], [f["message"] for f in res.data["findings"]]
        assert res.sample("node_health_pod_egress_limit_bytes_per_second", namespace="train", pod="pod-a") == LIMIT / 8
        assert res.sample("node_health_pod_egress_limit_bytes_per_second", namespace="train", pod="pod-b") is None
        assert f"qdisc htb 4e48: dev {L.uplink} root" in L.qdiscs()

        # pod-a to the internet and to the cluster at once, pod-b (unshaped) to the internet beside them
        shaped, cluster, other = measure(L, [("pod-a", "internet"), ("pod-a", "cluster"), ("pod-b", "internet")])
        print(f"limited pod: internet {mbit(shaped)}, cluster {mbit(cluster)}; unlimited pod: internet {mbit(other)}")
        assert within(shaped, LIMIT), f"shaped pod to the internet at {mbit(shaped)}, want {mbit(LIMIT)} ± 10 %"
        assert cluster > FULL, f"shaped pod to the cluster at {mbit(cluster)}: the limit must not apply"
        assert other > FULL, f"unshaped pod to the internet at {mbit(other)}"

        res = r.run()
        sent = res.sample("node_health_pod_egress_shaped_bytes_total", namespace="train", pod="pod-a")
        assert sent is not None and sent > 8 * LIMIT / 8 * 0.5  # 8 s at 50 Mbit/s, at least half of it counted
        assert res.sample("node_health_pod_egress_dropped_packets_total", namespace="train", pod="pod-a") is not None

        # the annotation removed: the class goes, the root is given back, full speed again
        write_pods(pods_file, [pod("pod-a", L.addr["pod-a"]), pod("pod-b", L.addr["pod-b"])])
        res = r.run()
        assert res.sample("node_health_pod_egress_limit_bytes_per_second", namespace="train", pod="pod-a") is None
        assert not res.data["findings"], [f["message"] for f in res.data["findings"]]
        assert L.qdiscs() == before
        assert "CLASSIFY" not in L.node.run("iptables-nft-save", "-t", "mangle").stdout
        [freed] = measure(L, [("pod-a", "internet")], seconds=5)
        print(f"limit removed: internet {mbit(freed)}")
        assert freed > FULL, f"pod to the internet at {mbit(freed)} after its limit was removed"


def test_disabled_touches_no_qdisc(lab_and_pods, tmp_path) -> None:
    L, pods_file = lab_and_pods
    before = L.qdiscs()
    with runner(L.node, config(tmp_path, enabled=False), str(tmp_path / "state"),
                args=["traffic", str(pods_file)]) as r:
        res = r.run()
        assert res.sample("node_health_traffic_rules_in_place", family="ipv4") == 1
        assert res.sample("node_health_pod_egress_limit_bytes_per_second", namespace="train", pod="pod-a") is None
    assert L.qdiscs() == before
    assert "CLASSIFY" not in L.node.run("iptables-nft-save", "-t", "mangle").stdout
    [rate] = measure(L, [("pod-a", "internet")], seconds=4)
    assert rate > FULL


def test_classes_survive_a_restart_and_are_repaired(lab_and_pods, tmp_path) -> None:
    """A restart keeps each pod's class (no flap); a class or the root deleted by someone comes back;
    turning shaping off gives the root back to the kernel."""
    L, pods_file = lab_and_pods
    write_pods(pods_file, [pod("pod-a", L.addr["pod-a"], "50M"), pod("pod-c", L.addr["pod-c"], namespace="batch")])
    before = L.qdiscs()
    cfg = config(tmp_path, extra='namespace_defaults = { "batch" = "20M" }\n')
    state = str(tmp_path / "state")
    with runner(L.node, cfg, state, args=["traffic", str(pods_file)]) as r:
        r.run()
        classes = L.classes()
    assert classes.count("class htb 4e48:") == 2
    assert "rate 50Mbit" in classes and "rate 20Mbit" in classes
    with runner(L.node, cfg, state, args=["traffic", str(pods_file)]) as r:
        res = r.run()
        assert L.classes() == classes  # same ids, same rates: nothing re-created
        assert res.sample("node_health_pod_egress_limit_bytes_per_second", namespace="batch", pod="pod-c") == 20e6 / 8

        minor = classes.split("class htb 4e48:")[1].split()[0]
        L.node.run("tc", "class", "del", "dev", L.uplink, "classid", f"4e48:{minor}")
        r.run()
        assert L.classes().count("class htb 4e48:") == 2
        L.node.run("tc", "qdisc", "del", "dev", L.uplink, "root")
        r.run()
        assert L.classes().count("class htb 4e48:") == 2

        # a root qdisc someone else made is left alone, with a finding
        L.node.run("tc", "qdisc", "replace", "dev", L.uplink, "root", "handle", "7:", "tbf", "rate", "1gbit",
                   "burst", "100k", "latency", "10ms")
        res = r.run()
        assert (L.uplink, "TrafficShapingNotInstalled") in res.reasons
        assert f"qdisc tbf 7: dev {L.uplink} root" in L.qdiscs()
        L.node.run("tc", "qdisc", "del", "dev", L.uplink, "root")
        res = r.run()
        assert not res.data["findings"]
        assert L.classes().count("class htb 4e48:") == 2
    with runner(L.node, config(tmp_path, enabled=False), state, args=["traffic", str(pods_file)]) as r:
        r.run()
    assert L.qdiscs() == before
    assert not (tmp_path / "state" / "traffic-shaping.json").exists()


def test_malformed_annotation_is_a_finding(lab_and_pods, tmp_path) -> None:
    L, pods_file = lab_and_pods
    write_pods(pods_file, [
        pod("pod-a", L.addr["pod-a"], "fast"),
        pod("pod-b", L.addr["pod-b"], "200Mbit"),
        pod("pod-c", L.addr["pod-c"], "100M", host_network=True),
    ])
    before = L.qdiscs()
    with runner(L.node, config(tmp_path), str(tmp_path / "state"), args=["traffic", str(pods_file)]) as r:
        res = r.run()
    assert {("train/pod-a", "TrafficShapingAnnotationInvalid"), ("train/pod-b", "TrafficShapingAnnotationInvalid"),
            ("train/pod-c", "TrafficShapingAnnotationInvalid")} == res.reasons
    assert 'got "fast"' in res.finding("train/pod-a", "TrafficShapingAnnotationInvalid")["message"]
    assert L.qdiscs() == before


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_classify_rules_on_both_backends(backend: str, tmp_path) -> None:
    """The CLASSIFY rules are written and read back in place by either backend (legacy: python-iptables);
    `agent rules remove` takes them and the root qdisc away."""
    require_tool(f"iptables-{backend}")
    with shape_lab() as L:
        pods_file = tmp_path / "pods.json"
        write_pods(pods_file, [pod("pod-a", L.addr["pod-a"], "50M")])
        with runner(L.node, config(tmp_path, backend=backend), str(tmp_path / "state"),
                    args=["traffic", str(pods_file)]) as r:
            r.run()
            res = r.run()
            assert res.sample("node_health_traffic_rules_in_place", family="ipv4") == 1
            assert res.sample("node_health_traffic_rules_repaired_total", family="ipv4") == 0
        dump = L.node.run(f"iptables-{backend}-save", "-t", "mangle").stdout
        assert '-A NODE-HEALTH-SHAPE -s 10.88.1.2/32 -m comment --comment "node-health-agent:shape:uid-pod-a" ' \
               "-j CLASSIFY --set-class 4e48:" in dump
        assert '-A NODE-HEALTH-INTERNET-OUT -m comment --comment "node-health-agent:shape:jump" -j NODE-HEALTH-SHAPE' \
               in dump
        assert f"qdisc htb 4e48: dev {L.uplink} root" in L.qdiscs()
        # `agent rules remove`: every rule and chain of ours, and the root qdisc given back
        said = L.node.agent("rules", "remove", "--backend", backend, "--config", config(tmp_path, backend=backend))
        assert f"{L.uplink}: root qdisc given back to the kernel" in said.stdout
        assert f"qdisc noqueue 0: dev {L.uplink} root" in L.qdiscs()
        assert "NODE-HEALTH" not in L.node.run(f"iptables-{backend}-save", "-t", "mangle").stdout
