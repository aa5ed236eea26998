"""Traffic check: keeps the agent's mangle accounting rules in place and
exports what they count (internet-in, internet-out; per address family).

Each run, for each family with internal ranges: read ours from
``iptables-save -c`` (parsed natively), repair whatever is missing, altered or
out of order (counted and logged), and fold the count rules' counters into
monotonic totals kept in the state dir (`agent.traffic.tally`). The backend
(iptables-legacy or iptables-nft) is chosen once per configuration, as
kube-proxy's wrapper chooses it; on the first run, rules of ours found in the
other backend or in a family without internal ranges are removed.

Needs CAP_NET_ADMIN (and CAP_NET_RAW for legacy): without it, one
InsufficientPrivilege finding and the counters held where they were. In a dry
run (`agent run --dry-run`, `agent selftest`) nothing is changed or written.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Literal

from ..catalog import MetricSpec, Reason
from ..config import CheckConfig, opt
from ..findings import Observation, ObservationBuilder, Severity
from . import CheckContext, CheckSpec

log = logging.getLogger(__name__)

SUBJECT = "iptables"
MAX_RANGES = 256

REASONS: tuple[Reason, ...] = (
    Reason(
        "TrafficBackendUnavailable",
        Severity.WARNING,
        "The iptables backend in use cannot be driven from here (tools or python-iptables missing); "
        "traffic is not counted.",
        unknown=True,
    ),
    Reason(
        "TrafficRulesNotInPlace",
        Severity.WARNING,
        "The agent's traffic accounting rules are missing or altered and could not be put back; "
        "the traffic counters are held (in a dry run, at info: what would be fixed).",
        unknown=True,
    ),
)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "node_health_traffic_bytes_total",
        "counter",
        "Bytes (IP headers included) from (internet-in) or to (internet-out) addresses outside the internal ranges, "
        "received, sent or forwarded by this node; monotonic across rule re-creation and agent restarts.",
        ("direction", "family"),
    ),
    MetricSpec(
        "node_health_traffic_packets_total",
        "counter",
        "Packets from (internet-in) or to (internet-out) addresses outside the internal ranges, "
        "received, sent or forwarded by this node.",
        ("direction", "family"),
    ),
    MetricSpec(
        "node_health_traffic_rules_repaired_total",
        "counter",
        "Times the agent found its accounting rules missing, altered or duplicated and put them back.",
        ("family",),
    ),
    MetricSpec(
        "node_health_traffic_rules_in_place",
        "gauge",
        "1 when the agent's accounting rules were all present and in order after the last run.",
        ("family",),
    ),
    MetricSpec("node_health_traffic_backend_info", "gauge", "1 for the iptables backend in use.", ("backend",)),
)


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

    def validate(self) -> tuple[str, str] | None:
        if len(self.internal_ranges) > MAX_RANGES:
            return "internal_ranges", f"expected at most {MAX_RANGES} ranges, got {len(self.internal_ranges)}"
        seen = [str(ipaddress.ip_network(r)) for r in self.internal_ranges]
        dup = next((r for i, r in enumerate(seen) if r in seen[:i]), None)
        if dup:
            return "internal_ranges", f'expected each range once, got "{dup}" twice'
        return None


class TrafficCheck:
    """Thin shell so that importing this module (the catalog does) costs nothing."""

    name = "traffic"

    def __init__(self, ctx: CheckContext, cfg: TrafficConfig) -> None:
        from ..traffic.keeper import Keeper

        self._keeper = Keeper(ctx, cfg)

    def known_findings(self) -> list[tuple[str, str]]:
        return self._keeper.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name)
        self._keeper.run(b)
        return b.build()


SPEC = CheckSpec(
    name="traffic",
    summary="Internet vs cluster traffic: mangle accounting rules kept in place, their counters exported.",
    config=TrafficConfig,
    build=TrafficCheck,
)
