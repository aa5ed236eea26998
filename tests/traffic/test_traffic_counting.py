"""Real TCP through a node namespace: traffic with the internet peer is counted
(sent, received and forwarded for a pod), cluster traffic is not. Both backends."""

from __future__ import annotations

import json

import pytest
from conftest import require_tool
from traffic_lab import Lab, lab, send

pytestmark = pytest.mark.privileged

MB = 1_000_000
# IP and TCP headers on top of the payload: 52 bytes per full-sized segment at
# MSS 1448 (3.6%), less with GSO; plus handshake, ACKs and FIN.
OVERHEAD = 0.05
SLACK = 64 * 1024


@pytest.fixture(scope="module", params=["legacy", "nft"])
def node_lab(request):
    """One lab per backend; tests compare counters before and after their own traffic."""
    require_tool(f"iptables-{request.param}")
    with lab() as L:
        L.node.agent("rules", "install", "--backend", request.param)
        yield L, request.param


def counters(L: Lab, backend: str) -> dict[str, tuple[int, int]]:
    shown = json.loads(L.node.agent("rules", "show", "--json", "--backend", backend).stdout)
    return {r["name"]: (r["packets"], r["bytes"]) for r in shown["rules"]}


def grew(before: dict, after: dict, name: str) -> int:
    return after[name][1] - before[name][1]


@pytest.mark.parametrize(
    ("src", "dst", "addr", "payload_counted_as"),
    [
        pytest.param("node", "internet", "198.51.100.2", "internet-out", id="node sends to the internet (OUTPUT)"),
        pytest.param("internet", "node", "198.51.100.1", "internet-in", id="node receives from the internet (INPUT)"),
        pytest.param("pod", "internet", "198.51.100.2", "internet-out", id="pod sends through the node (FORWARD)"),
        pytest.param("internet", "pod", "10.88.0.2", "internet-in", id="pod receives through the node (FORWARD)"),
    ],
)
def test_internet_traffic_is_counted(node_lab, src: str, dst: str, addr: str, payload_counted_as: str) -> None:
    L, backend = node_lab
    before = counters(L, backend)
    send(L.ns[src], L.ns[dst], addr, 3 * MB)
    after = counters(L, backend)
    payload = grew(before, after, payload_counted_as)
    assert 3 * MB <= payload <= 3 * MB * (1 + OVERHEAD) + SLACK
    other = "internet-in" if payload_counted_as == "internet-out" else "internet-out"
    assert 0 < grew(before, after, other) <= 3 * MB * OVERHEAD + SLACK  # the ACKs going the other way


@pytest.mark.parametrize(
    ("src", "dst", "addr"),
    [
        pytest.param("node", "cluster", "10.77.0.2", id="node to cluster"),
        pytest.param("cluster", "node", "10.77.0.1", id="cluster to node"),
        pytest.param("pod", "cluster", "10.77.0.2", id="pod to cluster through the node"),
        pytest.param("node", "node", "127.0.0.1", id="loopback"),
        pytest.param("node", "node", "198.51.100.1", id="to the node's own public address"),
    ],
)
def test_cluster_and_local_traffic_is_not_counted(node_lab, src: str, dst: str, addr: str) -> None:
    L, backend = node_lab
    before = counters(L, backend)
    send(L.ns[src], L.ns[dst], addr, 2 * MB)
    assert counters(L, backend) == before
