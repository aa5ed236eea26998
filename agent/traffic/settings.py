"""The ``[checks.traffic]`` section."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from ..schema import CheckConfig, opt

MAX_RANGES = 256
MAX_STATIC = 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")  # a DNS label (dots allowed), as a pod name


def _network(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        return f'expected a network such as "10.0.0.0/8" or "fd00::/8", got "{value}" ({exc})'
    return None


@dataclass(frozen=True)
class PodsSection:
    enabled: bool = opt(
        True, "Count each pod's internet traffic (one rule per pod address and direction; only counts, never "
        "changes a packet's fate). Pods come from the cluster; without one, from `static`.",
    )
    static: Mapping[str, str] = opt(
        MappingProxyType({}), 'Without a cluster: named networks counted as pods, e.g. { "build-farm" = '
        '"192.168.50.0/24" } (exported with namespace "" and pod "build-farm"). Ignored where the agent has a cluster.',
    )

    def validate(self) -> tuple[str, str] | None:
        if len(self.static) > MAX_STATIC:
            return "static", f"expected at most {MAX_STATIC} entries, got {len(self.static)}"
        nets: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
        for name, cidr in self.static.items():
            if not _NAME.match(name):
                return f"static.{name}", f'expected a name of lowercase letters, digits, "-" and "." (at most 63), got "{name}"'
            if not isinstance(cidr, str) or (problem := _network(cidr)):
                return f"static.{name}", problem or f"expected a network string, got {cidr!r}"
            net = ipaddress.ip_network(cidr)
            clash = next((n for n, other in nets.items() if other.version == net.version and other.overlaps(net)), None)
            if clash:
                return f"static.{name}", f'expected networks that do not overlap, got "{cidr}" overlapping "{clash}"'
            nets[name] = net
        return None


@dataclass(frozen=True)
class TrafficConfig(CheckConfig):
    enabled: bool = opt(True, "Run this check: it installs iptables mangle rules of its own on the host (they never change a packet's fate).")
    interval: float = opt(
        15.0, "Time between reconciles: rules verified and repaired, counters read.", duration=True, min=1
    )
    backend: Literal["auto", "legacy", "nft"] = opt(
        "auto", "iptables backend: auto detects it as kube-proxy's iptables-wrapper does."
    )
    internal_ranges: tuple[str, ...] = opt(
        ("10.0.0.0/8",),
        "Cluster-internal networks (IPv4 and IPv6); traffic with anything else counts as internet. "
        "A family without a range gets no rules.",
        check=_network,
    )

    datapath_window: float = opt(
        300.0,
        "Window over which the bytes the uplinks carried are compared with the bytes the iptables hooks saw; "
        "more than half unseen is TrafficDatapathBypass.",
        duration=True,
        min=1,
    )
    datapath_min_bytes: int = opt(
        64 << 20, "Bytes the uplinks must carry in a window before it is judged; a quieter window keeps the last verdict.", min=1
    )
    cilium_socket: str = opt(
        "/run/cilium/cilium.sock",
        "Cilium agent API socket (host path), asked for its host routing mode where a cilium_host device exists.",
    )
    pods: PodsSection = field(default_factory=PodsSection, metadata={"doc": "Per-pod internet accounting."})

    def validate(self) -> tuple[str, str] | None:
        if len(self.internal_ranges) > MAX_RANGES:
            return "internal_ranges", f"expected at most {MAX_RANGES} ranges, got {len(self.internal_ranges)}"
        seen = [str(ipaddress.ip_network(r)) for r in self.internal_ranges]
        dup = next((r for i, r in enumerate(seen) if r in seen[:i]), None)
        if dup:
            return "internal_ranges", f'expected each range once, got "{dup}" twice'
        return None
