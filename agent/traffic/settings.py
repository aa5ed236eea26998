"""The ``[checks.traffic]`` section."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from ..schema import CheckConfig, opt

MAX_RANGES = 256



def _network(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        return f'expected a network such as "10.0.0.0/8" or "fd00::/8", got "{value}" ({exc})'
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

    def validate(self) -> tuple[str, str] | None:
        if len(self.internal_ranges) > MAX_RANGES:
            return "internal_ranges", f"expected at most {MAX_RANGES} ranges, got {len(self.internal_ranges)}"
        seen = [str(ipaddress.ip_network(r)) for r in self.internal_ranges]
        dup = next((r for i, r in enumerate(seen) if r in seen[:i]), None)
        if dup:
            return "internal_ranges", f'expected each range once, got "{dup}" twice'
        return None
