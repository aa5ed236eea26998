"""auto picks the backend the host's rules live in, as kube-proxy's
iptables-wrapper does: kubelet's hint chains first, then the rule counts."""

from __future__ import annotations

import sys

import pytest
from conftest import require_tool
from traffic_lab import Netns, namespaces

pytestmark = pytest.mark.privileged


def detect(node: Netns) -> str:
    code = "from agent.traffic.detect import detect; print(detect()[0])"
    return node.run(sys.executable, "-c", code).stdout.strip()


def rules(node: Netns, mode: str, n: int, table: str = "filter") -> None:
    for i in range(n):
        node.run(f"iptables-{mode}", "-t", table, "-A", "INPUT", "-s", f"192.0.2.{i + 1}/32", "-j", "ACCEPT")


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        pytest.param(lambda ns: None, "nft", id="empty host goes to nft"),
        pytest.param(lambda ns: ns.run("iptables-nft", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"), "nft",
                     id="kubelet hint in nft"),
        pytest.param(lambda ns: (ns.run("ip6tables-legacy", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"),
                                 rules(ns, "nft", 5)), "legacy", id="kubelet canary in legacy beats nft rules"),
        pytest.param(lambda ns: (rules(ns, "legacy", 3), rules(ns, "nft", 2)), "legacy", id="more legacy rules"),
        pytest.param(lambda ns: (rules(ns, "legacy", 2), rules(ns, "nft", 2)), "nft", id="a tie goes to nft"),
        pytest.param(lambda ns: (ns.run(sys.executable, "-m", "agent", "rules", "install", "--backend", "legacy"),
                                 rules(ns, "nft", 1)), "nft", id="our own rules do not count"),
    ],
)
def test_detection(setup, expected: str) -> None:
    require_tool("iptables-legacy")
    require_tool("iptables-nft")
    with namespaces("detect") as ns:
        setup(ns["detect"])
        assert detect(ns["detect"]) == expected


def test_detection_creates_no_legacy_table() -> None:
    require_tool("iptables-legacy")
    with namespaces("detect") as ns:
        node = ns["detect"]
        assert detect(node) == "nft"
        assert node.run("iptables-legacy-save").stdout.strip() == ""
