"""Per-pod internet accounting: what is counted (the node's pods, or named
CIDRs without a cluster) and the rules that count it.

Two set chains of ours hang from the internet chains (`rules.SubChain`),
after their RETURNs for loopback and the internal ranges, so only traffic
with the internet reaches them::

    -A NODE-HEALTH-INTERNET-IN  ... -j NODE-HEALTH-POD-IN    (comment node-health-agent:pod-in:jump)
    -A NODE-HEALTH-POD-IN  -d 10.88.1.7/32 -m comment --comment "node-health-agent:pod-in:count:<key>:<gen>" -j RETURN
    -A NODE-HEALTH-POD-OUT -s 10.88.1.7/32 -m comment --comment "node-health-agent:pod-out:count:<key>:<gen>" -j RETURN

One rule per pod address and direction: the pod's end of the connection is
matched (destination inbound, source outbound), the other end is known to be
on the internet already. RETURN ends the walk at the first match (a packet
walks half the chain on average, not all of it) and hands the packet back to
the internet chain, where a later sub-chain (shaping's) still sees it.

The key (16 hex digits) is a hash of namespace, name, uid and address: a
new pod that gets an old pod's address gets a new rule, and its count starts
at zero. The rules form a set: a pod that comes or goes adds or deletes its
own two rules per address and leaves every other rule, and its counter, as it
was. Host-network pods are the node and are not counted per pod.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from ..pods import PodAddr, Refused, vet
from .rules import DIRECTIONS, KEY_HEX, Network, Spec, SubChain, comment, family_of

CHAINS: Mapping[str, str] = MappingProxyType(
    {"internet-in": "NODE-HEALTH-POD-IN", "internet-out": "NODE-HEALTH-POD-OUT"}
)
TAGS: Mapping[str, str] = MappingProxyType({"internet-in": "pod-in", "internet-out": "pod-out"})
DIRECTION_OF_TAG: Mapping[str, str] = MappingProxyType({t: d for d, t in TAGS.items()})


@dataclass(frozen=True, slots=True)
class Counted:
    """One thing counted per pod: a pod, or a named CIDR (namespace "")."""

    namespace: str
    pod: str
    uid: str
    nets: tuple[Network, ...]

    def key(self, net: Network) -> str:
        return _key(self.namespace, self.pod, self.uid, net)


@lru_cache(maxsize=4096)
def _key(namespace: str, pod: str, uid: str, net: Network) -> str:
    return hashlib.sha256("\0".join((namespace, pod, uid, str(net))).encode()).hexdigest()[:KEY_HEX]


def from_pods(pods: Iterable[PodAddr]) -> tuple[tuple[Counted, ...], tuple[Refused, ...]]:
    """The pods worth counting (not host-network, with an address), and what was refused (`agent.pods.vet`):
    a pod whose uid or name is not Kubernetes', an address that is not one IP, an address two pods list (a
    pod's status not updated yet, or a hostile API server): that address goes to neither, never the wrong one."""
    vetted = vet(pods)
    out = []
    for p, addrs in vetted.pods:
        mine = tuple(ipaddress.ip_network(a) for a in addrs)
        if mine and not p.host_network:
            out.append(Counted(p.namespace, p.name, p.uid, mine))
    return tuple(sorted(out, key=lambda c: (c.namespace, c.pod))), vetted.refused


def from_static(static: Mapping[str, str]) -> tuple[Counted, ...]:
    """The ``[checks.traffic.pods] static`` entries (validated by the config)."""
    return tuple(Counted("", name, "", (ipaddress.ip_network(cidr),)) for name, cidr in sorted(static.items()))


def sub_chains(family: str, counted: Sequence[Counted]) -> tuple[SubChain, ...]:
    """The two set chains that count `counted` in `family` (empty chains when nothing is counted there)."""
    out = []
    for direction in DIRECTIONS:
        tag, inbound = TAGS[direction], direction == "internet-in"
        rules = tuple(
            Spec(comment(tag, f"count:{c.key(net)}"), "RETURN", src="" if inbound else str(net),
                 dst=str(net) if inbound else "")
            for c in counted
            for net in c.nets
            if family_of(net) == family
        )
        out.append(SubChain(direction, CHAINS[direction], tag, rules, ordered=False))
    return tuple(out)


def tally_key(tag: str, family: str, key: str) -> str:
    """The name of a per-pod rule's tally in `agent.traffic.tally` (beside "internet-in/ipv4")."""
    return f"{tag}/{family}/{key}"


def is_pod_tally(name: str) -> bool:
    return name.split("/", 1)[0] in DIRECTION_OF_TAG
